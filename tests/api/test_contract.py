"""The contract over HTTP: /openapi.json documents a body for every route and status,
what the routes answer validates into rollserve.contract's models, and the engine's
typed refusals each come back as their status code."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from rollserve.api.errors import status_of
from rollserve.api.prorl import ProRLConfig
from rollserve.api.routes_ui import STATUS_EVENT_SCHEMA
from rollserve.contract import (
    BackendList,
    CancelResponse,
    GroupView,
    ResultsPage,
    RolloutResult,
    RolloutView,
    RunResponse,
    ServiceStatus,
    SubmitResponse,
)
from rollserve.engine import errors as engine_errors

MATH = {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}}
# Routes that answer something other than JSON, with the content type they declare.
NOT_JSON = {
    ("/v1/events", "get"): "text/event-stream",
    ("/metrics", "get"): "text/plain",
    ("/v1/status/stream", "get"): "text/event-stream",
}
# What they declare, when more than a string: the stream's event (its data a JSON model).
NOT_JSON_SCHEMA = {("/v1/status/stream", "get"): STATUS_EVENT_SCHEMA}


def _resolve(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[-1]]
    return node


async def test_openapi_documents_a_body_for_every_route_and_status(make_api):
    _, client = await make_api(prorl=ProRLConfig(), token="t")
    schema = (await client.get("/openapi.json", headers={"Authorization": "Bearer t"})).json()
    operations = [(path, method, op) for path, ops in schema["paths"].items() for method, op in ops.items()]
    assert len(operations) >= 25
    for path, method, op in operations:
        assert op["responses"], (path, method)
        assert "500" not in op["responses"], (path, method)  # no route answers 500 by design
        for status, response in op["responses"].items():
            where = (path, method, status)
            content = response.get("content")
            assert content, f"{where}: no body documented"
            media = NOT_JSON.get((path, method)) if status.startswith("2") else None
            body = content[media or "application/json"]["schema"]
            if media is not None:
                assert body == NOT_JSON_SCHEMA.get((path, method), {"type": "string"}), where
                continue
            # A named model with its fields (not FastAPI's "any JSON" for a bare dict).
            assert "$ref" in body, f"{where}: {body}"
            model = _resolve(schema, body)
            assert model.get("type") == "object" and model.get("properties"), where
            assert model.get("description"), f"{where}: the model has no description"
            if status.startswith(("4", "5")):
                assert body["$ref"].endswith("/ErrorBody"), where
    # Every model and every field is described: /openapi.json is their documentation.
    # Not rollserve's: pydantic's JsonValue.
    not_ours = {"JsonValue"}
    components = schema["components"]["schemas"]
    assert {"RolloutResult", "Trajectory", "Turn", "Tokens", "Failure", "ToolCall"} <= set(components)
    for name, model in components.items():
        if name in not_ours:
            continue
        undocumented = [
            f for f, prop in model.get("properties", {}).items() if "description" not in prop and "$ref" not in prop
        ]
        assert model.get("description") and not undocumented, (name, undocumented)
    ok = {path: ops for path, ops in schema["paths"].items()}
    refs = {
        (p, m): op["responses"][min(op["responses"])]["content"]["application/json"]["schema"]
        for p, ops in ok.items()
        for m, op in ops.items()
        if (p, m) not in NOT_JSON
    }
    assert refs[("/v1/results", "get")]["$ref"].endswith("/ResultsPage")
    assert refs[("/v1/rollouts/{rollout_id}", "get")]["$ref"].endswith("/RolloutView")
    assert refs[("/process", "post")]["$ref"].endswith("/ProRLResult")


async def test_what_the_routes_answer_validates_into_the_contract(make_api, fake_llm):
    _, client = await make_api([fake_llm.url])
    r = await client.post("/v1/rollouts", json={"tasks": [{**MATH, "n": 2}], "sampling": {"max_tokens": 32}})
    accepted = SubmitResponse.model_validate_json(r.content)
    (group,) = accepted.groups
    view = GroupView.model_validate_json(
        (await client.get(f"/v1/groups/{group.group_id}", params={"wait": 30})).content
    )
    assert view.done and [m.id for m in view.rollouts] == group.rollout_ids
    page = ResultsPage.model_validate_json((await client.get("/v1/results")).content)
    assert sorted(r.seq for r in page.results) == [1, 2] and page.next == 2
    for result in page.results:
        assert isinstance(result, RolloutResult) and result.status == "completed"
        tokens = result.trajectory.tokens
        assert len(tokens.input_ids) == len(tokens.loss_mask) == len(tokens.logprobs) > 0
        assert result.stats.turns == len(result.trajectory.turns) == 1
        assert result.timing.run > 0 and result.failure is None
    one = RolloutView.model_validate_json((await client.get(f"/v1/rollouts/{group.rollout_ids[0]}")).content)
    assert one.done and one.result is not None and one.result.seq == one.seq
    # The same result, whichever route it comes from.
    assert one.result in page.results and one.result == view.rollouts[0].result
    run = RunResponse.model_validate_json(
        (await client.post("/v1/rollouts:run", json={"task": MATH, "wait": 30})).content
    )
    assert [r.reward for r in run.results if r is not None] == [1.0]
    status = ServiceStatus.model_validate_json((await client.get("/v1/status")).content)
    assert status.finished == {"completed": 3} and status.backends[0].url == fake_llm.url
    backends = BackendList.model_validate_json((await client.get("/v1/llm/backends")).content)
    assert [b.name for b in backends.backends] == [b.name for b in status.backends]
    cancel = CancelResponse.model_validate_json((await client.delete(f"/v1/rollouts/{group.rollout_ids[0]}")).content)
    assert cancel.cancelled is False and cancel.status == "completed"


def _engine_errors() -> list[type[engine_errors.EngineError]]:
    found, todo = [], [engine_errors.EngineError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


@pytest.mark.parametrize(
    "cls", [c for c in _engine_errors() if c is not engine_errors.EngineError], ids=lambda c: c.__name__
)
def test_every_engine_error_has_a_status(cls):
    assert 400 <= status_of(cls) < 500, cls  # a TypeError if api.errors.STATUS lacks it


async def test_the_engines_refusals_come_back_as_their_status(make_api):
    _, client = await make_api(max_pending=2)  # no backend: rollouts wait in RUN
    answers = {}
    r = await client.get("/v1/rollouts/nope")
    answers["NotFound"] = (r.status_code, r.json())
    r = await client.post("/v1/rollouts", json={"tasks": [{"data_source": "nope", "instance": {}}]})
    answers["UnknownDataSource"] = (r.status_code, r.json())
    r = await client.post("/v1/rollouts", json={"tasks": [{"data_source": "math", "instance": {"answer": "1"}}]})
    answers["InvalidTask"] = (r.status_code, r.json())
    r = await client.post("/v1/rollouts", json={"tasks": [{**MATH, "n": 3}]})
    answers["BatchTooLarge"] = (r.status_code, r.json())
    assert (await client.post("/v1/rollouts", json={"tasks": [{**MATH, "id": "t", "n": 2}]})).status_code == 202
    r = await client.post("/v1/rollouts", json={"tasks": [{**MATH, "id": "t", "n": 1}]})
    answers["Conflict"] = (r.status_code, r.json())
    r = await client.post("/v1/rollouts", json={"tasks": [MATH]})
    answers["QueueFull"] = (r.status_code, r.json())
    assert int(r.headers["retry-after"]) >= 1
    codes = {name: code for name, (code, _) in answers.items()}
    assert codes == {
        "NotFound": 404,
        "UnknownDataSource": 400,
        "InvalidTask": 422,
        "BatchTooLarge": 422,
        "Conflict": 409,
        "QueueFull": 429,
    }
    assert codes == {cls.__name__: status_of(cls) for cls in _engine_errors() if cls.__name__ in codes}
    fields = {name: [e["field"] for e in body.get("errors", [])] for name, (_, body) in answers.items()}
    assert fields == {
        "NotFound": [],
        "UnknownDataSource": ["tasks[0].data_source"],
        "InvalidTask": ["tasks[0].instance.question"],
        "BatchTooLarge": ["tasks"],
        "Conflict": ["tasks[0].id"],
        "QueueFull": [],
    }
    assert answers["QueueFull"][1]["retry_after"] > 0


def test_every_wait_a_request_can_ask_for_is_bounded_by_default_and_by_limit():
    """A ``timeout``/``wait`` field with no default, or no upper limit, lets one request
    hold the server (``POST /v1/llm/pause {}`` once waited without end)."""
    import rollserve.contract as contract

    unbounded = []
    for name in contract.__all__:
        model = getattr(contract, name)
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        for field_name, field in model.model_fields.items():
            if field_name not in ("timeout", "wait"):
                continue
            limits = [m for m in field.metadata if hasattr(m, "le") or hasattr(m, "lt")]
            if field.default is None or not limits:
                unbounded.append(f"{name}.{field_name}")
    assert unbounded == []
