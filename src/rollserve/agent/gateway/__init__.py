"""The recording gateway: an unmodified agent harness calls the policy through an
OpenAI-compatible API, and every call becomes an exact, token-level turn.

- ``messages``: a harness's messages as the policy's chat template takes them, and
  the text a reply becomes (content and tool calls) for the harness.
- ``session``: one rollout's session: append-only prompts, the call through the
  rollout's ``LLMSession`` (router: pause, versions, deadlines, sticky backend), the
  recorded turns, and new sequences when the harness rewrites its history.
- ``registry``: the live sessions by key.
"""
