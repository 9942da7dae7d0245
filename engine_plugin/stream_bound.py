"""The most a whole spec can do to one token's residual stream, bounded before the request runs
(invariant 8).

A steered token whose stream overflows stores non-finite keys and values, and those reach other
requests through reused KV blocks; one entry can be small while the spec is not (an entry on
``"layers": "all"`` applies once per layer; ``norm`` and ``ablate`` multiply the stream, layer
after layer). So admission bounds the spec as a whole, by the stream's norm ``‖h‖``, walking its
layers in model order as if every entry applied to the same token (windows and gates ignored):

    one entry on a layer     add    ‖h‖ + |s|·‖v‖           norm   (1 + |s|)·‖h‖
                             ablate max(1, |1 − s|)·‖h‖     clamp  ‖h‖ + m
    several on a layer       ‖h‖ + Σ ‖Δ_k‖, each change ‖Δ‖ at most |s|·‖v‖ (add), |s|·‖h‖
                             (norm, ablate) or ‖h‖ + m (clamp)

with ``m`` the distance of a clamp's ``[lo, hi]`` from 0 (a clamp around 0 never grows ``h``).
Each layer is an affine map ``‖h‖ -> f·‖h‖ + a``; composed, the spec maps a stream of norm up to
``natural`` to at most ``F·natural + A``, which must stay within ``cap``:

* ``cap = min(max of the model dtype, 2^64) / 4``: each addend of vLLM's residual pair then stays
  within half the dtype's range, so the next layer's add is finite, and the op's float32
  ``‖h‖²`` cannot overflow;
* ``natural = √cap`` (2^31 in bfloat16 and float32, 128 in float16): what the model's own stream
  is assumed to stay within; a layer's own output is bounded by its weights, whatever its input,
  because every layer normalises what it reads.

A vector a projecting mode (or a gate probe) reads must also keep ``h·v`` finite in float32:
``‖v‖ <= longest``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from hotwire.shared.spec import SpecError

_F32_MAX = float(torch.finfo(torch.float32).max)


@dataclass(frozen=True)
class Change:
    """What one entry can do to ``‖h‖`` on its layer: alone, ``‖h'‖ <= gain·‖h‖ + shift``;
    beside other entries of that layer, its change ``Δ`` has ``‖Δ‖ <= part·‖h‖ + shift``."""

    gain: float
    part: float
    shift: float


def change(mode: str, scale: float, vnorm: float, lo: float | None = None, hi: float | None = None) -> Change:
    """The :class:`Change` of one entry: ``mode`` and ``scale`` as in the spec, ``vnorm`` the norm
    of its vector as the bank holds it, ``lo``/``hi`` a clamp's bounds."""
    s = abs(scale)
    if mode == "add":
        return Change(1.0, 0.0, s * vnorm)
    if mode == "norm":
        return Change(1.0 + s, s, 0.0)
    if mode == "ablate":
        return Change(max(1.0, abs(1.0 - scale)), s, 0.0)
    if mode == "clamp":
        m = max(0.0, lo if lo is not None else 0.0, -hi if hi is not None else 0.0)
        return Change(1.0, 1.0, m)
    raise ValueError(f"unknown mode {mode!r}")


@dataclass(frozen=True)
class StreamBudget:
    cap: float  # the steered stream's norm stays within this
    natural: float  # the model's own stream is assumed to stay within this
    longest: float  # the longest vector a projecting mode or a probe may read

    @classmethod
    def of(cls, dtype: torch.dtype) -> "StreamBudget":
        cap = min(float(torch.finfo(dtype).max), 2.0**64) / 4
        return cls(cap, math.sqrt(cap), _F32_MAX / (4 * cap))

    def bound(self, layers: dict[int, Iterable[Change]]) -> float:
        """The largest ``‖h‖`` the changes (per layer) can give a stream of norm ``natural``."""
        grow, add = 1.0, 0.0  # ‖h‖ <= grow·natural + add, so far
        for layer in sorted(layers):
            changes = list(layers[layer])
            if len(changes) == 1:
                f, a = changes[0].gain, changes[0].shift
            else:
                f, a = 1.0 + sum(c.part for c in changes), sum(c.shift for c in changes)
            grow, add = f * grow, f * add + a
        return grow * self.natural + add

    def check(self, layers: dict[int, Iterable[Change]]) -> None:
        """SpecError ``out_of_range`` unless the changes keep the stream within :attr:`cap`."""
        worst = self.bound(layers)
        if not worst <= self.cap:
            raise SpecError("out_of_range", f"the spec could grow a token's stream to a norm of {worst:.3g} "
                            f"(every entry on every layer counted together), past this model's cap of "
                            f"{self.cap:.3g}")

    def check_length(self, vnorm: float, what: str) -> None:
        """SpecError ``out_of_range`` when ``h·v`` of a vector this long could overflow float32."""
        if not vnorm <= self.longest:
            raise SpecError("out_of_range", f"{what} is too long to project on (norm {vnorm:.3g}, at most "
                            f"{self.longest:.3g})")
