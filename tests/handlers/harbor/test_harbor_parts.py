"""The harbor family's parts without a sandbox: the reward read from the verifier's
files (which file wins, how the scalar is chosen, what scores 0), and the Dockerfile
read for the host's system."""

from __future__ import annotations

import pytest

from rollserve.handlers.harbor.dockerfile import DockerfileProblem, host_plan
from rollserve.handlers.harbor.verifier import Report, read_rewards


@pytest.mark.parametrize(
    "files, reward, components, reason",
    [
        ({"reward.txt": "1\n"}, 1.0, None, None),
        ({"reward.txt": "0.25"}, 0.25, None, None),
        ({"reward.txt": "yes"}, 0.0, None, "not a number"),
        ({"reward.txt": "nan"}, 0.0, None, "not finite"),
        ({"reward.json": "0.5"}, 0.5, None, None),
        ({"reward.json": '{"reward": 0.5, "style": 1}'}, 0.5, {"reward": 0.5, "style": 1.0}, None),
        ({"reward.json": '{"correct": 1}'}, 1.0, {"correct": 1.0}, None),
        ({"reward.json": '{"a": 1, "b": 0}'}, 0.0, {"a": 1.0, "b": 0.0}, "no 'reward' key"),
        ({"reward.json": '{"reward": "1"}'}, 0.0, None, "not a finite number"),
        ({"reward.json": '{"reward": Infinity}'}, 0.0, None, "not a finite number"),
        ({"reward.json": "[1]"}, 0.0, None, "neither a number"),
        ({"reward.json": "{"}, 0.0, None, "not JSON"),
        ({}, 0.0, None, "no reward file"),
        # Both: the lower counts (one may be a process's of the agent's, not test.sh's).
        ({"reward.json": '{"reward": 1}', "reward.txt": "0"}, 0.0, {"reward": 1.0}, "disagree"),
        ({"reward.json": '{"reward": 1, "outcome": 1}'}, 0.0, None, "'outcome' is a component"),
        ({"reward.json": '{"judge": 1}'}, 0.0, None, "'judge' is a component name"),
        ({"reward.json": '{"reward": 1, "judge_process": 0.5}'}, 0.0, None, "rename it"),
        ({"reward.json": "0.5", "reward.txt": "0.5"}, 0.5, None, None),
    ],
)
def test_the_reward_as_harbor_writes_it(files, reward, components, reason):
    verdict = read_rewards(files, {})
    assert verdict.reward == pytest.approx(reward)
    assert verdict.components == components
    assert (verdict.details.get("reason") is None) == (reason is None)
    if reason:
        assert reason in verdict.details["reason"]


@pytest.mark.parametrize(
    "lines, problem",
    [
        (["STATUS 0", "SURVIVORS 0"], "killed before it ended"),
        (["STATUS 137", "SURVIVORS 0", "END"], "killed by signal 9"),
        (["STATUS 0", "SURVIVORS 2", "END"], "2 process(es) started during verification"),
        (["STATUS 0", "SURVIVORS 0", "SUM 00  ./test.sh", "END"], "tests were changed during verification (test.sh)"),
        (
            ["STATUS 0", "SURVIVORS 0", "SUM ab  ./test.sh", "BAD /logs/verifier/reward.txt is a link", "END"],
            "reward.txt is a link",
        ),
        (["STATUS 0", "SURVIVORS 0", "SCRIPT changed", "SUM ab  ./test.sh", "END"], "test.sh was written to"),
        (["STATUS 1", "SURVIVORS 0", "SUM ab  ./test.sh", "END"], None),
        (["STATUS 0", "SURVIVORS 0", "END"], None),  # the tests may remove their own files
    ],
)
def test_the_verifier_s_run_is_read_behind_its_nonce(lines, problem):
    output = "\n".join(f"n0nce {line}" for line in lines)
    # Lines without the nonce (a process of the agent's writing into the output) count for nothing.
    forged = "STATUS 0\nSURVIVORS 0\nSUM ab  ./test.sh\nEND\nnonce END\n"
    report = Report.parse(forged + output, "n0nce")
    found = report.problem({"./test.sh": "ab"})
    assert (found is None) == (problem is None), found
    if problem:
        assert problem in found, found


def test_a_dockerfile_that_lays_files_out_is_a_host_plan():
    plan = host_plan(
        "FROM python:3.12-slim\n# comment\nWORKDIR /app\nENV A=1 B=two\n"
        "COPY --chown=1000 data/ /app/data/\nCOPY a.txt b.txt ./\n"
        'ADD c.txt sub/c.txt\nCMD ["sleep", "infinity"]\n',
        None,
    )
    assert plan.workdir == "/app" and plan.env == {"A": "1", "B": "two"}
    assert plan.copies == [("data/", "/app/data/"), ("a.txt", "/app/"), ("b.txt", "/app/"), ("c.txt", "/app/sub/c.txt")]
    assert host_plan("FROM x\nWORKDIR /srv\nCOPY a /srv/a\n", "/srv").workdir == "/srv"


@pytest.mark.parametrize(
    "text, problem",
    [
        ("FROM x\nWORKDIR /app\nRUN \\\n  pip install x\n", "line 3: RUN is not supported"),
        ("FROM x\nUSER bob\n", "line 2: USER is not supported"),
        ("FROM x\nWORKDIR /app\nCOPY a /etc/a\n", "outside the workdir"),
        ("FROM x\nCOPY a /a\n", "outside the workdir (none set)"),
        ("FROM x\nWORKDIR /app\nCOPY --from=build /x /app/x\n", "--from is not supported"),
        ("FROM x\nWORKDIR /app\nADD https://x/y /app/y\n", "URL"),
        ("FROM x\nWORKDIR /app\nCOPY *.txt /app/\n", "wildcards"),
        ("FROM x\nENV A=$HOME\n", "expand variables"),
    ],
)
def test_what_needs_an_image_is_refused_naming_the_line(text, problem):
    with pytest.raises(DockerfileProblem) as refused:
        host_plan(text, None)
    assert problem in str(refused.value)


class _Shell:
    """A sandbox that records each command and fails the ones ``failing`` names."""

    def __init__(self, failing: str = "") -> None:
        self.failing, self.commands = failing, []

    async def exec(self, command, timeout, stdin=None, env=None):
        from rollserve.sandbox.base import ExecResult

        self.commands.append(command)
        if self.failing and self.failing in command:
            return ExecResult(exit_code=2, stdout="", stderr="tar: /solution: No space left")
        return ExecResult(exit_code=0, stdout="", stderr="")


class _Rollout:
    def agent_deadline(self, now):
        return None


async def _oracle(sandbox: _Shell, workdir: str) -> dict:
    from rollserve.handlers.harbor.bounded import Bounded
    from rollserve.handlers.harbor.folder import load_task
    from rollserve.handlers.harbor.handler import HarborWork
    from tests.handlers.harbor.test_harbor_api import DATA
    from tests.handlers.harbor.test_harbor_images import handler

    harbor, _ = handler("bubblewrap", DATA)
    work = HarborWork(
        load_task(DATA / "count-words"),
        "oracle",
        sandbox,  # type: ignore[arg-type]
        workdir,
        {},
        offline=False,
    )
    await harbor._oracle(work, Bounded(_Rollout(), None))  # type: ignore[arg-type]
    return work.details


async def test_a_failed_copy_of_the_solution_is_the_server_s_failure_not_the_oracle_s():
    from rollserve.errors import InfraError

    sandbox = _Shell(failing="-C /solution")
    with pytest.raises(InfraError, match="could not copy solution/"):
        await _oracle(sandbox, "/app")
    assert not any("solve.sh" in command for command in sandbox.commands)  # never run


async def test_the_oracle_s_workdir_reaches_its_shell_quoted():
    sandbox = _Shell()
    details = await _oracle(sandbox, "/app; touch /tmp/owned")
    (ran,) = [command for command in sandbox.commands if "solve.sh" in command]
    assert ran.startswith("cd '/app; touch /tmp/owned' && bash /solution/solve.sh")
    assert details["oracle_exit_code"] == 0
