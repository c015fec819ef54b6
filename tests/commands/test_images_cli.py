"""``rollserve images pull``: a dataset's images into the apptainer cache, against a
stand-in ``apptainer`` and a task family whose instances name their images."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from rollserve.cli import app
from rollserve.commands import dataset_check
from tests.dataset_helpers import registry_with_images
from tests.sandbox.image_fakes import FAKE_APPTAINER, install

runner = CliRunner()


@pytest.fixture
def fake_apptainer(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset_check, "HandlerRegistry", registry_with_images)
    return install(tmp_path, monkeypatch, "apptainer", FAKE_APPTAINER)


def dataset(tmp_path, instances):
    path = tmp_path / "envs.jsonl"
    path.write_text("".join(json.dumps(i) + "\n" for i in instances))
    return str(path)


def pull(*args):
    # CliRunner passes the PATH the fixture set (monkeypatch changes os.environ).
    return runner.invoke(
        app, ["images", "pull", *args, "--backoff", "0.01"], env={"COLUMNS": "250", "PATH": os.environ["PATH"]}
    )


def test_pulls_each_image_once_and_skips_cached_ones(fake_apptainer, tmp_path):
    cache = tmp_path / "sif"
    path = dataset(
        tmp_path,
        [
            {"image": "python:3.12"},
            {"image": "docker://python:3.12"},
            {"images": ["docker://debian:12", "python:3.12"]},
        ],
    )
    result = pull(path, "-d", "imaged", "--image-cache", str(cache))
    assert result.exit_code == 0, result.output
    assert f"2 images into {cache}: 2 fetched, 0 already there, 0 failed" in result.output
    assert sorted(c["argv"][2] for c in fake_apptainer.calls("build")) == ["docker://debian:12", "docker://python:3.12"]
    assert len(list(cache.glob("*.sif"))) == 2
    result = pull(path, "-d", "imaged", "--image-cache", str(cache))
    assert result.exit_code == 0 and "0 fetched, 2 already there" in result.output
    assert len(fake_apptainer.calls("build")) == 2


def test_failures_are_retried_then_reported_with_exit_1(fake_apptainer, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FAILS", "1")
    path = dataset(tmp_path, [{"image": "flaky:1"}, {"image": "fail/never:1"}, {}])
    result = pull(path, "-d", "imaged", "--image-cache", str(tmp_path / "sif"), "--retries", "2")
    assert result.exit_code == 1
    out = result.output
    assert "1 invalid rows skipped (rows 3)" in out
    assert "retrying docker://flaky:1" in out
    assert "1 fetched, 0 already there, 1 failed" in out
    assert "failed images" in out and "docker://fail/never:1" in out
    assert "unable to pull docker://fail/never:1" in out
    (row,) = [line for line in out.splitlines() if "docker://fail/never:1" in line and "│" in line]
    assert [cell.strip() for cell in row.split("│")][2] == "3"  # attempts: 1 + 2 retries


def test_the_concurrency_cap_holds(fake_apptainer, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_BUILD_SECONDS", "0.3")
    path = dataset(tmp_path, [{"image": f"img{i}:1"} for i in range(4)])
    result = pull(path, "-d", "imaged", "--image-cache", str(tmp_path / "sif"), "--concurrency", "1")
    assert result.exit_code == 0, result.output
    builds = sorted(fake_apptainer.calls("build"), key=lambda b: b["start"])
    assert all(later["start"] >= earlier["end"] for earlier, later in zip(builds, builds[1:]))


def test_a_dataset_without_images(fake_apptainer, tmp_path):
    path = dataset(tmp_path, [{"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}}])
    result = pull(path, "--image-cache", str(tmp_path / "sif"))
    assert result.exit_code == 0 and "no images needed" in result.output


def test_a_missing_runtime_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    path = dataset(tmp_path, [{"image": "python:3.12"}])
    result = pull(path, "-d", "imaged")
    assert result.exit_code == 2
    assert "apptainer or singularity is not on PATH" in result.output
    assert "install Apptainer" in result.output
    result = pull(path, "-d", "imaged", "--runtime", "podman")
    assert result.exit_code == 2 and "install Podman" in result.output
    result = pull(path, "--runtime", "lxc")
    assert result.exit_code == 2 and "--runtime" in result.output
