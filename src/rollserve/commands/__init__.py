"""The CLI's commands: ``app.py`` is the typer app (``serve``, ``quickstart``,
``fake-llm``) and registers the dataset commands (``rollserve datasets | images |
run``). Each of those modules is the typer wiring and the rich output of one command
group; the work is done in ``rollserve.datasets``, ``sandbox.images``,
``client.run_dataset`` and here:

- ``quickstart``: ``rollserve quickstart`` (the service in this process on the embedded
  defaults, a bundled batch through the real API); ``quickstart_summary``: its table.
- ``dataset_check``: checking dataset rows offline as the API checks a submission,
  with the server's handlers built on an offline ``HandlerContext`` (a command's
  composition of the layers, so it lives with the commands, not in the engine).

Like ``rollserve.server`` (the composition root the commands start), these modules
build the layers. ``rollserve.cli`` loads ``app.py`` only when a command runs, so a
client-only install gets a clear error, not a traceback."""
