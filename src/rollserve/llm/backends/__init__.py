"""Inference backends: the servers and in-process models that sample token ids."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollserve.faces import lazy_names

if TYPE_CHECKING:
    from rollserve.llm.backends.factory import (
        RemoteBackendSpec,
        ServerSpec,
        VLLMSpec,
        backend_from_spec,
        parse_backend_spec,
        remote_spec,
    )
    from rollserve.llm.backends.server_backend import ServerBackend

_HOMES: dict[str, str] = {
    **dict.fromkeys(
        ("RemoteBackendSpec", "ServerSpec", "VLLMSpec", "backend_from_spec", "parse_backend_spec", "remote_spec"),
        "rollserve.llm.backends.factory",
    ),
    "ServerBackend": "rollserve.llm.backends.server_backend",
}
__all__ = [  # (the keys of _HOMES, written out for tools that read __all__)
    "RemoteBackendSpec",
    "ServerBackend",
    "ServerSpec",
    "VLLMSpec",
    "backend_from_spec",
    "parse_backend_spec",
    "remote_spec",
]


if not TYPE_CHECKING:  # hidden from the type checker: a misspelled import is an error
    __getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())
