"""The evaluation report: pass@k against hand-computed cases, majority@n, the interval,
masked samples, and the `rollserve report` command with its JSON and HTML."""

import json
import math
from html.parser import HTMLParser

import pytest
from typer.testing import CliRunner

from rollserve.client.evaluation import Graded, default_ks, evaluate, pass_at_k, t95
from rollserve.engine.rollout import Rollout, RolloutSpec


def graded(
    task: str,
    index: int,
    reward: float | None,
    *,
    source: str = "math",
    answer: str | None = None,
    mask: bool = False,
    status: str = "completed",
    failure: str | None = None,
    reports_answer: bool = True,
) -> Graded:
    return Graded(
        source, task, index, status, mask, "infra" if mask else None, reward, failure, answer, reports_answer, 2, 1.5
    )


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
        (4, 1, 1, 1 / 4),  # pass@1 = c / n
        (4, 1, 2, 1 - (3 * 2) / (4 * 3)),  # 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
        (4, 2, 2, 1 - 1 / 6),  # 1 - C(2,2)/C(4,2)
        (5, 2, 3, 1 - 1 / 10),  # 1 - C(3,3)/C(5,3)
        (10, 3, 5, 1 - math.comb(7, 5) / math.comb(10, 5)),
        (8, 0, 8, 0.0),
        (8, 1, 8, 1.0),
    ],
)
def test_pass_at_k_is_the_unbiased_estimator(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_refuses_impossible_counts():
    for n, c, k in [(4, 5, 1), (4, 1, 5), (4, 1, 0), (4, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_default_ks_and_t_quantiles():
    assert default_ks(1) == [1]
    assert default_ks(4) == [1, 2, 4]
    assert default_ks(6) == [1, 2, 4, 6]
    assert t95(1) == pytest.approx(12.706)
    assert t95(30) == pytest.approx(2.042)
    assert t95(45) == pytest.approx(2.021)
    assert t95(10_000) == pytest.approx(1.960)


def test_report_per_data_source_by_hand():
    rows = [
        # task a: 2 of 4 right, answers 7, 7, 3, None -> majority "7", right
        graded("a", 0, 1.0, answer="7"),
        graded("a", 1, 1.0, answer="7"),
        graded("a", 2, 0.0, answer="3"),
        graded("a", 3, 0.0),
        # task b: 0 of 3 scored right, one masked (not scored); majority "5" (first of a tie)
        graded("b", 0, 0.0, answer="5"),
        graded("b", 1, 0.0, answer="6"),
        graded("b", 2, None, mask=True, status="failed", failure="infra"),
        graded("b", 3, 0.0),
        # another data_source, no comparable answers
        graded("c", 0, 0.5, source="code", reports_answer=False),
        graded("c", 1, 1.0, source="code", reports_answer=False),
        graded("c", 1, 0.0, source="code", reports_answer=False),  # a duplicate: ignored
    ]
    report = evaluate(rows, ks=[1, 2, 4])
    math_, code = report.sources[1], report.sources[0]
    assert (code.data_source, math_.data_source) == ("code", "math")
    assert (math_.tasks, math_.samples, math_.scored, math_.masked, math_.passed) == (2, 8, 7, 1, 2)
    # pass@1: mean(2/4, 0/3); pass@2: mean(1 - C(2,2)/C(4,2), 0); pass@4: task a only.
    assert math_.pass_at_k[1] == pytest.approx((0.5 + 0.0) / 2)
    assert math_.pass_at_k[2] == pytest.approx((1 - 1 / 6) / 2)
    assert math_.pass_at_k[4] == pytest.approx(1.0)
    assert math_.tasks_at_k == {1: 2, 2: 2, 4: 1}
    assert math_.majority == pytest.approx(0.5)
    assert math_.mean_reward == pytest.approx(2 / 7)
    # t over the two tasks' means (0.5, 0.0): mean 0.25, s = 0.3536, half = 12.706*s/sqrt(2)
    half = 12.706 * math.sqrt(0.125) / math.sqrt(2)
    assert math_.mean_reward_ci95 is not None
    assert math_.mean_reward_ci95.low == pytest.approx(0.25 - half)
    assert math_.mean_reward_ci95.high == pytest.approx(0.25 + half)
    assert math_.failures == {"infra": 1} and math_.mask_reasons == {"infra": 1}
    assert math_.statuses == {"completed": 7, "failed": 1}
    assert code.samples == 2 and code.majority is None
    assert code.pass_at_k == {1: pytest.approx(0.5), 2: pytest.approx(1.0)}  # 0.5 fails, 1.0 passes
    assert code.mean_reward_ci95 is None  # one task: no interval


def test_threshold_decides_what_passes():
    rows = [graded("a", 0, 0.5, reports_answer=False), graded("a", 1, 0.9, reports_answer=False)]
    assert evaluate(rows, ks=[1]).sources[0].pass_at_k[1] == 0.0
    assert evaluate(rows, ks=[1], threshold=0.5).sources[0].pass_at_k[1] == 1.0


def _result(task: str, index: int, reward: float | None, status: str = "completed", evaluation: dict | None = None):
    spec = RolloutSpec(
        id=f"{task}-{index}", group_id=task, task_id=task, data_source="math", sample_index=index, instance={}
    )
    return Rollout(spec=spec, status=status, reward=reward, evaluation=evaluation).result()


class _Svg(HTMLParser):
    def __init__(self):
        super().__init__()
        self.svgs = 0
        self.scripts = 0

    def handle_starttag(self, tag, attrs):
        self.svgs += tag == "svg"
        self.scripts += tag in ("script", "link", "img")


def test_report_command_writes_json_and_offline_html(tmp_path):
    from rollserve.cli import app

    results = tmp_path / "out.jsonl"
    lines = [
        _result("t1", i, r, evaluation={"extracted": a})
        for i, (r, a) in enumerate([(1.0, "4"), (0.0, "5"), (1.0, "4")])
    ]
    lines += [
        _result("t2", 0, 0.0, evaluation={"extracted": None}),
        _result("t2", 1, 1.0, evaluation={"extracted": "9"}),
    ]
    results.write_text("".join(r.model_dump_json() + "\n" for r in lines) + "not json\n")
    out = CliRunner().invoke(
        app,
        ["report", str(results), "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html"), "--k", "1,2"],
    )
    assert out.exit_code == 0, out.output
    assert "pass@2" in out.output and "1 lines of" in out.output
    report = json.loads((tmp_path / "r.json").read_text())
    (math_,) = report["sources"]
    assert math_["pass_at_k"]["1"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert math_["majority"] == pytest.approx(1.0)  # "4" right; t2: "9" right
    page = (tmp_path / "r.html").read_text()
    parser = _Svg()
    parser.feed(page)
    assert parser.svgs == 3 and parser.scripts == 0  # three plots, nothing fetched

    empty = tmp_path / "empty.jsonl"
    empty.write_text("{}\n")
    out = CliRunner().invoke(app, ["report", str(empty)])
    assert out.exit_code == 2 and "no rollserve results" in out.output
    out = CliRunner().invoke(app, ["report", str(results), "--k", "0"])
    assert out.exit_code == 2 and "--k" in out.output


def test_report_shows_reward_components(tmp_path):
    from rollserve.cli import app

    results = tmp_path / "out.jsonl"
    lines = []
    for i, (reward, fmt) in enumerate([(1.0, 1.0), (0.0, 1.0), (0.0, 0.0)]):
        r = _result("t1", i, reward)
        lines.append(r.model_copy(update={"reward_components": {"correctness": reward, "format": fmt}}))
    lines.append(_result("t2", 0, None, status="failed"))  # masked: not counted
    results.write_text("".join(r.model_dump_json() + "\n" for r in lines))
    out = CliRunner(env={"COLUMNS": "200"}).invoke(
        app, ["report", str(results), "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html")]
    )
    assert out.exit_code == 0, out.output
    assert "reward components" in out.output and "format" in out.output
    (math_,) = json.loads((tmp_path / "r.json").read_text())["sources"]
    assert math_["components"]["format"]["mean"] == pytest.approx(2 / 3)
    assert math_["components"]["correctness"]["values"] == [1.0, 0.0, 0.0]
    assert "reward component" in (tmp_path / "r.html").read_text()
