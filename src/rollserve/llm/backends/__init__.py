"""Inference backends: the servers and in-process models that sample token ids."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

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
    **dict.fromkeys(("RemoteBackendSpec", "ServerSpec", "VLLMSpec", "backend_from_spec",
                     "parse_backend_spec", "remote_spec"),
                    "rollserve.llm.backends.factory"),
    "ServerBackend": "rollserve.llm.backends.server_backend",
}
__all__ = [  # (the keys of _HOMES, written out for tools that read __all__)
    "RemoteBackendSpec", "ServerBackend", "ServerSpec", "VLLMSpec", "backend_from_spec",
    "parse_backend_spec", "remote_spec",
]


def __getattr__(name: str) -> object:
    """Import a public name from its home module the first time it is asked for (so
    importing one module of this package does not import the others)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value: object = vars(importlib.import_module(home))[name]
    globals()[name] = value
    return value
