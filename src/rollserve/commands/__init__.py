"""The dataset commands of the CLI (``rollserve datasets | images | run``); ``cli.py``
registers them. Each module is the typer wiring and the rich output of one command
group; the work is done in ``rollserve.datasets``, ``engine.dataset_check``,
``sandbox.images`` and ``client.run_dataset``."""
