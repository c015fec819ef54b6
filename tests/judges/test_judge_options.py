"""``rollserve serve --judge`` and ``--rubric``: a bad value is exit 2 naming the option,
before anything starts; the judge spec forms parse as documented."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rollserve.commands.app import app
from rollserve.llm.judges import parse_judge_spec


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--judge", "nonameurl"], "--judge"),
        (["--judge", "a=ftp://x"], "--judge"),
        (["--judge", '{"name": "a", "backend": "http://h:1", "timeout": -1}'], "--judge"),
        (["--judge", "a=http://h:1", "--judge", "a=http://h:2"], "--judge"),
        (["--rubric", "r"], "--rubric"),
        (["--rubric", 'r={"high": 0}'], "--rubric"),
    ],
)
def test_bad_judge_options_exit_2_naming_the_option(args, option):
    result = CliRunner().invoke(app, ["serve", *args])
    assert result.exit_code == 2, result.output
    assert option in result.output


def test_judge_spec_forms():
    url = parse_judge_spec("g=http://host:8000/v1")
    assert (url.name, url.backend) == ("g", "openai_chat=http://host:8000/v1")
    assert parse_judge_spec("g=embedded").backend == "embedded"
    assert parse_judge_spec("g=vllm=http://h:1").backend == "vllm=http://h:1"
    full = parse_judge_spec('{"name": "g", "backend": "http://h:1", "concurrency": 2}')
    assert full.concurrency == 2 and full.backend == "openai_chat=http://h:1"
    with pytest.raises(ValueError, match="judge.concurrency"):
        parse_judge_spec('{"name": "g", "backend": "http://h:1", "concurrency": 0}')


def test_rescore_command_needs_ids_and_says_when_the_server_is_away(tmp_path):
    result = CliRunner().invoke(app, ["rescore", "--server", "http://127.0.0.1:9"])
    assert result.exit_code == 2 and "--id" in result.output
    bad = tmp_path / "r.jsonl"
    bad.write_text("not a result\n")
    result = CliRunner().invoke(app, ["rescore", "--results", str(bad)])
    assert result.exit_code == 2 and "--results" in result.output
    result = CliRunner().invoke(
        app, ["rescore", "--id", "a,b", "--rubric", "x", "--server", "http://127.0.0.1:9", "--timeout", "5"]
    )
    assert result.exit_code == 1 and "127.0.0.1:9" in result.output


def test_a_default_judge_needs_a_judge_and_a_known_rubric():
    result = CliRunner().invoke(app, ["serve", "--default-judge", "default"])
    assert result.exit_code == 2 and "--default-judge" in result.output
    result = CliRunner().invoke(app, ["serve", "--judge", "a=http://h:1", "--default-judge", "x"])
    assert result.exit_code == 2 and "--default-judge" in result.output


def test_rescore_names_the_option_a_refused_request_comes_from():
    many = ",".join(f"r{i}" for i in range(1001))  # over the request's 1,000 ids
    result = CliRunner().invoke(app, ["rescore", "--id", many, "--server", "http://127.0.0.1:9"])
    assert result.exit_code == 2 and "--results" in result.output and "--idempotency-key" not in result.output
    result = CliRunner().invoke(app, ["rescore", "--id", "a", "--idempotency-key", "bad key!", "--server", "x"])
    assert result.exit_code == 2 and "--idempotency-key" in result.output
