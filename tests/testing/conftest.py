import pytest

from rollserve.llm.tokenizer import ChatTokenizer


@pytest.fixture(scope="session")
def tok() -> ChatTokenizer:
    """The real SmolLM2 ChatML tokenizer (read from the GGUF once, then cached)."""
    return ChatTokenizer.load("smollm2")


@pytest.fixture
def chat_prompt(tok):
    def make(text: str = "What is 2+2?") -> list[int]:
        rendered = tok.render([{"role": "user", "content": text}], add_generation_prompt=True)
        return tok.encode(rendered)

    return make
