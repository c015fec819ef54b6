"""A folder of Harbor tasks as a dataset: one row per task folder.

A folder holding ``task.toml`` is one task; a folder of such folders is many (hidden
folders aside; a visible sub-folder without ``task.toml`` is still a row, so that its
check names what is missing). Each row is ``{"data_source": "harbor", "instance":
{"task": "<name>"}, "task_id": "<name>"}``, the name relative to the dataset's root:
the folder itself when it holds many tasks, its parent when it is one. A server runs
those rows with its ``harbor`` root set to that root (``rollserve run DIR`` does it for
its embedded server; a remote server's operator sets it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DATA_SOURCE = "harbor"


def is_task(folder: Path) -> bool:
    return (folder / "task.toml").is_file()


def task_folders(folder: Path) -> list[Path]:
    """``folder`` itself if it is a task, else its sub-folders (hidden ones aside)."""
    if is_task(folder):
        return [folder]
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def harbor_root(folder: Path) -> Path:
    """The root the rows of ``folder`` name their tasks in (resolved)."""
    folder = folder.resolve()
    return folder.parent if is_task(folder) else folder


def harbor_records(folder: Path) -> list[dict[str, Any]]:
    """One row per task of ``folder``; ValueError when it holds no task at all."""
    folder = folder.resolve()
    tasks = task_folders(folder)
    if not any(is_task(t) for t in tasks):
        raise ValueError(
            f"{folder}: no Harbor task here (neither {folder.name}/task.toml nor a "
            "sub-folder with a task.toml); a dataset is a JSONL or parquet file, "
            "a Harbor task folder, or a folder of them"
        )
    root = harbor_root(folder)
    names = [t.relative_to(root).as_posix() for t in tasks]
    return [{"data_source": DATA_SOURCE, "instance": {"task": name}, "task_id": name} for name in names]
