"""hotwire in vLLM's OpenAI API server, end to end, through the official ``openai`` client.

Real processes: ``vllm serve`` with the plugin (multiprocess layout, as deployed) on the tiny
4-layer model with layers 1-2 armed, and ``hotwire control-api`` on its mailbox, holding the
vectors and the presets; reads of the control API need a read token, which the API server is
given. What is checked:

- a spec given as a JSON object or list steers exactly as its JSON string does;
- ``x-hotwire: applied`` / ``unsteered; reason=<code>`` on plain and streaming responses, no
  header when nothing was asked; the engine counts the same reason;
- strict mode (``vllm_xargs.hotwire_strict``) refuses with 400 and the reason, and the engine
  never sees the request (its counters do not move); the reasons are told to clients that send
  the read token (``x-hotwire-token``), the state alone to the others;
- presets as spec items and as model names (``tiny:<preset>``), listed in ``/v1/models`` with the
  base model as parent; an unknown preset model is a 404;
- a second server with ``HOTWIRE_STRICT=1``, startup vectors and a control API that is not there:
  refusals server-wide, the request's ``hotwire_strict: false`` wins, preset requests get 503 and
  every other request is served.

Expected tokens are never hard-coded: each comparison is between real runs.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import openai
import pytest

from conftest import CPU_ENGINE, HIDDEN, requires_vllm
from control_harness import json_body
from hotwire.shared.wire import encode_safetensors
from hotwire.shared.mailbox import HEARTBEAT_S
from servers import ControlApi, VllmServer, free_port, logs_on_failure

pytestmark = [requires_vllm, pytest.mark.vllm, pytest.mark.slow]

TOKEN, READ_TOKEN = "frontend-secret", "frontend-reader"
N = 8
PROMPT = "The quick brown fox"
CHAT = [{"role": "user", "content": "Once upon a time, a small robot"}]
ARMED = "1-2"  # layers 0 and 3 stay unarmed
A = {"id": "fe-a", "layer": 2, "scale": 0.25}
B = {"id": "fe-b", "layer": 1, "scale": 0.25}


def vec(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(HIDDEN) * 4).astype(np.float32)


def oai(engine: VllmServer, read_token: str | None = None) -> openai.OpenAI:
    """A client of ``engine``; with ``read_token``, told why a spec would run unsteered."""
    return openai.OpenAI(base_url=f"{engine.url}/v1", api_key="unused", max_retries=0, timeout=300,
                         default_headers={"x-hotwire-token": read_token} if read_token else None)


def extra(steer: Any = None, **xargs: Any) -> dict[str, Any]:
    """``extra_body``: greedy-safe flags and, when given, ``vllm_xargs``."""
    body: dict[str, Any] = {"ignore_eos": True, "return_token_ids": True}
    if steer is not None:
        xargs["hotwire"] = steer
    if xargs:
        body["vllm_xargs"] = xargs
    return body


def complete(client: openai.OpenAI, steer: Any = None, model: str = "tiny",
             **xargs: Any) -> tuple[list[int], str | None]:
    """Greedy completion tokens and the ``x-hotwire`` header."""
    raw = client.completions.with_raw_response.create(
        model=model, prompt=PROMPT, max_tokens=N, temperature=0, extra_body=extra(steer, **xargs))
    choice = raw.parse().choices[0]
    assert len(choice.token_ids) == N
    return choice.token_ids, raw.headers.get("x-hotwire")


def chat(client: openai.OpenAI, steer: Any = None, model: str = "tiny",
         **xargs: Any) -> tuple[list[int], str | None]:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=CHAT, max_tokens=N, temperature=0, extra_body=extra(steer, **xargs))
    choice = raw.parse().choices[0]
    assert len(choice.token_ids) == N
    return choice.token_ids, raw.headers.get("x-hotwire")


def refused(call, *args: Any, **kwargs: Any) -> tuple[int, dict[str, Any], str | None]:
    """``(status, error object, x-hotwire)`` of a call the server refuses."""
    with pytest.raises(openai.APIStatusError) as info:
        call(*args, **kwargs)
    response = info.value.response
    return response.status_code, response.json()["error"], response.headers.get("x-hotwire")


@pytest.fixture(scope="module")
def rig(request, tmp_path_factory, tiny_model):
    """The server pair: the control API first (the API server is told its address), then vLLM."""
    tmp = tmp_path_factory.mktemp("frontend")
    engine = VllmServer(tmp / "engine", tiny_model, CPU_ENGINE, HOTWIRE_LAYERS=ARMED,
                        HOTWIRE_READ_TOKEN=READ_TOKEN)
    control = ControlApi(tmp / "control", engine.mailbox, token=TOKEN, HOTWIRE_READ_TOKEN=READ_TOKEN)
    try:
        with logs_on_failure(request, engine, control):
            control.start(ready=False)
            engine.env["HOTWIRE_CONTROL_URL"] = control.url
            engine.start()
            control.wait_http("/readyz", 120)
            for vector_id, seed in (("fe-a", 1), ("fe-b", 2)):
                r = control.api().post("/steer/vectors", json=json_body(vector_id, vec(seed)))
                assert r.status_code == 201 and r.json()["resident"], r.text
            yield engine, control
    finally:
        control.stop()
        engine.stop()


@pytest.fixture(scope="module")
def client(rig) -> openai.OpenAI:
    return oai(rig[0], READ_TOKEN)


def counters(control: ControlApi) -> dict[str, int]:
    """The engine's request counters (steered, and unsteered by reason), once the engine's
    heartbeat has published what the requests so far counted."""
    time.sleep(2 * HEARTBEAT_S)
    r = control.api().get("/steer/slots")
    assert r.status_code == 200, r.text
    return {k: v for k, v in r.json()["engine"]["counters"].items()
            if k == "steered_requests" or k.startswith("unsteered_")}


def add_preset(control: ControlApi, name: str, entries: list[dict[str, Any]]) -> None:
    r = control.api().post("/steer/presets", json={"name": name, "entries": entries})
    assert r.status_code == 201, r.text


# 1. Specs as JSON objects and lists --------------------------------------------------------------

def test_object_and_list_specs_steer_like_the_string(client):
    plain, header = complete(client)
    assert header is None  # asked for nothing: told nothing
    by_text, header = complete(client, json.dumps(A))
    assert by_text != plain and header == "applied"
    assert complete(client, A) == (by_text, "applied")  # a dict: vLLM alone refuses it with a 400
    assert complete(client, [A]) == (by_text, "applied")
    both = complete(client, json.dumps([A, B]))
    assert both[0] not in (plain, by_text)
    assert complete(client, [A, B]) == both

    chat_plain, _ = chat(client)
    chat_text = chat(client, json.dumps([A]))
    assert chat_text[0] != chat_plain and chat_text[1] == "applied"
    assert chat(client, [A]) == chat_text  # a list of objects: vLLM alone refuses it too
    assert chat(client, A) == chat_text


# 2. The header: applied or unsteered, and why -----------------------------------------------------

UNSTEERED = {  # reason -> a spec the engine runs unsteered for that reason
    "malformed": "not json {",
    "unknown_id": {"id": "fe-nobody", "layer": 2},
    "unarmed_layer": {"id": "fe-a", "layer": 3},
    "out_of_range": {"id": "fe-a", "layer": 2, "scale": 1e37},
    "too_many_entries": [A] * 5,  # HOTWIRE_ENTRIES=4 per layer
}


@pytest.mark.parametrize("reason", UNSTEERED)
def test_header_names_the_reason_the_engine_counts(rig, client, reason):
    engine, control = rig
    plain, _ = complete(client)
    before = counters(control)[f"unsteered_{reason}"]
    assert complete(client, UNSTEERED[reason]) == (plain, f"unsteered; reason={reason}")
    assert counters(control)[f"unsteered_{reason}"] == before + 1


def streamed(client: openai.OpenAI, steer: Any, chat: bool = False) -> tuple[str, str | None]:
    """A streamed answer's text and its ``x-hotwire`` header (sent before the first token)."""
    call, what = ((client.chat.completions, {"messages": CHAT}) if chat else
                  (client.completions, {"prompt": PROMPT}))
    with call.with_streaming_response.create(model="tiny", max_tokens=N, temperature=0, stream=True,
                                             extra_body=extra(steer), **what) as r:
        header = r.headers.get("x-hotwire")
        pieces = [(c.choices[0].delta.content if chat else c.choices[0].text) or ""
                  for c in r.parse() if c.choices]
    return "".join(pieces), header


def test_header_on_streaming_responses(client):
    steered = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=N, temperature=0,
                                        extra_body=extra(A)).choices[0].text
    assert streamed(client, A) == (steered, "applied")
    assert streamed(client, None)[1] is None
    assert streamed(client, {"id": "fe-a", "layer": 0})[1] == "unsteered; reason=unarmed_layer"
    assert streamed(client, [A], chat=True)[1] == "applied"
    assert streamed(client, [{"id": "fe-nobody", "layer": 1}], chat=True)[1] == \
        "unsteered; reason=unknown_id"


# 3. Strict mode, per request ----------------------------------------------------------------------

@pytest.mark.parametrize("reason", UNSTEERED)
def test_strict_request_is_refused_before_the_engine_sees_it(rig, client, reason):
    engine, control = rig
    before = counters(control)
    status, error, header = refused(complete, client, UNSTEERED[reason], hotwire_strict=True)
    assert (status, header) == (400, f"unsteered; reason={reason}")
    assert f"({reason})" in error["message"] and error["param"] == "vllm_xargs.hotwire"
    assert refused(chat, client, UNSTEERED[reason], hotwire_strict=True)[0] == 400
    assert counters(control) == before  # nothing was computed, nothing counted


def test_a_client_without_the_read_token_is_told_the_state_alone(rig, client):
    anonymous = oai(rig[0])
    plain, _ = complete(client)
    assert complete(anonymous, UNSTEERED["unknown_id"]) == (plain, "unsteered")
    status, error, header = refused(complete, anonymous, UNSTEERED["out_of_range"],
                                    hotwire_strict=True)
    assert (status, header) == (400, "unsteered")
    assert "out_of_range" not in error["message"] and "fe-a" not in error["message"]
    assert complete(anonymous, A) == complete(client, A)  # steered alike: the state is "applied"


def test_strict_request_that_steers_is_served(client):
    steered = complete(client, A)
    assert complete(client, A, hotwire_strict=True) == steered
    assert complete(client, hotwire_strict=True) == (complete(client)[0], None)  # nothing asked
    status, error, _ = refused(complete, client, A, hotwire_strict="yes")
    assert status == 400 and error["param"] == "vllm_xargs.hotwire_strict"


def test_a_vector_registered_or_removed_changes_the_verdict_at_once(rig, client):
    engine, control = rig
    spec = {"id": "fe-late", "layer": 1, "scale": 0.25}
    assert refused(complete, client, spec, hotwire_strict=True)[2] == "unsteered; reason=unknown_id"
    r = control.api().post("/steer/vectors", json=json_body("fe-late", vec(3)))
    assert r.status_code == 201 and r.json()["resident"], r.text
    steered, header = complete(client, spec, hotwire_strict=True)
    assert header == "applied" and steered != complete(client)[0]
    assert control.api().delete("/steer/vectors/fe-late").status_code == 204
    assert refused(complete, client, spec, hotwire_strict=True)[2] == "unsteered; reason=unknown_id"


# 4. Presets ---------------------------------------------------------------------------------------

def test_preset_items_expand_into_their_entries(rig, client):
    engine, control = rig
    add_preset(control, "fe-mood", [A])  # made now, never asked for before: found at once
    explicit = complete(client, [A])
    assert complete(client, [{"preset": "fe-mood"}]) == explicit
    assert complete(client, json.dumps({"preset": "fe-mood"})) == explicit
    assert complete(client, [{"preset": "fe-mood"}, B]) == complete(client, [A, B])
    assert chat(client, {"preset": "fe-mood"}) == chat(client, A)


def test_unknown_preset_item_runs_unsteered_or_is_refused(client):
    plain, _ = complete(client)
    assert complete(client, [{"preset": "fe-none"}, A]) == (plain, "unsteered; reason=preset_unresolved")
    status, error, header = refused(complete, client, {"preset": "fe-none"}, hotwire_strict=True)
    assert (status, header) == (400, "unsteered; reason=preset_unresolved")
    assert "fe-none" in error["message"]


def test_presets_as_model_names(rig, client):
    engine, control = rig
    add_preset(control, "fe-pair", [A, B])
    assert complete(client, model="tiny:fe-pair") == complete(client, [A, B])
    assert chat(client, model="tiny:fe-pair") == chat(client, [A, B])
    # A model preset and the request's own entries add up.
    add_preset(control, "fe-one", [A])
    assert complete(client, [B], model="tiny:fe-one") == complete(client, [A, B])
    assert complete(client, model="tiny:fe-one", hotwire_strict=True)[1] == "applied"


def test_models_lists_presets_under_the_base_model(rig, client):
    engine, control = rig
    add_preset(control, "fe-listed", [B])
    cards = {m.id: m for m in client.models.list().data}
    base = cards["tiny"]
    assert base.parent is None
    card = cards["tiny:fe-listed"]
    assert (card.parent, card.root, card.max_model_len) == ("tiny", base.root, base.max_model_len)
    listed = control.api().get("/steer/presets").json()["presets"]
    assert {f"tiny:{p['name']}" for p in listed} == {i for i in cards if i != "tiny"}


def test_unknown_preset_model_is_a_404_like_an_unknown_adapter(client):
    status, error, header = refused(complete, client, model="tiny:fe-absent")
    assert (status, error["type"], error["param"]) == (404, "NotFoundError", "model")
    assert error["message"] == "The model `tiny:fe-absent` does not exist."  # as vLLM words it
    assert header == "unsteered; reason=preset_unresolved"  # hotwire's answer, not vLLM's
    status, theirs, _ = refused(complete, client, model="no-such-model")  # vLLM's own answer
    assert (status, {**theirs, "message": ""}) == (404, {**error, "message": ""})
    assert theirs["message"].startswith("The model `no-such-model` does not exist.")
    with pytest.raises(openai.NotFoundError):
        chat(client, model="tiny:fe-absent")


# 5. A strict server, without its control API ------------------------------------------------------

@pytest.fixture(scope="module")
def strict(request, tmp_path_factory, tiny_model):
    """``HOTWIRE_STRICT=1``, one startup vector, and a control API address nobody listens on."""
    tmp = tmp_path_factory.mktemp("frontend-strict")
    vectors = tmp / "vectors"
    vectors.mkdir()
    (vectors / "fe-a.safetensors").write_bytes(encode_safetensors(vec(1)))
    engine = VllmServer(tmp / "engine", tiny_model, CPU_ENGINE, HOTWIRE_LAYERS=ARMED,
                        HOTWIRE_STRICT="1", HOTWIRE_VECTORS=str(vectors),
                        HOTWIRE_CONTROL_URL=f"http://127.0.0.1:{free_port()}")
    try:
        with logs_on_failure(request, engine):
            yield oai(engine.start())
    finally:
        engine.stop()


def test_strict_server_refuses_what_would_run_unsteered(strict, client):
    plain, header = complete(strict)
    assert header is None
    steered = complete(strict, A)
    assert steered[1] == "applied" and steered[0] != plain
    assert complete(client, A) == steered  # same vector, same tokens as the first server
    for reason, spec in UNSTEERED.items():
        status, error, header = refused(complete, strict, spec)
        assert (status, header) == (400, f"unsteered; reason={reason}"), error
    # The request's own choice wins over the server's.
    assert complete(strict, UNSTEERED["unknown_id"], hotwire_strict=False) == \
        (plain, "unsteered; reason=unknown_id")


def test_presets_fail_clearly_when_the_control_api_is_unreachable(strict):
    status, error, header = refused(complete, strict, model="tiny:fe-mood")
    assert (status, header) == (503, "unsteered; reason=presets_unavailable")
    assert "unreachable" in error["message"]
    assert refused(complete, strict, [{"preset": "fe-mood"}])[0] == 503
    assert [m.id for m in strict.models.list().data] == ["tiny"]  # listed without presets
    assert complete(strict, A)[1] == "applied"  # everything else is served
