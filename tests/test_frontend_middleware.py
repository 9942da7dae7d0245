"""The API server's middleware against a real control API and a real engine mailbox, without vLLM.

:class:`HotwireMiddleware` wraps a stand-in for vLLM's OpenAI app that answers with what it was
handed, and is driven over ASGI; its presets come from a control API served by uvicorn (which
counts the requests it receives), its verdicts from the mailbox an :class:`EnginePump` keeps.
What is checked: what a request can make the control API do (one lookup per unknown preset name
per TTL, none for a spec the engine refuses anyway), presets that would expand past the
engine's limits refused before the text is built, and the reasons told only to callers holding
the read token when one is configured.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from hotwire.engine_plugin.frontend.middleware import HotwireMiddleware
from hotwire.shared.spec import MAX_ENTRIES, MAX_SPEC_CHARS, SpecError, parse_spec

from control_harness import FP, exact_vector

CALM = {"id": "calm", "layer": 1, "scale": 0.5}
READ_TOKEN = "frontend-reader"
ENV = ("HOTWIRE_STRICT", "HOTWIRE_READ_TOKEN", "HOTWIRE_PRESETS_TTL_S", "HOTWIRE_LAYERS",
       "HOTWIRE_PROJECTION_LAYERS", "HOTWIRE_ENTRIES")


def vllm_stand_in() -> FastAPI:
    """What the middleware sits in front of: answers with the spec and headers it was handed."""
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict[str, Any]:
        body = await request.json()
        return {"hotwire": (body.get("vllm_xargs") or {}).get("hotwire"), "model": body.get("model"),
                "headers": sorted(request.headers)}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "tiny", "root": "/models/tiny", "parent": None}]}

    return app


@pytest.fixture
def frontend(rig, monkeypatch):
    """``frontend(**env)``: a middleware built from that environment (the rig's mailbox and
    control API unless it says otherwise), as vLLM's API server builds it."""
    assert rig.push("calm", exact_vector(FP.hidden)).json()["resident"]
    for name in ENV:
        monkeypatch.delenv(name, raising=False)

    def make(**env: str) -> HotwireMiddleware:
        env = {"HOTWIRE_MAILBOX": str(rig.settings.mailbox), "HOTWIRE_CONTROL_URL": rig.server.url,
               **env}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return HotwireMiddleware(vllm_stand_in(), frozenset({"/v1/completions"}))

    return make


def run(middleware: HotwireMiddleware, calls) -> Any:
    """``await calls(client)`` with an HTTP client on ``middleware``, in an event loop of its own."""
    async def main() -> Any:
        transport = httpx.ASGITransport(app=middleware)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            return await calls(client)

    return asyncio.run(main())


async def post(client: httpx.AsyncClient, spec: Any = None, headers: dict[str, str] | None = None,
               model: str = "tiny", **xargs: Any) -> httpx.Response:
    if spec is not None:
        xargs["hotwire"] = spec
    body = {"model": model, "prompt": "hi", **({"vllm_xargs": xargs} if xargs else {})}
    return await client.post("/v1/completions", json=body, headers=headers)


def lookups(rig) -> dict[str, int]:
    """GETs the control API answered under ``/steer/presets``, by path."""
    return {path: n for (method, path), n in rig.server.requests.items()
            if method == "GET" and path.startswith("/steer/presets")}


def refused_by_engine(text: str) -> str:
    """The reason the engine's parser refuses ``text`` for."""
    with pytest.raises(SpecError) as refused:
        parse_spec(text)
    return refused.value.reason


def store(rig, name: str, entries: list[dict[str, Any]]) -> None:
    r = rig.http.post("/steer/presets", json={"name": name, "entries": entries})
    assert r.status_code == 201, r.text


# What a request can make the control API do --------------------------------------------------


def test_a_spec_of_more_items_than_the_engine_takes_looks_up_no_preset(rig, frontend):
    many = [{"preset": f"p{i}"} for i in range(100)]
    seventeen = json.dumps(many[:MAX_ENTRIES + 1])

    async def calls(client):
        return [await post(client, many), await post(client, seventeen),
                await post(client, many, hotwire_strict=True)]

    lenient, text, strict = run(frontend(), calls)
    for r in (lenient, text):
        assert r.status_code == 200, r.text
        assert r.headers["x-hotwire"] == "unsteered; reason=too_many_entries"
        assert refused_by_engine(r.json()["hotwire"]) == "too_many_entries"  # the engine agrees
    assert strict.status_code == 400
    assert strict.headers["x-hotwire"] == "unsteered; reason=too_many_entries"
    assert "(too_many_entries)" in strict.json()["error"]["message"]
    assert lookups(rig) == {}


def test_an_unknown_preset_name_is_asked_for_once_per_ttl(rig, frontend):
    async def calls(client):
        answers = [await post(client, [{"preset": "nope"}, CALM]) for _ in range(3)]
        answers += await asyncio.gather(*(post(client, {"preset": "twice"}) for _ in range(4)))
        answers.append(await post(client, [{"preset": f"u{i}"} for i in range(MAX_ENTRIES)]))
        answers.append(await post(client, {"preset": "no name at all"}))
        return answers

    for r in run(frontend(HOTWIRE_PRESETS_TTL_S="60"), calls):
        assert r.headers["x-hotwire"] == "unsteered; reason=preset_unresolved", r.text
    # One GET per name, the concurrent requests sharing theirs; a request stops at its first
    # unknown name; a name no preset can have is not asked for.
    assert lookups(rig) == {"/steer/presets/nope": 1, "/steer/presets/twice": 1,
                            "/steer/presets/u0": 1}

    rig.server.requests.clear()
    store(rig, "nope", [CALM])
    again = run(frontend(HOTWIRE_PRESETS_TTL_S="0"), lambda client: post(client, {"preset": "nope"}))
    assert again.headers["x-hotwire"] == "applied"  # asked anew once the TTL is over
    assert lookups(rig) == {"/steer/presets/nope": 1}


def test_presets_that_would_expand_past_the_spec_limits_are_refused_unbuilt(rig, frontend):
    wide = [{"id": "calm", "layers": list(range(200 + i)), "scale": 0.5} for i in range(MAX_ENTRIES)]
    store(rig, "wide", wide)  # within a spec's limits on its own
    store(rig, "nine", [{**CALM, "scale": 0.01 * i} for i in range(9)])

    async def calls(client):
        return [await post(client, [{"preset": "wide"}] * MAX_ENTRIES),
                await post(client, [{"preset": "nine"}, {"preset": "nine"}]),
                await post(client, [{"preset": "nine"}, {"preset": "nine"}], model="tiny:nine"),
                await post(client, [{"preset": "wide"}, {"preset": "wide"}], hotwire_strict=True)]

    large, many, with_model, strict = run(frontend(), calls)
    for r, reason in ((large, "too_large"), (many, "too_many_entries"),
                      (with_model, "too_many_entries")):
        assert r.status_code == 200, r.text
        assert r.headers["x-hotwire"] == f"unsteered; reason={reason}"
        sent = r.json()["hotwire"]
        assert len(sent) <= MAX_SPEC_CHARS + 2 and '"calm"' not in sent  # not the expansion
        assert refused_by_engine(sent) == reason  # the engine counts what the header says
    assert with_model.json()["model"] == "tiny"
    assert strict.status_code == 400 and "(too_large)" in strict.json()["error"]["message"]
    assert lookups(rig) == {"/steer/presets/wide": 1, "/steer/presets/nine": 1}


# The reasons, for callers who may read the catalog --------------------------------------------


WHY = {"unknown_id": {"id": "nobody", "layer": 1},
       "out_of_range": {**CALM, "scale": 1e37},
       "unarmed_layer": {**CALM, "layer": 9}}


def test_with_a_read_token_only_a_caller_that_sends_it_is_told_why(rig, frontend):
    token = {"x-hotwire-token": READ_TOKEN}

    async def calls(client):
        answers: dict[str, list[httpx.Response]] = {}
        for reason, spec in WHY.items():
            answers[reason] = [await post(client, spec), await post(client, spec, hotwire_strict=True),
                               await post(client, spec, {"x-hotwire-token": "wrong"}, hotwire_strict=True),
                               await post(client, spec, token), await post(client, spec, token,
                                                                           hotwire_strict=True)]
        return answers, await post(client, CALM), await post(client, CALM, token)

    answers, applied, applied_reader = run(frontend(HOTWIRE_READ_TOKEN=READ_TOKEN), calls)
    for reason, (plain, strict, wrong, reader, reader_strict) in answers.items():
        assert plain.headers["x-hotwire"] == "unsteered"
        for r in (strict, wrong):
            assert (r.status_code, r.headers["x-hotwire"]) == (400, "unsteered")
            message = r.json()["error"]["message"]
            assert "would run unsteered" in message and "x-hotwire-token" in message
            assert reason not in message and "nobody" not in message and "calm" not in message
        assert reader.headers["x-hotwire"] == f"unsteered; reason={reason}"
        assert reader_strict.status_code == 400
        assert f"({reason})" in reader_strict.json()["error"]["message"]
    assert applied.headers["x-hotwire"] == applied_reader.headers["x-hotwire"] == "applied"
    assert "x-hotwire-token" not in applied_reader.json()["headers"]  # goes no further


def test_with_a_read_token_an_unreachable_control_api_is_not_described(frontend):
    down = frontend(HOTWIRE_READ_TOKEN=READ_TOKEN, HOTWIRE_CONTROL_URL="http://127.0.0.1:9")
    r = run(down, lambda client: post(client, {"preset": "calm"}))
    assert (r.status_code, r.headers["x-hotwire"]) == (503, "unsteered")
    assert "127.0.0.1" not in r.json()["error"]["message"]
    told = run(down, lambda client: post(client, {"preset": "calm"}, {"x-hotwire-token": READ_TOKEN}))
    assert told.headers["x-hotwire"] == "unsteered; reason=presets_unavailable"
    assert "127.0.0.1:9" in told.json()["error"]["message"]


def test_without_a_read_token_everyone_is_told_why(frontend):
    async def calls(client):
        return {reason: await post(client, spec, hotwire_strict=True) for reason, spec in WHY.items()}

    for reason, r in run(frontend(), calls).items():
        assert r.headers["x-hotwire"] == f"unsteered; reason={reason}"
        assert f"({reason})" in r.json()["error"]["message"]
