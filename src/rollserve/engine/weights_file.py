"""The weights in force, kept next to the store across a restart.

The router holds what its policy is (a LoRA adapter's name or the base model), the
policy version stamped on new turns, and the last weight load that took, in memory;
the inference servers keep the weights they loaded when rollserve dies. A restarted
server that forgot would name the base model to servers that hold the adapter, and
stamp turns with no version. So the service writes them here after every weight load
and every resume (``<store>.weights.json``, beside the store file: a new store starts
from the base model), and the router starts from them.

The file is replaced atomically (written beside it, synced, renamed): a crash leaves
the old record or the new one, never a torn one. A record that does not parse stops
the server at start, naming the file: guessing would sample another model.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pydantic import ValidationError

from rollserve.llm.routing import WeightsInForce


class WeightsFileError(Exception):
    """The weights record exists but cannot be read: the server does not start."""


def weights_path(store: Path) -> Path:
    """Where the weights in force are kept for the store file ``store``."""
    return store.with_name(f"{store.stem}.weights.json")


def read(path: Path) -> WeightsInForce | None:
    """The record at ``path``; None if there is none (nothing loaded, nor resumed)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise WeightsFileError(f"{path}: cannot read the weights in force ({exc})") from exc
    try:
        return WeightsInForce.model_validate_json(text)
    except ValidationError as exc:
        raise WeightsFileError(
            f"{path}: not a record of the weights in force ({exc.error_count()} errors: "
            f"{exc.errors()[0]['msg']}); fix or remove it (removed: the server starts from "
            "the base model with no policy version)"
        ) from exc


def write(path: Path, state: WeightsInForce) -> None:
    """Replace the record at ``path`` with ``state`` atomically (blocking: call it in a
    thread)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(state.model_dump_json(indent=1))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself survives a power cut
    finally:
        os.close(folder)
