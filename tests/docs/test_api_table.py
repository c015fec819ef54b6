"""docs/api.md's hand-written route table against the schema the service serves: every
operation of ``create_app().openapi()`` (ProRL's routes on, the widest surface) has a
row, and every row names a served operation, but for the routes the table says are
left out of ``/openapi.json`` (the harness's side of the gateway, the dashboard's
static files, the schema itself)."""

from __future__ import annotations

import importlib.util
import re
from typing import Any

from tests.docs.site import ROOT

API_PAGE = ROOT / "docs" / "api.md"
METHOD = r"(?:GET|POST|PUT|PATCH|DELETE)"
# `GET /v1/groups/{group_id}?wait=`, `GET/POST /v1/llm/backends`: each method, the path
OPERATION = re.compile(rf"`(?P<methods>{METHOD}(?:/{METHOD})*) (?P<path>/[^`?\s]*)")
# In the table, not in /openapi.json: the harness's side of the gateway (OpenAI's and
# Anthropic's shapes), the dashboard's static files, and the schema itself.
NOT_IN_SCHEMA = re.compile(r"^/v1/gateway/\{\}/|^/ui$|^/openapi\.json$")


def _served_schema() -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    schema: dict[str, Any] = hooks.served_schema()
    return schema


def _normal(path: str) -> str:
    """A path with each parameter's name left out (the table may say ``{id}``)."""
    return re.sub(r"\{[^}]*\}", "{}", path)


def table_operations(text: str) -> set[tuple[str, str]]:
    """(METHOD, path) of every route named in the first column of the page's first table."""
    rows = []
    for line in text.splitlines():
        if line.startswith("| "):
            rows.append(line)
        elif rows:
            break
    found = set()
    for row in rows[2:]:  # the header and its rule first
        first = row.split(" | ", 1)[0]
        for m in OPERATION.finditer(first):
            found |= {(method, _normal(m["path"])) for method in m["methods"].split("/")}
    return found


def served_operations(schema: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (method.upper(), _normal(path))
        for path, item in schema["paths"].items()
        for method in item
        if method.upper() in ("GET", "POST", "PUT", "PATCH", "DELETE")
    }


def test_every_served_operation_has_a_row_and_every_row_is_served() -> None:
    table = table_operations(API_PAGE.read_text())
    served = served_operations(_served_schema())
    missing = sorted(served - table)
    assert not missing, f"docs/api.md's table lacks {missing} (the served schema has them)"
    stale = sorted(op for op in table - served if not NOT_IN_SCHEMA.search(op[1]))
    assert not stale, f"docs/api.md's table names {stale}, which the service does not serve"
    assert ("POST", "/v1/results/rescore") in table and ("GET", "/v1/llm/status") in table


def test_the_table_reader_sees_each_form_a_row_uses() -> None:
    """A row left out of the table is caught: the reader is not vacuous."""
    page = (
        "# API\n\n| route | what |\n| --- | --- |\n"
        "| `GET /v1/rollouts/{id}?wait=` · `DELETE /v1/rollouts/{rollout_id}` | a |\n"
        "| `GET/POST /v1/llm/backends` | b |\n\nText `POST /v1/elsewhere`.\n\n"
        "| route | what |\n| --- | --- |\n| `POST /v1/second-table` | c |\n"
    )
    assert table_operations(page) == {
        ("GET", "/v1/rollouts/{}"),
        ("DELETE", "/v1/rollouts/{}"),
        ("GET", "/v1/llm/backends"),
        ("POST", "/v1/llm/backends"),
    }
    served = {("GET", "/v1/rollouts/{}"), ("POST", "/v1/results/rescore")}
    assert served - table_operations(page) == {("POST", "/v1/results/rescore")}
