"""Backend specs from strings and dicts."""

import importlib.util

import pytest
from pydantic import ValidationError

from rollserve.llm.backends.factory import (
    BackendSpec,
    EmbeddedSpec,
    backend_from_spec,
    parse_backend_spec,
)
from rollserve.llm.backends.vllm import VLLMBackend


def test_url_and_vllm_prefix_give_a_vllm_backend():
    for spec in ("http://10.0.0.5:8000", "vllm=http://10.0.0.5:8000"):
        backend = backend_from_spec(spec)
        assert isinstance(backend, VLLMBackend)
        assert backend.url == "http://10.0.0.5:8000" and backend.name == "vllm@10.0.0.5:8000"


def test_dict_spec():
    backend = backend_from_spec({"kind": "vllm", "url": "http://h:1/", "name": "gpu0", "model": "policy"})
    assert (backend.name, backend.url, backend.model) == ("gpu0", "http://h:1", "policy")


def test_bad_specs_name_the_field():
    with pytest.raises(ValueError, match="kind"):
        backend_from_spec({"kind": "tgi", "url": "http://h:1"})
    with pytest.raises(ValueError, match="kind"):
        backend_from_spec("tgi=http://h:1")
    with pytest.raises(ValueError, match="url"):
        backend_from_spec({"kind": "vllm"})
    with pytest.raises(ValueError, match="url"):
        backend_from_spec({"kind": "sglang"})
    with pytest.raises(ValueError, match="url"):
        backend_from_spec("vllm=localhost:8000")
    with pytest.raises(ValidationError, match="colour"):
        BackendSpec.model_validate({"kind": "vllm", "url": "http://h:1", "colour": "red"})
    with pytest.raises(ValueError, match="spec"):
        parse_backend_spec("localhost")


def test_every_server_kind_from_strings_and_dicts():
    from rollserve.llm.backends.llamacpp_server import LlamaCppServerBackend
    from rollserve.llm.backends.openai_chat import OpenAIChatBackend
    from rollserve.llm.backends.sglang import SGLangBackend

    expected = {
        "sglang": SGLangBackend,
        "llamacpp": LlamaCppServerBackend,
        "openai_chat": OpenAIChatBackend,
        "vllm": VLLMBackend,
    }
    for kind, cls in expected.items():
        backend = backend_from_spec(f"{kind}=http://h:9/")
        assert type(backend) is cls and backend.url == "http://h:9"
        assert backend.name == f"{kind}@h:9" and backend.describe()["kind"] == kind
        assert backend.trainable is (kind != "openai_chat")
    chat = backend_from_spec(
        {"kind": "openai_chat", "url": "https://api.example.com/v1", "model": "gpt-x", "weight": 2}
    )
    assert chat.url == "https://api.example.com" and chat.weight == 2.0
    vllm = backend_from_spec({"kind": "vllm", "url": "http://h:1", "endpoint": "auto"})
    assert vllm.endpoint == "auto"
    with pytest.raises(ValidationError, match="endpoint"):
        BackendSpec.model_validate({"kind": "vllm", "url": "http://h:1", "endpoint": "grpc"})


def test_embedded_string():
    assert parse_backend_spec("embedded") == EmbeddedSpec(kind="embedded")
    assert parse_backend_spec("embedded=/m.gguf").model_path == "/m.gguf"


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="extra 'local' not installed")
def test_embedded_backend_is_built_without_loading_the_model():
    backend = backend_from_spec("embedded")
    assert backend.describe()["kind"] == "embedded" and backend._llm is None


def test_specs_are_a_tagged_union_on_kind():
    from rollserve.llm.backends.factory import (
        BackendSpecError,
        RemoteBackendSpec,
        SGLangSpec,
        VLLMSpec,
        remote_spec,
    )

    assert type(parse_backend_spec({"kind": "sglang", "url": "http://h:1"})) is SGLangSpec
    assert type(parse_backend_spec('{"url": "http://h:1", "endpoint": "auto"}')) is VLLMSpec
    # Each kind takes its own fields only: vLLM's endpoint is no SGLang setting, and an
    # embedded model has no URL.
    for spec, field in [
        ({"kind": "sglang", "url": "http://h:1", "endpoint": "auto"}, "endpoint"),
        ({"kind": "embedded", "url": "http://h:1"}, "url"),
        ({"kind": "llamacpp", "url": "ftp://h"}, "url"),
        ('{"kind": "vllm", "url": ', "spec"),
    ]:
        with pytest.raises(BackendSpecError) as caught:
            parse_backend_spec(spec)
        assert caught.value.field == field, (spec, caught.value)
    with pytest.raises(BackendSpecError, match="command line") as caught:
        remote_spec("embedded")
    assert caught.value.field == "kind"
    schema = RemoteBackendSpec.model_json_schema()
    assert schema["discriminator"]["propertyName"] == "kind"
    assert set(schema["discriminator"]["mapping"]) == {"vllm", "sglang", "llamacpp", "openai_chat"}


async def test_the_api_refuses_a_spec_naming_the_field(tmp_path):
    import httpx

    from rollserve.api.app import create_app
    from rollserve.server import ServerConfig, Service

    service = Service(ServerConfig(state_dir=tmp_path))
    app = create_app(service, manage_lifecycle=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as client:
        for body, field in [
            ({"kind": "sglang", "url": "http://h:1", "endpoint": "auto"}, "endpoint"),
            ({"kind": "embedded"}, "kind"),
            ({"kind": "tgi", "url": "http://h:1"}, "kind"),
            ({"url": "nope"}, "url"),
        ]:
            r = await client.post("/v1/llm/backends", json=body)
            assert r.status_code == 422 and [e["field"] for e in r.json()["errors"]] == [field], r.text
        r = await client.post("/v1/llm/backends", json={"kind": "sglang", "url": "http://h:1"})
        assert r.status_code == 201 and r.json()["backend"]["kind"] == "sglang"
    await service.router.stop()  # closes the backend just added
