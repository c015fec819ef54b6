import sys

import pytest
from typer.testing import CliRunner

from rollserve import cli
from rollserve.cli import app

runner = CliRunner()


def test_serve_names_a_bad_backend_flag():
    result = runner.invoke(app, ["serve", "--backend", "foo"])
    assert result.exit_code == 2
    assert "--backend" in result.output and "embedded" in result.output


def test_serve_names_a_bad_restart_policy():
    result = runner.invoke(app, ["serve", "--on-restart", "sometimes"])
    assert result.exit_code == 2 and "--on-restart" in result.output


def test_help_lists_the_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("serve", "quickstart", "fake-llm", "datasets", "images", "run"):
        assert command in result.output


def test_serve_names_a_bad_routing_policy():
    result = runner.invoke(app, ["serve", "--routing", "random"])
    assert result.exit_code == 2 and "--routing" in result.output and "least_load" in result.output


def test_serve_names_a_bad_sandbox_runtime():
    result = runner.invoke(app, ["serve", "--sandbox-runtime", "chroot"])
    assert result.exit_code == 2 and "--sandbox-runtime" in result.output
    assert "bubblewrap" in result.output


def test_serve_names_bad_sandbox_options():
    result = runner.invoke(app, ["serve", "--sandbox-options", '{"readonly_path": ["/opt"]}'])
    assert result.exit_code == 2 and "--sandbox-options" in result.output
    assert "readonly_path" in result.output
    result = runner.invoke(app, ["serve", "--sandbox-options", "[1]"])
    assert result.exit_code == 2 and "JSON object" in result.output


def test_serve_refuses_bad_handler_options_naming_them(tmp_path):
    result = runner.invoke(
        app, ["serve", "--state-dir", str(tmp_path), "--handler-options", '{"swe": {"mirors": ["/x"]}}']
    )
    assert result.exit_code == 2 and "mirors" in result.output and "mirrors" in result.output
    result = runner.invoke(app, ["serve", "--state-dir", str(tmp_path), "--handler-options", "[1]"])
    assert result.exit_code == 2 and "--handler-options" in result.output


def test_serve_names_a_bad_tokenizer_even_with_brackets_in_its_path(tmp_path):
    # The path is printed as text, not read as console markup (which "[/x]" would break).
    result = runner.invoke(app, ["serve", "--state-dir", str(tmp_path), "--tokenizer", "/no/such[/x]"])
    assert result.exit_code == 2, result.output
    assert "/no/such[/x]" in result.output and "tokenizer" in result.output


def test_without_the_server_packages_a_command_names_the_extra(monkeypatch, capsys):
    # What a client-only install sees (tests/test_packaging.py runs the real one): the
    # commands' module fails on a server package; main() says which extra to install.
    monkeypatch.delitem(sys.modules, "rollserve.commands.app")
    monkeypatch.setitem(sys.modules, "typer", None)  # import typer -> ModuleNotFoundError
    monkeypatch.setattr(sys, "argv", ["rollserve", "serve"])
    with pytest.raises(SystemExit) as stopped:
        cli.main()
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "pip install 'rollserve[server]'" in err and "'typer' is not installed" in err


def test_a_missing_module_of_rollserve_itself_is_not_blamed_on_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "rollserve.commands.app", None)
    with pytest.raises(ModuleNotFoundError):
        cli.load_app()


def test_serve_names_a_bad_rollout_slice():
    result = runner.invoke(app, ["serve", "--rollout-slice-ms", "-1"])
    assert result.exit_code == 2 and "--rollout-slice-ms" in result.output
    result = runner.invoke(app, ["serve", "--rollout-slice-ms", "0.01"])
    assert result.exit_code == 2 and "--rollout-slice-ms" in result.output and "at least 0.1" in result.output
