"""The recording gateway: an unmodified agent harness calls the policy through an
OpenAI- or Anthropic-compatible API, and every call becomes an exact, token-level turn.

- ``messages``: a harness's messages as the policy's chat template takes them, and
  the text a reply becomes (content and tool calls) for the harness.
- ``session``: one rollout's session: append-only prompts, the call through the
  rollout's ``LLMSession`` (router: pause, versions, deadlines, sticky backend), the
  recorded turns, and new sequences when the harness rewrites its history; auxiliary
  calls (another model than the main loop's) recorded apart; token counts.
- ``prompts``: what the session makes of one call apart from its state (conversion,
  a whole render under the context limit, a standalone turn).
- ``registry``: the live sessions by key.
- ``base``: the typed refusals (``GatewayRefusal`` and its kinds: unknown key, session
  ended, too many calls, time limit, backend failed, bad request...); no status in them:
  ``wire.ERRORS`` gives each kind its HTTP status, for the routes and the socket alike.
- ``wire``: OpenAI's request and answer shapes as bytes (the server's routes and the
  unix socket share it).
- ``anthropic``: Anthropic Messages (system, content blocks, tools) as the session's
  chat request, and a reply as content blocks; ``anthropic_wire``: Anthropic's
  request, answer, stream events and error shape as bytes (shared the same way).
- ``responses``: OpenAI Responses input items (messages, function calls and their
  outputs) as the session's chat request, and a reply as output items;
  ``responses_wire``: the Responses request, answer, stream events and ``/models``
  as bytes (shared the same way).
- ``unix_socket``: one session served on a unix socket in a sandbox's server folder
  (read-only inside, at ``/.rollserve``);
  ``forwarder``: the stdlib script run inside the sandbox that turns 127.0.0.1 there
  into that socket and runs the harness.

Where the gateway's pieces live, one in each layer (the routes call the engine's
``Gateways``, which calls this package; the handlers call this package):

- ``contract/gateway.py`` (and ``contract/anthropic.py``): the models of the wire, the
  OpenAI (Anthropic) request, response, chunk and error shapes, and ``GatewayInfo``
  (what a trainer is told of a rollout's key).
- ``api/routes_gateway.py``: the HTTP routes (``/v1/gateway/<key>/v1/chat/completions``,
  ``.../v1/messages``, ``.../v1/messages/count_tokens``, ``.../end``): the key checked before the body is read, the
  body capped and parsed, the answer or its SSE chunks written, refusals in the
  wire's error shape.
- ``engine/gateway.py``: ``Gateways``, the engine's side: a key to its live session,
  each call's LLM requests bounded by the rollout's deadline.
- ``agent/gateway/`` (this package): the token logic above, shared by the routes
  and the in-sandbox socket.
- ``handlers/gateway.py``: the ``gateway`` task family (a rollout driven by a harness
  through this session), with ``handlers/harness.py`` (open a rollout's session, run a
  harness command in its sandbox) that the swe family's ``harness`` option uses too.

The server makes one ``Gateway`` (``registry``) in ``server.py`` and lends it to the
handlers in ``HandlerContext.gateway`` and to the routes through ``Gateways``. The
other layers import this package's face (``Gateway``, ``GatewaySession``,
``GatewayLimits``, ``GatewayRefusal``, ``GatewayReply``, ``NoCallError``,
``SessionSocket``, ``SOCKET_NAME``: each imported from its module on first use) and
the ``wire``, ``anthropic_wire`` and ``responses_wire`` modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollserve.faces import lazy_names

if TYPE_CHECKING:
    from rollserve.agent.gateway.base import GatewayRefusal
    from rollserve.agent.gateway.registry import Gateway
    from rollserve.agent.gateway.session import (
        GatewayLimits,
        GatewayReply,
        GatewaySession,
        NoCallError,
    )
    from rollserve.agent.gateway.unix_socket import SOCKET_NAME, SessionSocket

_HOMES: dict[str, str] = {
    "Gateway": "rollserve.agent.gateway.registry",
    "GatewayRefusal": "rollserve.agent.gateway.base",
    **dict.fromkeys(
        ("GatewayLimits", "GatewayReply", "GatewaySession", "NoCallError"), "rollserve.agent.gateway.session"
    ),
    **dict.fromkeys(("SOCKET_NAME", "SessionSocket"), "rollserve.agent.gateway.unix_socket"),
}
__all__ = [  # (the keys of _HOMES, written out for tools that read __all__)
    "Gateway",
    "GatewayLimits",
    "GatewayRefusal",
    "GatewayReply",
    "GatewaySession",
    "NoCallError",
    "SOCKET_NAME",
    "SessionSocket",
]


if not TYPE_CHECKING:  # hidden from the type checker: a misspelled import is an error
    __getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())
