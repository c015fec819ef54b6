from typer.testing import CliRunner

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
    for command in ("serve", "quickstart", "fake-llm"):
        assert command in result.output
