"""A model behind vLLM's OpenAI server with the hotwire plugin, as ``hotwire vectors sweep``
talks to it (httpx, asynchronous): any deployment that serves the OpenAI API.

What it uses of the server: ``GET /v1/models`` (the served name: the first base model),
``POST /tokenize`` (vLLM's: text, or a chat message through the model's template), and
``POST /v1/completions`` with several token-id prompts in one request (vLLM runs them as one
batch), greedy, with vLLM's ``prompt_logprobs``: for every prompt position after the first, the
log-probabilities of the ``k`` likeliest next tokens and of the prompt's own token (its rank
said). Steering rides ``vllm_xargs.hotwire`` with ``hotwire_strict`` on, so a spec the engine
would run unsteered (an unknown id, an unarmed layer, a scale past the stream bound) is a 400
naming the reason, never a silent unsteered measurement; a steered answer without
``x-hotwire: applied`` (a server without the plugin) is an error too.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import httpx

STEERED = "applied"


class ServedModelError(RuntimeError):
    """The server refused or could not answer; the message says which call and why."""


@dataclass(frozen=True)
class PromptScores:
    """One prompt's answer: ``positions[t]`` maps token id -> ``(logprob, rank)`` for the next
    token after prompt position ``t - 1`` (the top ``k`` and the prompt's own token ``tokens[t]``);
    ``positions[0]`` is None (nothing precedes the first token)."""

    tokens: tuple[int, ...]
    positions: tuple[dict[int, tuple[float, int]] | None, ...]
    text: str

    def own(self, t: int) -> float:
        """The log-probability the model gave the prompt's own token ``t``."""
        entry = self.positions[t]
        if entry is None or self.tokens[t] not in entry:
            raise ServedModelError(f"the server returned no log-probability for prompt token {t}")
        return entry[self.tokens[t]][0]


class ServedModel:
    """``url``: the server's root (``http://host:8000``; a trailing ``/v1`` is dropped)."""

    def __init__(self, url: str, *, model: str | None = None, api_key: str | None = None,
                 timeout: float = 600.0):
        root = url.rstrip("/").removesuffix("/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url, self._model = root, model
        self._http = httpx.AsyncClient(base_url=root, headers=headers, timeout=timeout)

    async def __aenter__(self) -> ServedModel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    async def model(self) -> str:
        """The served model's name: as given, else the first base model the server lists."""
        if self._model is None:
            cards = (await self._call("GET", "/v1/models")).get("data") or []
            bases = [c["id"] for c in cards if isinstance(c, dict) and c.get("parent") is None]
            if not bases:
                raise ServedModelError(f"{self.url}/v1/models lists no model")
            self._model = bases[0]
        return self._model

    async def tokens(self, text: str, *, special: bool = False) -> list[int]:
        """``text`` as the model's tokens; ``special``: with the tokenizer's special tokens."""
        body = {"model": await self.model(), "prompt": text, "add_special_tokens": special}
        return list((await self._call("POST", "/tokenize", json=body))["tokens"])

    async def chat_tokens(self, message: str) -> list[int]:
        """A user message through the model's chat template, up to the assistant's turn."""
        body = {"model": await self.model(), "messages": [{"role": "user", "content": message}],
                "add_generation_prompt": True}
        return list((await self._call("POST", "/tokenize", json=body))["tokens"])

    async def score(self, prompts: list[list[int]], spec: list[dict[str, Any]] | None, *,
                    top_k: int = 0) -> list[PromptScores]:
        """Every prompt's log-probabilities, in one request (the batch), steered by ``spec``."""
        body = {"prompt": prompts, "max_tokens": 1, "prompt_logprobs": top_k}
        return [_scores(prompt, choice) for prompt, choice in
                zip(prompts, await self._complete(body, spec, len(prompts)))]

    async def generate(self, prompts: list[list[int]], spec: list[dict[str, Any]] | None, *,
                       max_tokens: int) -> list[str]:
        """Every prompt's greedy continuation, in one request, steered by ``spec``."""
        body = {"prompt": prompts, "max_tokens": max_tokens}
        return [c.get("text") or "" for c in await self._complete(body, spec, len(prompts))]

    async def _complete(self, body: dict[str, Any], spec: list[dict[str, Any]] | None,
                        n: int) -> list[dict[str, Any]]:
        body = {"model": await self.model(), "temperature": 0.0, **body}
        if spec is not None:
            body["vllm_xargs"] = {"hotwire": json.dumps(spec), "hotwire_strict": True}
        response = await self._post("/v1/completions", body)
        verdict = response.headers.get("x-hotwire")
        if spec is not None and verdict != STEERED:
            raise ServedModelError(f"the server did not steer {json.dumps(spec)}: x-hotwire "
                                   f"{verdict!r} (is the hotwire plugin loaded?)")
        choices = sorted(response.json().get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != n:
            raise ServedModelError(f"asked for {n} completions, the server returned {len(choices)}")
        return choices

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return (await self._request(method, path, **kwargs)).json()

    async def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return await self._request("POST", path, json=body)

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise ServedModelError(f"{method} {self.url}{path}: {e!r}") from None
        if not response.is_success:
            raise ServedModelError(f"{method} {self.url}{path}: HTTP {response.status_code}: "
                                   f"{_message(response)}")
        return response


def _message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
        return str(error.get("message") if isinstance(error, dict) else error or response.text)
    except ValueError:
        return response.text[:500]


def _scores(prompt: list[int], choice: dict[str, Any]) -> PromptScores:
    raw = choice.get("prompt_logprobs")
    if not isinstance(raw, list) or len(raw) != len(prompt):
        raise ServedModelError("the server returned no prompt_logprobs for a prompt (a vLLM "
                               "OpenAI server answers them; set --max-logprobs if it refuses)")
    positions = tuple(None if entry is None else {
        int(token): (_finite(e["logprob"]), int(e["rank"])) for token, e in entry.items()}
        for entry in raw)
    return PromptScores(tuple(prompt), positions, choice.get("text") or "")


def _finite(value: Any) -> float:
    """A logprob; vLLM sends -inf (as a large negative or null) for impossible tokens."""
    number = -math.inf if value is None else float(value)
    return number if math.isfinite(number) else -1e30
