"""One tokenizer contract (``llm.base.Tokenizer``), two implementations: the local
``ChatTokenizer`` and the serving backend's ``BackendTokenizer``. Each makes its own
prompt builder, knows whether its template renders tools, and says so only once it
knows (a backend's before ``ready()`` is a typed infra error, never a guess)."""

from __future__ import annotations

import copy

import pytest

from rollserve.agent.tool_calls import present_tools
from rollserve.errors import InfraError
from rollserve.llm.base import TokenizerError
from rollserve.llm.tokens.backend_tokenizer import BackendTokenizer
from rollserve.llm.tokens.chat import BackendPromptBuilder, LocalPromptBuilder
from rollserve.llm.tokens.tokenizer import ChatTokenizer
from rollserve.testing import FakeVLLM

BASH = {"name": "bash", "description": "run", "parameters": {"type": "object", "properties": {}}}

# Writes the tools section itself, as Qwen's template does.
TOOLS_TEMPLATE = """
{%- if tools -%}
{{- '<|im_start|>system\n# Tools\n<tools>\n' -}}
{%- for tool in tools -%}{{- tool | tojson -}}{{- '\n' -}}{%- endfor -%}
{{- '</tools><|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""
# Refuses tools outright (some templates raise_exception on arguments they do not take).
REFUSING_TEMPLATE = """
{%- if tools -%}{{- raise_exception('this template takes no tools') -}}{%- endif -%}
{%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""


def with_template(tok: ChatTokenizer, template: str, name: str) -> ChatTokenizer:
    hf = copy.deepcopy(tok.hf)
    hf.chat_template = template
    return ChatTokenizer(hf, name=name)


async def test_a_local_tokenizer_knows_what_its_template_renders(tok):
    tools = with_template(tok, TOOLS_TEMPLATE, "tools")
    refusing = with_template(tok, REFUSING_TEMPLATE, "refusing")
    for tokenizer in (tok, tools, refusing):
        await tokenizer.ready()  # nothing to wait for
        assert isinstance(tokenizer.prompt_builder(), LocalPromptBuilder)
        await tokenizer.close()
    assert tok.renders_tools is False  # SmolLM2's ChatML ignores tools
    assert tools.renders_tools is True
    assert refusing.renders_tools is False
    shown = present_tools([BASH], "Be brief.", tools)
    assert shown.template_tools == [{"type": "function", "function": BASH}]
    assert shown.system_prompt == "Be brief." and not shown.wrap_responses
    shown = present_tools([BASH], "Be brief.", refusing)
    assert shown.template_tools is None and "# Tools" in shown.system_prompt


async def test_a_backend_tokenizer_answers_once_probed_and_never_guesses_before(tok):
    tools = with_template(tok, TOOLS_TEMPLATE, "tools")
    for server_tok, expected in ((tok, False), (tools, True)):
        async with FakeVLLM(server_tok) as server:
            backend = BackendTokenizer(server.url)
            for fact in ("renders_tools", "eos_token_id"):
                with pytest.raises(TokenizerError, match="await ready"):
                    getattr(backend, fact)
            with pytest.raises(InfraError):  # typed: a rollout that hits it is masked
                present_tools([BASH], "Be brief.", backend)
            await backend.ready()
            assert backend.renders_tools is expected
            assert backend.eos_token_id == tok.eos_token_id
            shown = present_tools([BASH], "Be brief.", backend)
            assert (shown.template_tools is not None) is expected
            builder = backend.prompt_builder(tools=shown.template_tools)
            assert isinstance(builder, BackendPromptBuilder) and builder.tools == shown.template_tools
            await backend.close()


async def test_prompts_with_tools_are_the_same_from_either_tokenizer(tok):
    tools = with_template(tok, TOOLS_TEMPLATE, "tools")
    schemas = [{"type": "function", "function": BASH}]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "ls"}]
    async with FakeVLLM(tools) as server:
        backend = BackendTokenizer(server.url)
        remote = await backend.prompt_builder(tools=schemas).afirst(messages)
        await backend.close()
    local = await tools.prompt_builder(tools=schemas).afirst(messages)
    assert remote == local and b'"name": "bash"' in tools.decode(local).encode()
