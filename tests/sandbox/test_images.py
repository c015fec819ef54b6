"""Pulling environment images ahead of time with the runtimes' own image methods,
against stand-in ``apptainer`` and ``docker`` executables placed first on PATH."""

from __future__ import annotations

import pytest

from rollserve.sandbox.apptainer import ApptainerRuntime
from rollserve.sandbox.docker import DockerRuntime
from rollserve.sandbox.images import BadImageReference, RuntimeMissing, make_puller, normalize_reference, pull_images
from tests.sandbox.image_fakes import FAKE_APPTAINER, FAKE_DOCKER, FakeBinary, install


@pytest.fixture
def fake_apptainer(tmp_path, monkeypatch) -> FakeBinary:
    return install(tmp_path, monkeypatch, "apptainer", FAKE_APPTAINER)


@pytest.fixture
def fake_docker(tmp_path, monkeypatch) -> FakeBinary:
    return install(tmp_path, monkeypatch, "docker", FAKE_DOCKER)


async def test_builds_each_reference_once_into_the_runtime_cache(fake_apptainer, tmp_path):
    cache = tmp_path / "images"
    puller = make_puller("apptainer", cache, concurrency=2)
    refs = ["docker://a:1", "docker://b:1", "docker://a:1"]
    seen = []
    results = await pull_images(refs, puller, on_result=seen.append)
    assert [r.reference for r in results] == ["docker://a:1", "docker://b:1"]
    assert all(r.ok and r.attempts == 1 and not r.cached for r in results)
    assert sorted(r.reference for r in seen) == ["docker://a:1", "docker://b:1"]
    assert len(fake_apptainer.calls("build")) == 2
    # Where (and under which name) a server's ApptainerRuntime looks for the image.
    assert isinstance(puller, ApptainerRuntime) and puller.image_location() == cache
    target = puller.images.path_for("docker://a:1")
    assert target.parent == cache and target.read_text() == "SIF docker://a:1"
    assert not list(cache.glob("*.partial"))


async def test_cached_images_are_skipped(fake_apptainer, tmp_path):
    puller = make_puller("apptainer", tmp_path / "images")
    await pull_images(["docker://a:1"], puller)
    sif = tmp_path / "local.sif"
    sif.write_text("SIF")
    results = await pull_images(["docker://a:1", str(sif)], puller)
    assert all(r.ok and r.cached and r.attempts == 0 for r in results)
    assert len(fake_apptainer.calls("build")) == 1


async def test_concurrency_is_capped(fake_apptainer, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_BUILD_SECONDS", "0.3")
    puller = make_puller("apptainer", tmp_path / "images", concurrency=2)
    results = await pull_images([f"docker://img{i}:1" for i in range(5)], puller, concurrency=2)
    assert all(r.ok for r in results)
    builds = fake_apptainer.calls("build")
    assert len(builds) == 5
    overlap = max(sum(1 for b in builds if b["start"] <= t < b["end"]) for t in (b["start"] for b in builds))
    assert overlap == 2


async def test_a_failure_is_retried_with_backoff_then_succeeds(fake_apptainer, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FAILS", "2")
    retries = []
    puller = make_puller("apptainer", tmp_path / "images")
    (result,) = await pull_images(
        ["docker://flaky:1"],
        puller,
        retries=2,
        backoff=0.05,
        on_retry=lambda ref, attempt, error: retries.append((attempt, error)),
    )
    assert result.ok and result.attempts == 3
    assert [attempt for attempt, _ in retries] == [1, 2]
    assert "unable to pull docker://flaky:1" in retries[0][1]
    first, second, third = fake_apptainer.calls("build")
    assert second["start"] - first["end"] >= 0.05 and third["start"] - second["end"] >= 0.1


async def test_a_permanent_failure_reports_attempts_and_the_last_error(fake_apptainer, tmp_path):
    puller = make_puller("apptainer", tmp_path / "images")
    failed, ok = await pull_images(["docker://fail:1", "docker://fine:1"], puller, retries=1, backoff=0.01)
    assert not failed.ok and failed.attempts == 2 and "unable to pull docker://fail:1" in failed.error
    assert ok.ok
    (missing,) = await pull_images([str(tmp_path / "missing.sif")], puller)
    assert not missing.ok and missing.attempts == 1 and "neither a .sif file" in missing.error


def test_missing_binary_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeMissing, match="apptainer or singularity is not on PATH: install Apptainer"):
        make_puller("apptainer", tmp_path)
    with pytest.raises(RuntimeMissing, match="docker is not on PATH: install Docker"):
        make_puller("docker", tmp_path)
    with pytest.raises(ValueError, match="unknown image runtime 'local'; known: apptainer"):
        make_puller("local", tmp_path)


def test_singularity_falls_back_to_apptainer(fake_apptainer, tmp_path):
    puller = make_puller("singularity", tmp_path)
    assert isinstance(puller, ApptainerRuntime) and puller.binary == "apptainer"


async def test_docker_pulls_what_it_does_not_have(fake_docker, tmp_path):
    puller = make_puller("docker", tmp_path)
    assert isinstance(puller, DockerRuntime) and puller.image_location() is None
    results = await pull_images(["python:3.12", "fail/x:1"], puller, retries=0)
    assert results[0].ok and results[0].attempts == 1
    assert not results[1].ok and "manifest unknown" in results[1].error
    (again,) = await pull_images(["python:3.12"], puller)
    assert again.cached
    assert sorted(c["argv"][1] for c in fake_docker.calls("pull")) == ["fail/x:1", "python:3.12"]


def test_references_are_normalized_for_the_runtime():
    assert normalize_reference("python:3.12", "apptainer") == "docker://python:3.12"
    assert normalize_reference("docker://python:3.12", "apptainer") == "docker://python:3.12"
    assert normalize_reference("/images/x.sif", "singularity") == "/images/x.sif"
    assert normalize_reference("oras://r/x:1", "apptainer") == "oras://r/x:1"
    assert normalize_reference("docker://python:3.12", "docker") == "python:3.12"
    assert normalize_reference("ghcr.io/o/x:1", "podman") == "ghcr.io/o/x:1"
    with pytest.raises(BadImageReference, match="use --runtime apptainer"):
        normalize_reference("library://x/y:1", "docker")
