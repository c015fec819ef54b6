"""Which of a harness's model calls are its agent's main loop, and which are auxiliary.

A production harness calls the model for more than its agent's turns: Claude Code asks
a "small fast model" for a session title, an Explore sub-agent or a summary; other
harnesses ask for titles or compaction. The policy answers them all, but only the
main loop's calls are the episode the reward judges. ``GatewayCalls`` says how a
gateway session tells them apart, by the model name a call asks for:

- ``main_model`` unset: every call is the main loop's (a harness that calls one model);
- ``main_model`` set: a call asking for a model ``auxiliary`` names is auxiliary, its
  ``purpose`` the table's; every other call (the main model, or any model the table
  does not name) is the main loop's. The table is the server's (a preset's, or the
  trainer's ``instance.calls``), so what is left out of the main loop is never the
  agent's choice: a policy whose commands reach the gateway and ask for a model of
  their own get main-loop calls, counted against ``max_turns`` and trained on.

Each auxiliary call is recorded in a sequence of its own (``Trajectory.auxiliary``),
never in the main loop's append-only sequences, so it neither breaks them nor is
trained on by a trainer that reads ``tokens``/``sequences``. A harness preset sets it
in its ``[calls]`` table; a ``gateway`` rollout in ``instance.calls``.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["GatewayCalls"]

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/@\[\]-]{0,199}$"
_PURPOSE = r"^[a-z][a-z0-9_]{0,63}$"


class GatewayCalls(BaseModel):
    """How a gateway session tells its main loop's calls from auxiliary ones."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    main_model: str | None = Field(
        None,
        pattern=_NAME,
        description="the model name the harness asks for in its main "
        "loop's calls; unset: every call is the main loop's",
    )
    auxiliary: dict[str, str] = Field(
        default_factory=dict,
        description="model name -> purpose (lower_snake_case) of the "
        "auxiliary calls asking for it (e.g. the name a preset gives the harness's small "
        "fast model -> small_fast_model); a call asking for a model not named here is the "
        "main loop's",
    )

    def purpose_of(self, model: str) -> str | None:
        """None for a main-loop call asking for ``model``, else the auxiliary purpose."""
        if self.main_model is None:
            return None
        return self.auxiliary.get(model)

    @model_validator(mode="after")
    def _auxiliary_models(self) -> GatewayCalls:
        if self.auxiliary and self.main_model is None:
            raise ValueError("auxiliary needs main_model: without it every call is the main loop's")
        for model, purpose in self.auxiliary.items():
            if model == self.main_model:
                raise ValueError(f"auxiliary names the main model {model!r}")
            if re.fullmatch(_NAME, model) is None:
                raise ValueError(f"auxiliary: {model!r} is not a model name")
            if re.fullmatch(_PURPOSE, purpose) is None:
                raise ValueError(f"auxiliary[{model!r}]: purpose {purpose!r} must be lower_snake_case")
        return self
