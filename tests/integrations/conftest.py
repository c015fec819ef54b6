"""The whole-service fixtures (a real `rollserve serve`, scripted fake vLLM servers)."""

from tests.e2e.conftest import _offline_env, fake_llm_thread, server_factory

__all__ = ["_offline_env", "fake_llm_thread", "server_factory"]
