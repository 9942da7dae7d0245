"""The API server's pure decisions: its settings, and which model names are presets."""

from __future__ import annotations

from hotwire.engine_plugin.frontend.models import ServedModels, with_presets
from hotwire.engine_plugin.frontend.presets import Preset
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
