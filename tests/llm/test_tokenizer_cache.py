"""The tokenizer extracted from a GGUF is cached as a folder and loaded from it at every
later start. It is loaded with the class that wrote it rather than through
``AutoTokenizer``, which picks the same class but first imports the model configurations
and torch (seconds of CPU per server start): the two must give the same tokenizer, and a
server that starts with the default tokenizer must not import torch."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from rollserve.llm.tokens import tokenizer as tokenizer_module

TEXTS = [
    "What is 2+2?  Then  22 and 3.14159, 1000000.",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "naïve café — 你好 🙂\ttabs\n\n  spaces",
    "def f(x):\n    return x ** 2  # 0x1F",
]


def test_the_cached_folder_loads_as_auto_tokenizer_would_load_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLSERVE_CACHE", str(tmp_path))
    extracted = tokenizer_module._load_hf("smollm2")  # extracts the GGUF into the cache
    folders = list((tmp_path / "tokenizers").iterdir())
    assert len(folders) == 1 and (folders[0] / "tokenizer_config.json").exists()
    cached = tokenizer_module._load_hf("smollm2")  # the same source, now from the cache

    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(folders[0]), local_files_only=True)
    assert type(cached) is type(auto)
    assert cached.init_kwargs == auto.init_kwargs
    assert cached.backend_tokenizer.to_str() == auto.backend_tokenizer.to_str()
    assert cached.chat_template == auto.chat_template == extracted.chat_template
    assert cached.special_tokens_map == auto.special_tokens_map == extracted.special_tokens_map
    assert cached.eos_token_id == auto.eos_token_id == extracted.eos_token_id
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": TEXTS[0]}]
    for tok in (cached, auto, extracted):
        assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
            auto.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        )
        for text in TEXTS:
            ids = auto.encode(text, add_special_tokens=False)
            assert tok.encode(text, add_special_tokens=False) == ids
            assert tok.decode(ids) == auto.decode(ids)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed: nothing to check")
def test_a_server_with_the_default_tokenizer_starts_without_importing_torch(tmp_path):
    # A fresh interpreter, as `rollserve serve` is: the commands, the whole service
    # started (tokenizer, handlers, scoring pool, warm imports) and stopped.
    code = textwrap.dedent(
        f"""
        import asyncio, sys
        import rollserve.commands.app
        from rollserve.server import ServerConfig, Service

        async def main():
            service = Service(ServerConfig(state_dir={str(tmp_path / "state")!r}))
            await service.start()
            await service.stop()

        if __name__ == "__main__":
            asyncio.run(main())
            print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
        """
    )
    script = tmp_path / "serve_imports.py"
    script.write_text(code)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-2000:]
