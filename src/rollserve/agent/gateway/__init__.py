"""The recording gateway: an unmodified agent harness calls the policy through an
OpenAI- or Anthropic-compatible API, and every call becomes an exact, token-level turn.

- ``messages``: a harness's messages as the policy's chat template takes them, and
  the text a reply becomes (content and tool calls) for the harness.
- ``session``: one rollout's session: append-only prompts, the call through the
  rollout's ``LLMSession`` (router: pause, versions, deadlines, sticky backend), the
  recorded turns, and new sequences when the harness rewrites its history.
- ``registry``: the live sessions by key.
- ``wire``: OpenAI's request and answer shapes as bytes (the server's routes and the
  unix socket share it).
- ``anthropic``: Anthropic Messages (system, content blocks, tools) as the session's
  chat request, and a reply as content blocks; ``anthropic_wire``: Anthropic's
  request, answer, stream events and error shape as bytes (shared the same way).
- ``unix_socket``: one session served on a unix socket in a sandbox's server folder
  (read-only inside, at ``/.rollserve``);
  ``forwarder``: the stdlib script run inside the sandbox that turns 127.0.0.1 there
  into that socket and runs the harness.
"""
