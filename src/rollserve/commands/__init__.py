"""The CLI's commands: ``app.py`` is the typer app (``serve``, ``quickstart``,
``fake-llm``) and registers the dataset commands (``rollserve datasets | images |
run``). Each of those modules is the typer wiring and the rich output of one command
group; the work is done in ``rollserve.datasets``, ``engine.dataset_check``,
``sandbox.images`` and ``client.run_dataset``. ``rollserve.cli`` loads ``app.py`` only
when a command runs, so a client-only install gets a clear error, not a traceback."""
