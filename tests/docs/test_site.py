"""The docs site builds strictly: a nav entry without a page, a page outside the nav, a
link to a missing page or anchor each fail the build (mkdocs.yml's ``validation`` and
``strict``), so a broken docs change fails the suite. The HTTP reference page is made
from the schema the service serves, and every page the issue asks for is in the nav."""

from __future__ import annotations

import importlib.util
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.docs.site import ROOT, Build, build
from tests.docs.snippets import snippets_of

# The nav a user follows: each section the docs must have, and a page of it.
SECTIONS = {
    "Getting started": "getting-started.md",
    "Concepts": "concepts.md",
    "HTTP API": "api-reference.md",
    "Python client": "client.md",
    "Training": "train-trl.md",
    "Harnesses and the gateway": "gateway.md",
    "Task families": "writing-a-family.md",
    "Datasets": "datasets.md",
    "Sandboxes and security": "security.md",
    "Ray cluster": "ray.md",
    "Dashboard and metrics": "metrics.md",
    "Benchmarks": "benchmarks.md",
    "Contributing": "architecture.md",
}


def _nav_pages(entries: list) -> dict[str, list[str]]:
    """Top-level nav title -> the pages under it."""
    out: dict[str, list[str]] = {}
    for entry in entries:
        ((title, value),) = entry.items()
        out[title] = [value] if isinstance(value, str) else [p for e in value for p in e.values()]
    return out


def _config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


BROKEN_TEST = "test_a_broken_link_a_missing_page_and_an_orphan_fail_the_build"


@pytest.fixture(scope="module")
def broken_build(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Build]:
    """The same site with three faults (a nav entry without a page, a link to a missing
    page and one to a missing anchor, a page outside the nav), its build started."""
    root = tmp_path_factory.mktemp("broken")
    shutil.copytree(ROOT / "docs", root / "docs")
    shutil.copytree(ROOT / "benchmarks" / "results", root / "benchmarks" / "results")
    config = (
        (ROOT / "mkdocs.yml")
        .read_text()
        .replace("  - Datasets: datasets.md", "  - Datasets: datasets.md\n  - Gone: no-such-page.md")
    )
    assert "no-such-page.md" in config, "mkdocs.yml's nav no longer has the Datasets line to add to"
    (root / "mkdocs.yml").write_text(config)
    concepts = root / "docs" / "concepts.md"
    concepts.write_text(concepts.read_text() + "\nSee [this](missing-page.md) and [that](results.md#no-such-anchor).\n")
    (root / "docs" / "orphan.md").write_text("# Not in the nav\n")
    building = Build(root / "mkdocs.yml", root / "site")
    yield building
    building.stop()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    # The broken site's build (if its test is selected) runs side by side with this one:
    # two processes for the two cores, instead of one build after the other.
    if any(item.name == BROKEN_TEST for item in request.session.items):
        request.getfixturevalue("broken_build")
    out = tmp_path_factory.mktemp("site")
    done = build(ROOT / "mkdocs.yml", out)
    assert done.returncode == 0, f"the docs site does not build strictly:\n{done.stderr[-4000:]}"
    return out


def test_the_nav_has_every_section_a_user_follows() -> None:
    nav = _nav_pages(_config()["nav"])
    for section, page in SECTIONS.items():
        assert page in nav.get(section, []), f"nav section {section!r} lacks {page}"


def test_the_site_builds_strictly_with_every_page(site: Path) -> None:
    config = _config()
    pages = [p for ps in _nav_pages(config["nav"]).values() for p in ps]
    for page in pages:
        built = site / ("index.html" if page == "index.md" else page.removesuffix(".md") + "/index.html")
        assert built.is_file(), f"{page} was not built"
    assert (site / "benchmarks" / "results" / "reward_curve.png").is_file()


def test_the_http_reference_is_the_served_schema(site: Path) -> None:
    """Every operation and schema of ``create_app().openapi()`` is on the reference page."""
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    schema = hooks.served_schema()
    page = (site / "api-reference" / "index.html").read_text()
    for path, item in schema["paths"].items():
        for method in item:
            if method in hooks.METHODS:
                assert f"{method.upper()} {path}" in page, f"{method.upper()} {path} missing"
    for name in schema["components"]["schemas"]:
        assert f"<code>{name}</code>" in page, name
    assert "/v1/rollouts" in schema["paths"] and "SubmitRequest" in schema["components"]["schemas"]


def test_a_broken_link_a_missing_page_and_an_orphan_fail_the_build(broken_build: Build) -> None:
    """The same site with three faults: the build fails and names each."""
    done = broken_build.result()
    assert done.returncode != 0
    for fault in ("no-such-page.md", "missing-page.md", "no-such-anchor", "orphan.md"):
        assert re.search(re.escape(fault), done.stderr), f"the build did not name {fault}:\n{done.stderr}"


def test_the_readme_links_land_on_built_pages(site: Path) -> None:
    """README.md is outside the site: its links into docs/ are checked here, anchors too."""
    links = re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text())
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        if "://" in link:
            continue
        path, _, anchor = link.partition("#")
        assert (ROOT / path).exists(), f"README links to {path}, which does not exist"
        if anchor:
            page = site / path.removeprefix("docs/").removesuffix(".md") / "index.html"
            assert f'id="{anchor}"' in page.read_text(), f"README links to {link}: no such anchor"


README_MAX_LINES = 250  # the front page stays short; the rest is the site's (issue 24)


def test_the_readme_is_a_short_front_page() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


def _readme_commands() -> list[str]:
    """The README's two set-up commands: its 4-space-indented ``python3 -m venv`` lines
    (the test command is the one .ci/run reads and runs)."""
    return [
        line[4:] for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("    python3 -m venv ")
    ]


def test_getting_started_repeats_the_readme_commands_exactly() -> None:
    """docs/getting-started.md shows the quickstart and test commands in ```bash blocks;
    each is the README's line, character for character, in the same order."""
    readme = _readme_commands()
    assert len(readme) == 2 and "rollserve quickstart" in readme[0] and "pytest" in readme[1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "sed -n 's/^    \\(python3 -m venv .venv .*pytest.*\\)$/\\1/p' README.md" in ci, (
        ".ci/run no longer reads the test command from the README's indented line"
    )
    page = (ROOT / "docs" / "getting-started.md").read_text()
    shown = [
        s.code.strip()
        for s in snippets_of(page, "docs/getting-started.md")
        if s.language == "bash" and s.code.startswith("python3 -m venv ")
    ]
    assert shown == readme, f"getting-started.md shows {shown}, README.md has {readme}"
