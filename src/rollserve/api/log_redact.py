"""Gateway keys stay out of the server's logs.

A harness's calls carry its session key in the path (``/v1/gateway/<key>/...``), and
whoever holds a key can call or end that rollout's session while it runs. uvicorn's
access log writes every request's path, so ``KeyRedactor``, a filter on the access
logger (and on uvicorn's error logger), rewrites each such path to
``/v1/gateway/<redacted>/...`` before any handler sees the record. ``install`` adds
it (idempotently); the app calls it when it is created and again when it starts
(after uvicorn configured its logging), so every way the server is run has it.
"""

from __future__ import annotations

import logging
import re

__all__ = ["REDACTED", "KeyRedactor", "install", "redact"]

REDACTED = "<redacted>"
LOGGERS = ("uvicorn.access", "uvicorn.error", "uvicorn")
# The segment after /v1/gateway/ (possibly percent-encoded): up to the next / ? # or space.
_KEY_IN_PATH = re.compile(r"(/v1/gateway/)[^/?#\s\"']+")


def redact(text: str) -> str:
    """``text`` with the key of every gateway path in it replaced."""
    return _KEY_IN_PATH.sub(rf"\g<1>{REDACTED}", text)


class KeyRedactor(logging.Filter):
    """Rewrites gateway keys out of a record's message and arguments (never drops it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and "/v1/gateway/" in record.msg:
            record.msg = redact(record.msg)
        args = record.args
        if isinstance(args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in args)
        elif isinstance(args, dict):
            record.args = {k: redact(v) if isinstance(v, str) else v for k, v in args.items()}
        return True


_FILTER = KeyRedactor()


def install() -> None:
    """Put the filter on uvicorn's loggers (once each)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, KeyRedactor) for f in logger.filters):
            logger.addFilter(_FILTER)
