"""Append-only prompts with the real SmolLM2 ChatML template, end to end through
the agent loop, the router, the vLLM backend and a fake vLLM server: the tokens the
trainer gets are exactly the tokens the server sampled."""

import copy

from rollserve.agent.base import AgentEnv, Step
from rollserve.agent.loop import LoopStats, run_agent_loop
from rollserve.agent.trajectory import Trajectory
from rollserve.llm.backends.vllm import VLLMBackend
from rollserve.llm.base import SamplingParams
from rollserve.llm.routing.router import Router
from rollserve.llm.tokens.chat import LocalPromptBuilder
from rollserve.llm.tokens.tokenizer import ChatTokenizer
from rollserve.testing import FakeVLLM


class ScriptedEnv(AgentEnv):
    """Answers each reply with an observation; done after ``turns`` replies."""

    tools = None

    def __init__(self, turns: int):
        self.turns = turns
        self.replies: list[str] = []

    def initial_messages(self):
        return [
            {"role": "system", "content": "You are a careful assistant."},
            {"role": "user", "content": "Compute 17 * 3, step by step."},
        ]

    async def step(self, reply):
        self.replies.append(reply)
        if len(self.replies) >= self.turns:
            return Step(done=True, reason="finished")
        return Step(messages=[{"role": "user", "content": f"Observation {len(self.replies)}: ok"}])


async def run_episode(tok, replies, turns, max_tokens=64):
    env = ScriptedEnv(turns)
    async with FakeVLLM(tok, replies=replies) as server:
        router = Router(policy_version=5)
        router.add(VLLMBackend(server.url, model="m"))
        trajectory = Trajectory()
        await run_agent_loop(
            env,
            router.session("t"),
            tok,
            SamplingParams(max_tokens=max_tokens),
            max_turns=turns,
            max_context_tokens=4096,
            trajectory=trajectory,
            stats=LoopStats(),
        )
        await router.remove(next(iter(b["name"] for b in router.list())))
    return trajectory, server, env


def assert_exact_tokens(trajectory: Trajectory, server: FakeVLLM) -> None:
    """Every sampled id and logprob reached the trajectory verbatim, in place."""
    assert len(server.calls) == len(trajectory.turns)
    for turn, call in zip(trajectory.turns, server.calls):
        assert turn.output_ids == call.output_ids and turn.logprobs == call.logprobs
        # The prompt sent is the sequence so far: append-only.
        assert trajectory.input_ids[: len(call.prompt_ids)] == call.prompt_ids
        end = len(call.prompt_ids) + len(call.output_ids)
        assert trajectory.input_ids[len(call.prompt_ids) : end] == call.output_ids
        assert trajectory.logprobs[len(call.prompt_ids) : end] == call.logprobs
        assert trajectory.loss_mask[len(call.prompt_ids) : end] == [1] * len(call.output_ids)
    assert sum(trajectory.loss_mask) == trajectory.output_tokens


def test_first_prompt_is_the_full_render(tok):
    messages = ScriptedEnv(1).initial_messages()
    expected = tok.encode(tok.render(messages, add_generation_prompt=True))
    assert LocalPromptBuilder(tok).first(messages) == expected
    assert expected[-4:] == tok.encode("<|im_start|>assistant\n")


async def test_two_turns_equal_a_full_render(tok):
    trajectory, server, env = await run_episode(tok, ["17 * 3 = 51.", "The answer is 51."], turns=2)
    assert_exact_tokens(trajectory, server)
    full = tok.encode(tok.render(trajectory.messages, add_generation_prompt=False))
    # The sequence ends at the last sampled <|im_end|>; the render adds only "\n".
    assert full[: len(trajectory.input_ids)] == trajectory.input_ids
    assert tok.decode(full[len(trajectory.input_ids) :]) == "\n"
    fidelity = trajectory.fidelity
    assert fidelity.append_only and fidelity.template_checked
    assert fidelity.mismatches == 0 and fidelity.fallback_deltas == 0
    assert [t.policy_version for t in trajectory.turns] == [5, 5]
    assert env.replies == ["17 * 3 = 51.", "The answer is 51."]


async def test_a_turn_cut_by_max_tokens_continues_correctly(tok):
    long_reply = "Let me think about this carefully and at length before answering."
    trajectory, server, _ = await run_episode(tok, [long_reply, "51"], turns=2, max_tokens=5)
    first, second = trajectory.turns
    assert first.finish_reason == "length" and len(first.output_ids) == 5
    assert tok.eos_token_id not in first.output_ids
    # The next prompt closes the cut turn with the template's own <|im_end|>\n.
    assert tok.decode(second.prompt_ids_delta).startswith("<|im_end|>\n<|im_start|>user\n")
    assert_exact_tokens(trajectory, server)
    full = tok.encode(tok.render(trajectory.messages, add_generation_prompt=False))
    assert full[: len(trajectory.input_ids)] == trajectory.input_ids
    assert trajectory.fidelity.mismatches == 0


# Like Qwen3's: earlier assistant turns lose their reasoning when the history is rendered.
DROP_REASONING_TEMPLATE = """
{%- for message in messages -%}
{%- set content = message['content'] -%}
{%- if message['role'] == 'assistant' and not loop.last -%}
{%- set content = content.split('</think>')[-1].lstrip() -%}
{%- endif -%}
{{- '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""


async def test_a_template_that_rewrites_history_is_reported(tok):
    hf = copy.deepcopy(tok.hf)
    hf.chat_template = DROP_REASONING_TEMPLATE
    rewriting = ChatTokenizer(hf, name="drop-reasoning")
    replies = ["<think>17*3 is 51</think>It is 51.", "<think>check again</think>Yes, 51."]
    trajectory, server, _ = await run_episode(rewriting, replies, turns=2)
    assert_exact_tokens(trajectory, server)  # the sampled ids are kept, reasoning included
    fidelity = trajectory.fidelity
    assert fidelity.append_only is True
    assert fidelity.fallback_deltas == 1
    assert fidelity.template_checked and fidelity.mismatches > 0
    assert fidelity.first_mismatch is not None
    assert "17*3 is 51" in rewriting.decode(trajectory.input_ids)
