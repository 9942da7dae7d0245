"""The API server's pure decisions: its settings, which routes it works on, and which model
names are presets."""

from __future__ import annotations

from fastapi import FastAPI, Request
from pydantic import BaseModel

from hotwire.engine_plugin.frontend.models import ServedModels, with_presets
from hotwire.engine_plugin.frontend.preset_source import Preset
from hotwire.engine_plugin.frontend.routes import steerable_paths
from hotwire.engine_plugin.frontend.settings import FrontendSettings

LISTING = {"object": "list", "data": [
    {"id": "tiny", "root": "/models/tiny", "parent": None, "max_model_len": 512, "created": 1},
    {"id": "tiny:ft", "root": "/adapters/ft", "parent": "tiny", "created": 2},  # a LoRA adapter
]}


def test_strict_is_on_unless_it_says_off():
    assert FrontendSettings.from_env({}).strict is False
    for off in ("", "0", "false", "Off", " no "):
        assert FrontendSettings.from_env({"HOTWIRE_STRICT": off}).strict is False, off
    for on in ("1", "true", "ON", "ture"):  # a typo fails closed
        assert FrontendSettings.from_env({"HOTWIRE_STRICT": on}).strict is True, on


def test_settings_never_fail():
    s = FrontendSettings.from_env({"HOTWIRE_PRESETS_TTL_S": "soon", "HOTWIRE_CONTROL_URL": " http://c:8001/ "})
    assert (s.presets_ttl_s, s.control_url) == (5.0, "http://c:8001")
    assert FrontendSettings.from_env({"HOTWIRE_PRESETS_TTL_S": "-1"}).presets_ttl_s == 5.0
    assert FrontendSettings.from_env({"HOTWIRE_PRESETS_TTL_S": "0"}).presets_ttl_s == 0.0
    assert FrontendSettings.from_env({"HOTWIRE_CONTROL_URL": ""}).control_url is None


def test_a_name_vllm_serves_is_never_a_preset():
    served = ServedModels.of(LISTING)
    assert served.preset_of("tiny:calm") == ("tiny", "calm")
    assert served.preset_of("tiny:ft") is None  # the adapter's own name
    assert served.preset_of("tiny") is None
    assert served.preset_of("other:calm") is None  # not a served base model
    assert served.preset_of("tiny:ft:calm") is None  # presets hang off base models only
    assert served.preset_of("tiny:") is None


def test_presets_are_listed_under_each_base_model():
    listed = with_presets(LISTING, [Preset("calm", ({"id": "v", "layer": 1},), 7)])
    cards = {c["id"]: c for c in listed["data"]}
    assert set(cards) == {"tiny", "tiny:ft", "tiny:calm"}
    assert cards["tiny:calm"] == {**cards["tiny"], "id": "tiny:calm", "parent": "tiny", "created": 7}


class WithXargs(BaseModel):
    prompt: str
    vllm_xargs: dict[str, str] | None = None


class WithoutXargs(BaseModel):  # vLLM 0.25's Anthropic request: a spec there would be dropped
    prompt: str


def test_only_routes_whose_request_carries_vllm_xargs_are_worked_on():
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(request: WithXargs, raw_request: Request):
        return {}

    @app.post("/v1/chat/completions")
    async def chat(request: WithXargs | None, raw_request: Request):
        return {}

    @app.post("/v1/messages")
    async def messages(request: WithoutXargs, raw_request: Request):
        return {}

    @app.get("/v1/responses")  # not a POST
    async def responses(request: Request):
        return {}

    assert steerable_paths(app) == {"/v1/completions", "/v1/chat/completions"}
