"""What an entry does to the residual stream: its mode, as route-table words and as torch.

For the tokens an entry selects, with ``h`` the stream at the end of layer L (the layer's output
plus the residual), ``v`` the entry's vector, ``v̂ = v / ‖v‖`` and ``s`` its scale, in float32::

    add     h += s · v
    norm    h += s · ‖h‖ · v̂                      s: a fraction of the stream's own norm
    ablate  h -= s · (h·v̂) · v̂                    s = 1 removes the direction
    clamp   h += (clip(h·v̂, lo, hi) − h·v̂) · v̂    lo = hi = c pins the projection to c

Every mode is ``h += c · v`` with a per-token coefficient ``c``; the route table carries what
``c`` needs (words 3–6 of an entry, :data:`WORDS`) and the op computes it from ``h·v`` and ``‖h‖``:

    add     c = a                     a = s
    norm    c = a · ‖h‖               a = s / ‖v‖
    ablate  c = −a · (h·v)            a = s / ‖v‖²
    clamp   c = (clip(p, lo, hi) − p) · a,  p = a · (h·v)      a = 1 / ‖v‖

All entries on one layer read the same ``h`` (the stream before any of that layer's entries) and
their changes add up, so their order in a spec does not matter; layers apply in model order,
each seeing what the earlier ones did.

Gates. An entry with a gate applies only to tokens whose stream at probe layer ``P`` satisfies
``h_P · p̂ > threshold``. Admission gives each distinct gate of a request an index ``g`` (1-based,
word 7 of the entries it gates) and puts a ``probe`` entry on layer ``P`` (mode :data:`PROBE`:
``a = 1 / ‖p‖``, threshold in word 5, ``g`` in word 7) that changes nothing but records, per
token, whether the gate opened (:class:`.steering.SteeringTables` ``gates``) and counts the
tokens it opened per request row (``gate_counts``). A gated entry on ``P`` itself reads the
probe computed in the same kernel, so ``P = L`` sees the stream before layer L's entries. ``‖v‖`` is the norm of the row as the bank holds it (model
dtype), so ``v̂`` is a unit vector to float32 precision and an ablation leaves no residue.
"""

from __future__ import annotations

import numpy as np
import torch

from hotwire.shared.spec import SpecError, SteerEntry, f32_bits

ADD, NORM, ABLATE, CLAMP, PROBE = 0, 1, 2, 3, 4
CODES = {"add": ADD, "norm": NORM, "ablate": ABLATE, "clamp": CLAMP}
# An entry's eight int32 words in the route table: bank row (0 = off), token window [lo, hi),
# mode, then a, clamp lo (a probe's threshold), clamp hi as float32 bits, and its gate index
# (0: ungated; a probe: the gate it records).
ROW, POS_LO, POS_HI, MODE, COEF, CLAMP_LO, CLAMP_HI, GATE = range(8)
THRESHOLD = CLAMP_LO
WORDS = 8
_F32_MAX = float(torch.finfo(torch.float32).max)
_INF_BITS, _NEG_INF_BITS = (int(b) for b in np.array([np.inf, -np.inf], np.float32).view(np.int32))


def coefficient_words(entry: SteerEntry, norm: float) -> tuple[int, int, int, int]:
    """``(mode, a, lo, hi)`` words for ``entry`` on a row of norm ``norm``; SpecError when a
    projecting entry has no direction to project on (a zero vector, or one too short for ``a``).
    What the entry can do to the stream is bounded elsewhere (:mod:`.stream_bound`)."""
    mode = CODES[entry.mode]
    if mode == ADD:
        return ADD, f32_bits(entry.scale), 0, 0
    if not norm > 0.0:
        raise SpecError("zero_vector", f"{entry.mode} needs a direction; vector {entry.id!r} is zero")
    a = {NORM: entry.scale / norm, ABLATE: entry.scale / norm**2, CLAMP: 1.0 / norm}[mode]
    if not abs(a) <= _F32_MAX:
        raise SpecError("out_of_range", f"vector {entry.id!r} is too short for {entry.mode} (norm {norm:.3g})")
    lo = hi = 0
    if mode == CLAMP:
        lo = _NEG_INF_BITS if entry.lo is None else f32_bits(entry.lo)
        hi = _INF_BITS if entry.hi is None else f32_bits(entry.hi)
    return mode, f32_bits(a), lo, hi


def probe_words(threshold: float, norm: float, probe_id: str) -> tuple[int, int, int, int]:
    """``(mode, a, threshold, 0)`` words of the probe entry recording a gate on a row of ``norm``."""
    if not norm > 0.0:
        raise SpecError("zero_vector", f"gate probe {probe_id!r} is a zero vector")
    if not 1.0 / norm <= _F32_MAX:
        raise SpecError("out_of_range", f"gate probe {probe_id!r} is too short (norm {norm:.3g})")
    return PROBE, f32_bits(1.0 / norm), f32_bits(threshold), 0


def coefficient(mode: torch.Tensor, a: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                dot: torch.Tensor | None, hnorm: torch.Tensor | None) -> torch.Tensor:
    """``c`` per token (the table above), finite: NaN (an overflowed ``h·v``) gives 0, infinities
    the float32 extremes. All arguments ``[T]``; ``a``, ``lo``, ``hi`` float32, ``mode`` int32;
    ``dot``/``hnorm`` may be None when no entry of the step projects (then ``c = a``)."""
    if dot is None or hnorm is None:
        return a
    p = a * dot
    c = torch.where(mode == NORM, a * hnorm,
        torch.where(mode == ABLATE, -a * dot,
        torch.where(mode == CLAMP, (torch.minimum(torch.maximum(p, lo), hi) - p) * a, a)))
    return torch.nan_to_num(c, nan=0.0, posinf=_F32_MAX, neginf=-_F32_MAX)
