"""verl's agent loop on rollserve (written against verl 0.9.1's experimental agent loop).

What verl 0.9.1 does (``verl/experimental/agent_loop/agent_loop.py``): each
``AgentLoopWorker`` makes a fresh agent loop per sample (``hydra.utils.instantiate`` of
the loop's entry in ``actor_rollout_ref.rollout.agent.agent_loop_config_path``, with that
entry's other keys as keyword arguments) and awaits ``run(sampling_params, **row)``: the
row's columns (``data_source``, ``extra_info``, ``raw_prompt``, ``uid``...), the ``n``
samples of a prompt as ``n`` separate calls. It wants one ``AgentLoopOutput`` back: the
prompt ids, the response ids with a response mask (1: trained on), optionally the
rollout logprobs and a ``reward_score`` (which then is the sample's reward: verl computes
none), padded by verl to ``rollout.prompt_length`` and ``rollout.response_length``.

``RollserveAgentLoop`` (registered as ``rollserve``) submits the row's task
(``verl_rows.task_from_row``) to rollserve as a group of one, waits at most ``timeout``
seconds, and returns rollserve's tokens exactly (``verl_rows.to_verl``). It samples from
the backends registered in rollserve; with ``backends: verl`` it first registers verl's
own inference servers there (their addresses from verl's load balancer).
Masked samples: ``verl_rows``. Only ``rollserve.client``/``rollserve.contract`` of
rollserve are imported.

The loop's entry in verl's agent loop config file::

    - name: rollserve
      _target_: rollserve.integrations.verl.RollserveAgentLoop
      url: http://127.0.0.1:8000     # else the ROLLSERVE_URL environment variable
      timeout: 3600                  # seconds per sample, retries included
      masked_retries: 1              # fresh samples asked for after a masked one
      backends: registered           # or verl: register verl's servers in rollserve
      sampling: {max_tokens: 1024}   # under verl's temperature/top_p/top_k
      agent: {max_turns: 8}
      timeouts: {run: 600}
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from rollserve.client import AsyncClient
from rollserve.contract import AgentLimits, SamplingParams, Timeouts
from rollserve.integrations.verl_rows import (
    LoopSettings,
    VerlTaskError,
    batch_sampling,
    fit_limits,
    register_servers,
    run_one,
    task_from_row,
    to_verl,
    verl_servers,
)

try:
    import verl
    from omegaconf import DictConfig, ListConfig, OmegaConf
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopBase,
        AgentLoopMetrics,
        AgentLoopOutput,
        _agent_loop_registry,
        register,
    )
except ImportError as exc:  # a client-only install: say which extra brings verl
    raise ImportError(f"rollserve.integrations.verl needs verl ({exc}): pip install 'rollserve[verl]'") from exc

__all__ = ["RollserveAgentLoop", "VerlTaskError"]

NAME = "rollserve"
URL_ENV = "ROLLSERVE_URL"


def _plain(value: object) -> object:
    """A config value as plain Python (hydra hands nested entries over as DictConfig)."""
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


class RollserveAgentLoop(AgentLoopBase):
    """verl's agent loop, run by rollserve: one sample per ``run()`` call."""

    def __init__(
        self,
        *args: Any,
        url: str | None = None,
        timeout: float = 3600.0,
        masked_retries: int = 1,
        backends: Literal["registered", "verl"] = "registered",
        sampling: Mapping[str, object] | None = None,
        agent: Mapping[str, object] | None = None,
        timeouts: Mapping[str, object] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.settings = LoopSettings(
            url=str(url or os.environ.get(URL_ENV, "")),
            timeout=float(timeout),
            masked_retries=int(masked_retries),
            backends=backends,
            sampling=None if sampling is None else SamplingParams.model_validate(_plain(sampling)),
            agent=None if agent is None else AgentLimits.model_validate(_plain(agent)),
            timeouts=None if timeouts is None else Timeouts.model_validate(_plain(timeouts)),
        )
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        eos = self.tokenizer.eos_token_id
        self.filler_id = int(eos if eos is not None else self.tokenizer.pad_token_id or 0)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Run the row's task on rollserve; its tokens, mask, logprobs and reward."""
        task = task_from_row(kwargs.get("data_source"), kwargs.get("extra_info"))
        task = fit_limits(task, self.settings, self.prompt_length + self.response_length)
        sampling = batch_sampling(self.settings, sampling_params)
        async with AsyncClient(self.settings.url) as client:
            if self.settings.backends == "verl":
                servers = await verl_servers(self.server_manager, str(getattr(verl, "__version__", "(unknown)")))
                await register_servers(client, servers, str(self.rollout_config.name))
            attempts = await run_one(client, task, sampling, self.settings)
        out = to_verl(attempts, self.prompt_length, self.response_length, self.filler_id)
        return AgentLoopOutput(
            prompt_ids=out.prompt_ids,
            response_ids=out.response_ids,
            response_mask=out.response_mask,
            response_logprobs=out.response_logprobs,
            reward_score=out.reward_score,
            num_turns=out.num_turns,
            metrics=AgentLoopMetrics(**out.metrics),
            extra_fields={
                "rollserve": out.info,
                # verl logs these per sample (every row of a batch has the same keys)
                "reward_extra_info": {
                    "rollserve_masked": float(out.masked),
                    "rollserve_attempts": float(attempts.count),
                },
            },
        )


# Registered as "rollserve" (with the defaults: the URL from ROLLSERVE_URL) unless the agent
# loop config file has an entry of that name already: verl's worker loads that file before
# this module is imported (by the entry's _target_), and the entry's settings must stay.
if NAME not in _agent_loop_registry:
    register(NAME)(RollserveAgentLoop)
