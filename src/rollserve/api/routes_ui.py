"""The dashboard (``/ui``) and the data routes only it needs.

- ``/ui/``: static files shipped in the package (``api/ui/``: HTML, CSS, plain JS; no
  build step, nothing fetched from elsewhere). They hold no data, so they are public
  even with ``--api-token``; the page asks for the token once, keeps it in the tab's
  ``sessionStorage`` and sends it as ``Authorization: Bearer`` on every API call (never
  in a URL). A strict Content-Security-Policy lets the page run only its own scripts
  and talk only to this server: text a policy wrote (shown as text, never as HTML)
  cannot run script or send the token elsewhere.
- ``GET /v1/status/stream``: server-sent events, one ``status`` (``ServiceStatus``)
  every ``interval`` seconds: the live view.
- ``GET /v1/results/summaries``: finished results as table rows, filtered and paged
  server-side (newest first).
- ``GET /v1/rollouts/{id}/tokens``: the text of each distinct token of a rollout.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from importlib import resources

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import RedirectResponse, Response
from sse_starlette.sse import EventSourceResponse

from rollserve.api.base import service_of
from rollserve.api.errors import error_response, errors, model_response
from rollserve.api.routes_rollouts import service_status
from rollserve.contract import (
    FailureFilter,
    ResultSummaryPage,
    TerminalStatus,
    TokenTexts,
)
from rollserve.contract.validation import INT64_MAX
from rollserve.engine.store import SummaryFilter
from rollserve.errors import InfraError
from rollserve.llm.tokens import token_texts

UI_PATH = "/ui"
UI_PREFIX = "/ui/"  # public: static files only
_MEDIA = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

STATUS_SEND_TIMEOUT = 30.0  # seconds one status event may wait on a client that reads nothing

pages = APIRouter(include_in_schema=False)
router = APIRouter(prefix="/v1", tags=["dashboard"])


def _files() -> dict[str, tuple[bytes, str]]:
    """The shipped files by name, read once: nothing but these is ever served."""
    folder = resources.files("rollserve.api").joinpath("ui")
    found: dict[str, tuple[bytes, str]] = {}
    for entry in folder.iterdir():
        suffix = entry.name[entry.name.rfind(".") :]
        if entry.is_file() and suffix in _MEDIA:
            found[entry.name] = (entry.read_bytes(), _MEDIA[suffix])
    return found


_FILES = _files()


@pages.get(UI_PATH)
async def ui_root() -> Response:
    # Relative: the page's own relative URLs then work behind a proxy's path prefix too.
    return RedirectResponse("ui/", status_code=307)


@pages.get(UI_PREFIX)
async def ui_index() -> Response:
    return _file("index.html")


@pages.get(UI_PREFIX + "{name}")
async def ui_file(name: str) -> Response:
    return _file(name)


def _file(name: str) -> Response:
    found = _FILES.get(name)
    if found is None:
        raise HTTPException(404, f"no dashboard file {name!r}")
    body, media = found
    return Response(body, media_type=media, headers=_HEADERS)


STATUS_EVENT_SCHEMA = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"type": "string", "enum": ["status"]},
        "data": {"type": "string", "description": "a ServiceStatus as JSON"},
    },
}


@router.get(
    "/status/stream",
    response_class=EventSourceResponse,
    tags=["service"],
    responses={
        200: {
            "description": "a stream of `status` events, each a ServiceStatus as JSON",
            "content": {"text/event-stream": {"schema": STATUS_EVENT_SCHEMA}},
        }
    },
)
async def status_stream(
    request: Request,
    interval: float = Query(1.0, ge=0.2, le=60.0, description="seconds between snapshots"),
    duration: float | None = Query(
        None, gt=0, le=86_400, description="end the stream after this many seconds (default: never)"
    ),
) -> EventSourceResponse:
    """Server-sent events: ``GET /v1/status`` every ``interval`` seconds, the first at once."""
    service = service_of(request)
    loop = asyncio.get_running_loop()
    ends = None if duration is None else loop.time() + duration

    async def stream() -> AsyncIterator[dict[str, str]]:
        while ends is None or loop.time() < ends:
            yield {"event": "status", "data": service_status(service).model_dump_json()}
            wait = interval if ends is None else min(interval, ends - loop.time())
            if service.rollouts.closing or (wait > 0 and await service.rollouts.until_closing(wait)):
                return  # the service is shutting down: the stream ends now

    # A client that stops reading (its socket buffers full) would hold the generator and
    # its task forever: a send that waits longer than this ends the stream.
    return EventSourceResponse(stream(), ping=15, send_timeout=STATUS_SEND_TIMEOUT)


@router.get("/results/summaries", response_model=ResultSummaryPage, tags=["rollouts"])
async def result_summaries(
    request: Request,
    data_source: str | None = Query(None, min_length=1, max_length=200),
    status: TerminalStatus | None = Query(None, description="how it ended"),
    masked: bool | None = Query(None),
    failure_kind: FailureFilter | None = Query(
        None, description="infra | agent | timeout, or none: results that did not fail"
    ),
    before: int | None = Query(
        None,
        ge=1,
        le=INT64_MAX,
        description="cursor: only results with a seq below this (the previous page's next_before)",
    ),
    limit: int = Query(50, ge=1, le=1000),
) -> Response:
    """Finished results as table rows, newest first, filtered server-side."""
    where = SummaryFilter(data_source=data_source, status=status, masked=masked, failure_kind=failure_kind)
    page = await service_of(request).rollouts.summaries(where, before, limit)
    return await model_response(page)


@router.get(
    "/rollouts/{rollout_id}/tokens",
    response_model=TokenTexts,
    tags=["rollouts"],
    responses={**errors(404), 503: error_response(503, "the tokenizer could not decode the tokens")},
)
async def rollout_tokens(rollout_id: str, request: Request) -> TokenTexts:
    """The text of each distinct token id in the rollout's sequences (404 until it has
    a result)."""
    service = service_of(request)
    view = await service.rollouts.rollout(rollout_id)
    if view.result is None:
        raise HTTPException(404, f"rollout {rollout_id!r} has no result yet")
    trajectory = view.result.trajectory
    distinct: set[int] = set(trajectory.tokens.input_ids)
    for sequence in trajectory.sequences:
        distinct.update(sequence.input_ids)
    ids = sorted(distinct)
    tokenizer = service.tokenizer
    try:
        texts = await token_texts(tokenizer, ids)
    except (InfraError, TimeoutError) as exc:
        raise HTTPException(503, f"the tokenizer could not decode the tokens: {exc}") from None
    return TokenTexts(tokenizer=tokenizer.name, ids=ids, texts=texts)
