"""Build hooks for the docs site (mkdocs.yml names this file under ``hooks:``).

- ``api-reference.md`` is generated at build time from the schema the service serves
  (``create_app(...).openapi()``, the same object ``GET /openapi.json`` answers), so the
  HTTP reference is never retyped and cannot drift from the code.
- ``benchmarks/results/*`` (the JSONs the benchmark scripts write, and the reward-curve
  image) are published with the site, so pages link to the numbers they quote.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
METHODS = ("get", "post", "put", "patch", "delete")


def served_schema() -> dict[str, Any]:
    """The OpenAPI schema of a service with ProRL's routes on (the widest surface)."""
    from rollserve.api.app import create_app
    from rollserve.api.prorl import ProRLConfig
    from rollserve.server import ServerConfig, Service

    with tempfile.TemporaryDirectory(prefix="rollserve-docs-") as state:
        app = create_app(Service(ServerConfig(state_dir=Path(state))),
                         manage_lifecycle=False, prorl=ProRLConfig())
        return app.openapi()


def _ref_name(schema: dict[str, Any]) -> str:
    if "$ref" in schema:  # a link to the schema's own heading below
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#{name.lower()})"
    if schema.get("type") == "array" and "items" in schema:
        return "list of " + _ref_name(schema["items"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_ref_name(s) for s in schema[key])
    return "`" + str(schema.get("type", "object")) + "`"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _operation(method: str, path: str, op: dict[str, Any]) -> list[str]:
    out = [f"### `{method.upper()} {path}`", ""]
    if op.get("summary"):
        out += [_cell(op["summary"]), ""]
    if op.get("description"):
        out += [op["description"].strip(), ""]
    params = op.get("parameters", [])
    if params:
        out += ["| parameter | in | type | required | description |", "| --- | --- | --- | --- | --- |"]
        out += [f"| `{p['name']}` | {p['in']} | {_ref_name(p.get('schema', {}))} | "
                f"{'yes' if p.get('required') else 'no'} | {_cell(p.get('description', ''))} |"
                for p in params]
        out.append("")
    body = op.get("requestBody", {}).get("content", {})
    for media, content in body.items():
        out += [f"Request body ({media}): {_ref_name(content.get('schema', {}))}", ""]
    responses = op.get("responses", {})
    if responses:
        out += ["| status | meaning | body |", "| --- | --- | --- |"]
        for status, resp in responses.items():
            schemas = [c.get("schema", {}) for c in resp.get("content", {}).values()]
            shape = ", ".join(_ref_name(s) for s in schemas if s) or "—"
            out.append(f"| {status} | {_cell(resp.get('description', ''))} | {shape} |")
        out.append("")
    return out


def _schemas(components: dict[str, Any]) -> list[str]:
    out = ["## Schemas", ""]
    for name, schema in sorted(components.get("schemas", {}).items()):
        out += [f"### `{name}`", ""]
        if schema.get("description"):
            out += [_cell(schema["description"]), ""]
        props = schema.get("properties", {})
        if props:
            required = set(schema.get("required", []))
            out += ["| field | type | required | description |", "| --- | --- | --- | --- |"]
            out += [f"| `{field}` | {_ref_name(spec)} | {'yes' if field in required else 'no'} | "
                    f"{_cell(spec.get('description', ''))} |" for field, spec in props.items()]
            out.append("")
        elif "enum" in schema:
            out += ["One of: " + ", ".join(f"`{v}`" for v in schema["enum"]), ""]
    return out


def render_reference(schema: dict[str, Any]) -> str:
    """The HTTP reference page's Markdown: every operation by tag, then every schema."""
    info = schema.get("info", {})
    out = ["# HTTP API reference", "",
           f"Generated when the site is built from the schema rollserve {info.get('version', '')} "
           "serves at `GET /openapi.json` (with ProRL's routes on, `rollserve serve --prorl`). "
           "A running server also serves it browsable at `/docs` and `/redoc`. "
           "What the routes are for, and how a trainer uses them: [API](api.md).", ""]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in schema.get("paths", {}).items():
        for method in METHODS:
            if method in item:
                tag = (item[method].get("tags") or ["other"])[0]
                by_tag.setdefault(tag, []).append((method, path, item[method]))
    for tag, ops in by_tag.items():
        out += [f"## {tag}", ""]
        for method, path, op in ops:
            out += _operation(method, path, op)
    out += _schemas(schema.get("components", {}))
    return "\n".join(out) + "\n"


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "api-reference.md", content=render_reference(served_schema())))
    for path in sorted(RESULTS.iterdir()):
        if path.is_file():
            files.append(File.generated(config, f"benchmarks/results/{path.name}",
                                        abs_src_path=str(path)))
    return files


def schema_json() -> str:  # for a reader who wants the raw schema: python docs/hooks.py
    return json.dumps(served_schema(), indent=2)


if __name__ == "__main__":
    print(schema_json())
