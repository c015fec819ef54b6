"""An evaluation report over rollout results (``rollserve run``, ``rollserve report``).

Per data_source: tasks and samples, pass@1 and pass@k (the unbiased estimator of Chen
et al., 2021), majority@n where the handler reports the answer it extracted, the mean
reward with a 95% confidence interval, and failures by kind. Pure Python over
``rollserve.contract``: a trainer can call ``evaluate`` on results it holds.

Definitions (docs/datasets.md repeats them):
- A sample is *scored* when it is not masked and has a reward; masked samples
  (infrastructure failures, timeouts) are counted, never scored.
- A scored sample *passes* when its reward is at least ``threshold`` (default 1.0).
- pass@k of a task with ``n`` scored samples of which ``c`` pass is
  ``1 - C(n-c, k) / C(n, k)``; a data_source's pass@k is its mean over the tasks with at
  least ``k`` scored samples (``tasks_at_k`` says how many).
- majority@n: the answer most of a task's scored samples gave (``evaluation.extracted``;
  a tie goes to the answer given first, in sample order) is right when a sample giving it
  passed; a task none of whose samples gave an answer counts as wrong. Only for
  data_sources whose results report ``extracted`` (math, stem).
- The mean reward's interval is Student's t over the tasks' mean rewards (samples of
  one task are not independent; tasks are), so it needs two tasks or more.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, Field

from rollserve.contract import RolloutResult

# Two-sided 95% quantiles of Student's t by degrees of freedom (1..30, then coarser);
# past the table the normal quantile is within 0.5% of t's.
_T95 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)
_T95_LARGE = ((40, 2.021), (60, 2.000), (120, 1.980))
_Z95 = 1.960


def t95(df: int) -> float:
    """The two-sided 95% quantile of Student's t with ``df`` degrees of freedom (a
    conservative step: the value of the largest tabulated df not above ``df``)."""
    if df < 1:
        raise ValueError(f"df must be at least 1, got {df}")
    if df <= len(_T95):
        return _T95[df - 1]
    value = _T95[-1]
    for at, quantile in _T95_LARGE:
        if df >= at:
            value = quantile
    return value if df < 1000 else _Z95


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` samples drawn without replacement from
    ``n`` (``c`` of them right) is right: ``1 - C(n-c, k) / C(n, k)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def default_ks(max_n: int) -> list[int]:
    """1, the powers of two below ``max_n``, and ``max_n``."""
    ks = [1]
    while ks[-1] * 2 < max_n:
        ks.append(ks[-1] * 2)
    if max_n > 1:
        ks.append(max_n)
    return ks


@dataclass(frozen=True)
class Graded:
    """What the report needs of one result (small: a run keeps one per rollout)."""

    data_source: str
    task_id: str
    sample_index: int
    status: str
    mask: bool
    mask_reason: str | None
    reward: float | None
    failure_kind: str | None
    answer: str | None  # evaluation.extracted, as text
    reports_answer: bool  # the evaluation has an ``extracted`` key (comparable answers)
    turns: int
    seconds: float
    components: dict[str, float] | None = None  # the result's reward_components

    @classmethod
    def of(cls, result: RolloutResult) -> Graded:
        evaluation = result.evaluation or {}
        extracted = evaluation.get("extracted")
        answer = None if extracted is None else str(extracted).strip() or None
        return cls(
            result.data_source,
            result.task_id,
            result.sample_index,
            result.status,
            result.mask,
            result.mask_reason,
            result.reward,
            result.failure.kind if result.failure else None,
            answer,
            "extracted" in evaluation,
            result.stats.turns,
            result.timing.total,
            None if result.reward_components is None else dict(result.reward_components),
        )

    @property
    def scored(self) -> bool:
        return not self.mask and self.reward is not None


class Interval(BaseModel):
    low: float
    high: float


class Distribution(BaseModel):
    """Values for the report's plots and summaries."""

    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    values: list[float] = Field(default_factory=list, description="every value, for plots")


class SourceReport(BaseModel):
    data_source: str
    tasks: int = Field(description="tasks (a task's n samples share its task_id)")
    samples: int = Field(description="results, masked ones included")
    scored: int = Field(description="samples not masked and with a reward")
    masked: int
    passed: int = Field(description="scored samples with reward >= threshold")
    pass_at_k: dict[int, float] = Field(description="k -> mean pass@k over tasks_at_k[k] tasks")
    tasks_at_k: dict[int, int] = Field(description="k -> tasks with at least k scored samples")
    majority: float | None = Field(
        None,
        description="majority@n over the tasks with a scored sample; null when the "
        "data_source reports no extracted answers",
    )
    mean_reward: float | None = Field(description="over scored samples")
    mean_reward_ci95: Interval | None = Field(
        description="Student's t over the tasks' mean rewards (two tasks or more)"
    )
    statuses: dict[str, int] = Field(description="results by status")
    failures: dict[str, int] = Field(description="failed results by failure kind (infra, agent, timeout)")
    mask_reasons: dict[str, int]
    turns: Distribution
    seconds: Distribution = Field(description="each rollout's total seconds")
    rewards: list[float] = Field(description="every scored reward, for plots")
    components: dict[str, Distribution] = Field(
        default_factory=dict,
        description="each reward component (reward_components) over the scored samples that carry it",
    )


class EvaluationReport(BaseModel):
    threshold: float = Field(description="a scored sample passes at reward >= threshold")
    ks: list[int]
    sources: list[SourceReport]


def _distribution(values: Sequence[float]) -> Distribution:
    if not values:
        return Distribution()
    ordered = sorted(values)
    return Distribution(
        mean=statistics.fmean(ordered),
        p50=statistics.median(ordered),
        p90=ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)],
        values=list(values),
    )


def _majority(samples: Sequence[Graded], threshold: float) -> bool:
    answers = [s.answer for s in sorted(samples, key=lambda s: s.sample_index) if s.answer is not None]
    if not answers:
        return False
    counts = Counter(answers)
    top = max(counts.values())
    chosen = next(a for a in answers if counts[a] == top)  # first given among the tied
    return any(s.answer == chosen and s.reward is not None and s.reward >= threshold for s in samples)


def _interval(task_means: Sequence[float]) -> Interval | None:
    if len(task_means) < 2:
        return None
    mean = statistics.fmean(task_means)
    half = t95(len(task_means) - 1) * statistics.stdev(task_means) / math.sqrt(len(task_means))
    return Interval(low=mean - half, high=mean + half)


def _source(name: str, graded: Sequence[Graded], ks: Sequence[int], threshold: float) -> SourceReport:
    tasks: dict[str, list[Graded]] = defaultdict(list)
    for g in graded:
        tasks[g.task_id].append(g)
    scored_by_task = {tid: [g for g in gs if g.scored] for tid, gs in tasks.items()}
    pass_k: dict[int, float] = {}
    tasks_k: dict[int, int] = {}
    for k in ks:
        values = [
            pass_at_k(len(s), sum(g.reward is not None and g.reward >= threshold for g in s), k)
            for s in scored_by_task.values()
            if len(s) >= k
        ]
        tasks_k[k] = len(values)
        if values:
            pass_k[k] = statistics.fmean(values)
    majority = None
    if any(g.reports_answer for g in graded):
        decided = [_majority(s, threshold) for s in scored_by_task.values() if s]
        majority = statistics.fmean(decided) if decided else None
    rewards = [g.reward for g in graded if g.scored and g.reward is not None]
    task_means = [statistics.fmean(g.reward for g in s if g.reward is not None) for s in scored_by_task.values() if s]
    return SourceReport(
        data_source=name,
        tasks=len(tasks),
        samples=len(graded),
        scored=len(rewards),
        masked=sum(g.mask for g in graded),
        passed=sum(r >= threshold for r in rewards),
        pass_at_k=pass_k,
        tasks_at_k=tasks_k,
        majority=majority,
        mean_reward=statistics.fmean(rewards) if rewards else None,
        mean_reward_ci95=_interval(task_means),
        statuses=dict(sorted(Counter(g.status for g in graded).items())),
        failures=dict(sorted(Counter(g.failure_kind for g in graded if g.failure_kind is not None).items())),
        mask_reasons=dict(sorted(Counter(g.mask_reason or "unspecified" for g in graded if g.mask).items())),
        turns=_distribution([float(g.turns) for g in graded]),
        seconds=_distribution([g.seconds for g in graded]),
        rewards=rewards,
        components=_components(graded),
    )


def _components(graded: Sequence[Graded]) -> dict[str, Distribution]:
    """Each named component over the scored samples that carry it."""
    values: dict[str, list[float]] = defaultdict(list)
    for g in graded:
        if g.scored and g.components:
            for name, value in g.components.items():
                values[name].append(float(value))
    return {name: _distribution(found) for name, found in sorted(values.items())}


def evaluate(
    results: Iterable[RolloutResult | Graded], ks: Sequence[int] | None = None, threshold: float = 1.0
) -> EvaluationReport:
    """The report over ``results`` (a sample seen twice, same task_id and sample_index,
    counts once). ``ks``: the k of pass@k (default: 1, powers of two, the largest n)."""
    seen: dict[tuple[str, int], Graded] = {}
    for item in results:
        graded = item if isinstance(item, Graded) else Graded.of(item)
        seen.setdefault((graded.task_id, graded.sample_index), graded)
    by_source: dict[str, list[Graded]] = defaultdict(list)
    for graded in seen.values():
        by_source[graded.data_source].append(graded)
    if ks is None:
        per_task = Counter((g.data_source, g.task_id) for g in seen.values() if g.scored)
        ks = default_ks(max(per_task.values(), default=1))
    if any(k < 1 for k in ks):
        raise ValueError(f"every k must be at least 1, got {list(ks)}")
    ks = sorted(set(ks))
    return EvaluationReport(
        threshold=threshold,
        ks=list(ks),
        sources=[_source(name, graded, ks, threshold) for name, graded in sorted(by_source.items())],
    )
