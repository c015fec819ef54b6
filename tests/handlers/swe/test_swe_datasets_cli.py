"""``rollserve datasets validate`` on swe rows: in host mode (bubblewrap) a row whose
repository no bundle or mirror holds is invalid, and the error names every file
name looked for; in image mode the repository comes from the image."""

from __future__ import annotations

import json
import shutil

from typer.testing import CliRunner

from rollserve.cli import app
from tests.handlers.swe import toy_repo

runner = CliRunner()


def validate(path, *args):
    return runner.invoke(app, ["datasets", "validate", str(path), "-d", "swe", "--json", *args], env={"COLUMNS": "250"})


def test_rows_whose_repository_cannot_be_found_are_invalid_in_host_mode(tmp_path):
    mirrors = tmp_path / "mirrors"
    toy = toy_repo.build(mirrors)  # mirrors/toy__calc-1.bundle
    shutil.copy(mirrors / "toy__calc-1.bundle", mirrors / "toy-misnamed.bundle")
    rows = [
        toy,
        {**toy, "instance_id": "toy__misnamed-1", "repo": "toy/misnamed"},  # misnamed bundle
        {**toy, "instance_id": "elsewhere__x-1", "repo": "elsewhere/x"},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    options = json.dumps({"swe": {"mirrors": [str(mirrors)]}})

    result = validate(path, "--handler-options", options)
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    assert [r["ok"] for r in report["rows"]] == [True, False, False]
    misnamed = report["rows"][1]["error"]
    assert misnamed.startswith("instance.repo: no git bundle or mirror of toy/misnamed")
    for name in (
        "toy__misnamed-1.bundle",
        "toy__misnamed.bundle",
        "toy__misnamed.git",
        "toy/misnamed.git",
        "toy/misnamed",
        str(mirrors),
    ):
        assert name in misnamed, misnamed
    assert "elsewhere__x.bundle" in report["rows"][2]["error"]

    # No mirrors at all: only the bundled swe-mini suite is searched.
    result = validate(path)
    assert result.exit_code == 1 and json.loads(result.output)["summary"]["invalid"] == 3

    # Image mode: the repository is the image's.
    result = validate(path, "--sandbox-runtime", "apptainer")
    assert result.exit_code == 0, result.output


def test_the_bundled_suite_validates_in_host_mode():
    result = runner.invoke(app, ["datasets", "validate", "swe-mini", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["summary"]["ok"] == 15
