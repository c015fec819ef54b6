"""The bundled sets' table, and the datasets package's neutrality (the client uses it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rollserve.commands.dataset_check import DatasetChecker, offline_context
from rollserve.datasets import BUNDLED, SWE_MINI, SWE_MINI_BUNDLES, bundled_rows, bundled_set, read_dataset


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_every_bundled_set_reads_and_each_row_fits_its_handler(name):
    bundled = bundled_set(name)
    assert bundled.name == name and bundled.path.is_file() and bundled.holds
    rows = bundled_rows(name)
    labels = [row.get("task_id") or row.get("instance_id") for row in rows]
    assert rows and all(labels) and len(set(labels)) == len(labels)  # each row named, once
    # The same rows as `rollserve datasets validate NAME` reads, each valid for its handler.
    dataset = read_dataset(bundled.path, bundled.data_source)
    assert [row.instance for row in dataset] == rows
    checks = DatasetChecker(context=offline_context()).check_all(dataset)
    assert [c.error for c in checks if not c.ok] == []


def test_swe_mini_has_a_git_bundle_per_instance():
    assert SWE_MINI is BUNDLED["swe-mini"] and SWE_MINI.data_source == "swe"
    names = {path.name for path in SWE_MINI_BUNDLES.glob("*.bundle")}
    assert names == {f"{row['instance_id']}.bundle" for row in SWE_MINI.rows()}


def test_an_unknown_name_lists_the_bundled_ones():
    with pytest.raises(KeyError, match="no bundled set 'chess' \\(bundled: swe-mini, code, stem, math, easy\\)"):
        bundled_rows("chess")


def test_the_package_imports_nothing_of_the_server():
    """``rollserve.datasets`` is used by the client alone (``rollserve run --server``)."""
    code = "import sys, rollserve.datasets\nprint(sorted(m for m in sys.modules if m.startswith('rollserve.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    loaded = eval(out)  # a list of module names
    assert loaded and all(m.startswith("rollserve.datasets") for m in loaded), loaded
