"""A compiled assert (``code.asserts``): its probes, how its verdict follows from their
reported values, and whether that verdict can be reached outside the solution's
process (``Check.unsafe``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rollserve.handlers.code.names import ProbeInfo
from rollserve.handlers.code.values import Probe, describe, immutable

Node = Callable[[Sequence[Probe]], Any]


class CheckFailed(Exception):
    """The check cannot pass: ``status`` (error | memory | not_plain | output_limit) and why."""

    def __init__(self, status: str, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


@dataclass
class Check:
    """One assert: what the sandbox evaluates (``probes``) and how the verdict follows."""

    source: str
    probes: list[str]  # expressions, in the order Python would evaluate them
    info: list[ProbeInfo]  # one per probe
    pairs: list[tuple[frozenset[int], frozenset[int]]]  # the probes of compared operands
    evaluate: Node
    message: str | None = None  # the assert's message, when it is a literal

    @property
    def references(self) -> list[int]:
        """The probes to try in the process without the solution."""
        return [i for i, info in enumerate(self.info) if info.reference]

    def clean(self, references: dict[str, Probe]) -> dict[int, Probe]:
        """The probes whose reference value (``references``: by source) stands: a plain
        value, and immutable where the solution is handed it (a list it is handed may be
        meant to change: its value is then the one after the solution ran)."""
        clean = {}
        for i in self.references:
            probe = references.get(self.probes[i])
            if probe is not None and probe.kind == "value" and (not self.info[i].handed or immutable(probe.value)):
                clean[i] = probe
        return clean

    @property
    def in_sandbox(self) -> bool:
        """Whether the verdict rests on the solution's process when no probe has a
        reference value."""
        return self.unsafe() is not None

    def computed(self, references: dict[str, Probe]) -> frozenset[int]:
        """The reference candidates the run without the solution gave a plain value."""
        return frozenset(
            i
            for i in self.references
            if (probe := references.get(self.probes[i])) is not None and probe.kind == "value"
        )

    def unsafe(self, clean: frozenset[int] = frozenset(), computed: frozenset[int] | None = None) -> str | None:
        """Why the verdict would rest on a judgement made in the solution's process,
        given the probes whose values came from the reference run (``clean``) and the
        candidates it computed at all (``computed``, default ``clean``: a list the
        solution is handed is computed, not clean); or None when the server decides it
        alone. A candidate it did not compute is a setup value made with the solution
        (``ok = f(3) == 9``, ``results = [f(1) == 1]``): the setup judged there."""
        computed = clean if computed is None else computed
        for index, info in enumerate(self.info):
            if index in clean:
                continue
            if info.reference and index not in computed:
                return f"{self.probes[index]} is computed by the setup code with the solution (or not without it)"
            if info.judges:
                return f"{self.probes[index]} {info.judges} in the solution's process"
            if info.setup_truth:
                return f"the truth of {self.probes[index]}, computed with the solution, would be the verdict"
        for left, right in self.pairs:
            if left - clean and right - clean:
                a, b = self.probes[min(left - clean)], self.probes[min(right - clean)]
                return f"it compares two values from the solution's process ({a} and {b})"
        return None

    def verdict(self, probes: Sequence[Probe]) -> tuple[str, str]:
        """(status, detail): passed, wrong_answer, error, memory, not_plain or output_limit."""
        try:
            result = self.evaluate(probes)
            if result:  # a plain value, a type or a bool: builtin truth
                return "passed", ""
        except CheckFailed as failed:
            return failed.status, failed.detail
        except Exception as exc:  # what the same operation raises in Python (TypeError...)
            return "error", f"{type(exc).__name__}: {exc}"
        shown = "; ".join(
            f"{source} = {describe(p.value)}" for source, p in zip(self.probes, probes) if p.kind == "value"
        )
        prefix = f"{self.message}: " if self.message else ""
        return "wrong_answer", prefix + (shown or f"{self.source} is false")
