"""The harbor family's parts without a sandbox: the reward read from the verifier's
files (which file wins, how the scalar is chosen, what scores 0), and the Dockerfile
read for the host's system."""

from __future__ import annotations

import pytest

from rollserve.handlers.harbor.dockerfile import DockerfileProblem, host_plan
from rollserve.handlers.harbor.verifier import parse_reward


@pytest.mark.parametrize("output, reward, components, reason", [
    ("== reward.txt\n1\n", 1.0, None, None),
    ("== reward.txt\n0.25", 0.25, None, None),
    ("== reward.txt\nyes", 0.0, None, "not a number"),
    ("== reward.txt\nnan", 0.0, None, "not finite"),
    ("== reward.json\n0.5", 0.5, None, None),
    ("== reward.json\n{\"reward\": 0.5, \"style\": 1}", 0.5, {"reward": 0.5, "style": 1.0}, None),
    ("== reward.json\n{\"correct\": 1}", 1.0, {"correct": 1.0}, None),
    ("== reward.json\n{\"a\": 1, \"b\": 0}", 0.0, {"a": 1.0, "b": 0.0}, "no 'reward' key"),
    ("== reward.json\n{\"reward\": \"1\"}", 0.0, None, "not a finite number"),
    ("== reward.json\n{\"reward\": Infinity}", 0.0, None, "not a finite number"),
    ("== reward.json\n[1]", 0.0, None, "neither a number"),
    ("== reward.json\n{", 0.0, None, "not JSON"),
    ("== none\n", 0.0, None, "no reward file"),
])
def test_the_reward_as_harbor_writes_it(output, reward, components, reason):
    verdict = parse_reward(output, {})
    assert verdict.reward == pytest.approx(reward)
    assert verdict.components == components
    assert (verdict.details.get("reason") is None) == (reason is None)
    if reason:
        assert reason in verdict.details["reason"]


def test_a_dockerfile_that_lays_files_out_is_a_host_plan():
    plan = host_plan("FROM python:3.12-slim\n# comment\nWORKDIR /app\nENV A=1 B=two\n"
                     "COPY --chown=1000 data/ /app/data/\nCOPY a.txt b.txt ./\n"
                     "ADD c.txt sub/c.txt\nCMD [\"sleep\", \"infinity\"]\n", None)
    assert plan.workdir == "/app" and plan.env == {"A": "1", "B": "two"}
    assert plan.copies == [("data/", "/app/data/"), ("a.txt", "/app/"), ("b.txt", "/app/"),
                           ("c.txt", "/app/sub/c.txt")]
    assert host_plan("FROM x\nWORKDIR /srv\nCOPY a /srv/a\n", "/srv").workdir == "/srv"


@pytest.mark.parametrize("text, problem", [
    ("FROM x\nWORKDIR /app\nRUN \\\n  pip install x\n", "line 3: RUN is not supported"),
    ("FROM x\nUSER bob\n", "line 2: USER is not supported"),
    ("FROM x\nWORKDIR /app\nCOPY a /etc/a\n", "outside the workdir"),
    ("FROM x\nCOPY a /a\n", "outside the workdir (none set)"),
    ("FROM x\nWORKDIR /app\nCOPY --from=build /x /app/x\n", "--from is not supported"),
    ("FROM x\nWORKDIR /app\nADD https://x/y /app/y\n", "URL"),
    ("FROM x\nWORKDIR /app\nCOPY *.txt /app/\n", "wildcards"),
    ("FROM x\nENV A=$HOME\n", "expand variables"),
])
def test_what_needs_an_image_is_refused_naming_the_line(text, problem):
    with pytest.raises(DockerfileProblem) as refused:
        host_plan(text, None)
    assert problem in str(refused.value)
