"""The client-only install: ``pip install rollserve`` (no extras) into a fresh venv gives
the client, the contract, the datasets and the trainer integrations, none of the
server's packages, and a command line that says which extra to install."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
INSTALL_TIMEOUT_S = 900  # a build of the wheel and a few downloads; generous for a loaded host
COMMAND_TIMEOUT_S = 120

# Run inside the fresh venv: import the client side, every integrations module, and list
# what got installed.
PROBE = """
import importlib, importlib.metadata, json, pkgutil, sys
names = ["rollserve.client", "rollserve.client.run_dataset", "rollserve.contract", "rollserve.datasets"]
if sys.argv[1] == "1":
    import rollserve.integrations as pkg
    names += [pkg.__name__] + [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
refused = {}
for name in names:
    try:
        importlib.import_module(name)
    except ImportError as exc:
        refused[name] = str(exc)
dists = sorted({d.metadata["Name"] for d in importlib.metadata.distributions()})
print(json.dumps({"imported": names, "refused": refused, "dists": dists}))
"""
# Integrations for a trainer library an extra brings: without it, importing them is an
# ImportError that names the extra.
NEEDS_EXTRA = {"rollserve.integrations.verl": "verl"}


def _requirements() -> tuple[set[str], set[str]]:
    """(the base dependencies' names, every extra's requirement names) from pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    extras = {
        canonicalize_name(Requirement(r).name) for reqs in project["optional-dependencies"].values() for r in reqs
    }
    return base, extras - {"rollserve"}


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with ``pip install <a copy of the repo> -c constraints.txt``."""
    tmp = tmp_path_factory.mktemp("packaging")
    source = tmp / "rollserve"  # a copy: pip builds in the source tree (build/, egg-info)
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "constraints.txt"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    pip = [
        str(env_dir / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "-c",
        str(source / "constraints.txt"),
        str(source),
    ]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    assert done.returncode == 0, f"pip install failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return env_dir


def test_client_only_install_imports_the_client_and_the_integrations(client_venv: Path) -> None:
    has_integrations = (ROOT / "src" / "rollserve" / "integrations" / "__init__.py").is_file()
    done = subprocess.run(
        [str(client_venv / "bin" / "python"), "-c", PROBE, str(int(has_integrations))],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        cwd=client_venv,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    probe = json.loads(done.stdout)
    expected = {name for name in NEEDS_EXTRA if name in probe["imported"]}
    assert set(probe["refused"]) == expected, probe["refused"]
    for name, error in probe["refused"].items():
        assert f"pip install 'rollserve[{NEEDS_EXTRA[name]}]'" in error, error
    installed = {canonicalize_name(name) for name in probe["dists"]}
    base, extras = _requirements()
    assert "rollserve" in installed
    assert base <= installed
    # Nothing an extra asks for got in (transformers, fastapi, llama-cpp-python, ipython,
    # reasoning-gym, swebench, typer, ...), unless the client itself needs it.
    server_only = extras - base
    assert {
        "transformers",
        "fastapi",
        "uvicorn",
        "llama-cpp-python",
        "ipython",
        "reasoning-gym",
        "swebench",
        "tokenizers",
    } <= server_only
    assert not installed & server_only, f"server-only packages installed: {sorted(installed & server_only)}"
    # Few dependencies: pydantic's and httpx's own (about a dozen distributions in all).
    assert len(installed) <= 20, sorted(installed)


@pytest.mark.parametrize(
    "command", [["serve"], ["quickstart"], ["run", "rows.jsonl", "--server", "http://127.0.0.1:9"]]
)
def test_client_only_install_commands_name_the_server_extra(client_venv: Path, command: list[str]) -> None:
    done = subprocess.run(
        [str(client_venv / "bin" / "rollserve"), *command],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        cwd=client_venv,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "pip install 'rollserve[server]'" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_the_install_ships_the_bundled_harbor_tasks(client_venv: Path) -> None:
    """Every file of the bundled Harbor task folders is package data (and their scripts
    stay executable): ``rollserve/data/harbor`` installed is the source's, file for file."""
    source = ROOT / "src" / "rollserve" / "data" / "harbor"
    if not source.is_dir():
        pytest.skip("no bundled Harbor tasks in this checkout")
    where = subprocess.run(
        [
            str(client_venv / "bin" / "python"),
            "-c",
            "import pathlib, rollserve; print(pathlib.Path(rollserve.__file__).parent)",
        ],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        cwd=client_venv,
        check=True,
    )
    installed = Path(where.stdout.strip()) / "data" / "harbor"

    def files(root: Path) -> set[str]:
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}

    assert files(installed) == files(source)
    scripts = [*installed.glob("*/solution/solve.sh"), *installed.glob("*/tests/test.sh")]
    assert scripts and all(os.access(script, os.X_OK) for script in scripts)


def test_the_install_is_typed_and_says_its_version(client_venv: Path, tmp_path: Path) -> None:
    """``py.typed`` ships (PEP 561): a trainer's type checker, run on the trainer's venv,
    checks its calls into the client (here: mypy finds a wrong argument type, and no
    "missing library stubs or py.typed marker"); the wheel's version is the package's."""
    python = str(client_venv / "bin" / "python")
    where = subprocess.run(
        [
            python,
            "-c",
            "import importlib.metadata as m, pathlib, rollserve; "
            "print(pathlib.Path(rollserve.__file__).parent, m.version('rollserve'), "
            "rollserve.__version__)",
        ],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        cwd=client_venv,
        check=True,
    )
    package, metadata_version, version = where.stdout.split()
    assert (Path(package) / "py.typed").is_file()
    assert metadata_version == version
    script = tmp_path / "trainer.py"
    script.write_text("from rollserve.client import Client\n\nClient(timeout='soon')\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--python-executable",
            python,
            "--config-file",
            "",
            "--no-incremental",
            "--follow-imports",
            "silent",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'Argument "timeout" to "Client" has incompatible type "str"' in done.stdout, done.stdout
    assert "py.typed" not in done.stdout, done.stdout
