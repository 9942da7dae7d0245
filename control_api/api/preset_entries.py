"""Presets: named steering recipes kept in the catalog, and the check of their entries.

A preset is a list of spec entries (the same objects a request's ``hotwire`` spec holds) under a
name, so a request can say ``{"preset": "calm"}`` instead of spelling the entries out. It is a
recipe: the vectors it names need not be registered when it is stored (a request that uses it
while one is missing runs unsteered, as any spec naming an unknown id does). Entries are checked
with the engine's own parser (:func:`hotwire.shared.spec.parse_spec`) and against the engine's
limits on a spec (:data:`~hotwire.shared.spec.MAX_ENTRIES` entries,
:data:`~hotwire.shared.spec.MAX_SPEC_CHARS` characters of the text the engine receives), so a
preset the API accepts is one a request can be steered with; a preset cannot name another preset.
"""

from __future__ import annotations

import json
from typing import Any

from hotwire.shared.spec import MAX_SPEC_CHARS, SpecError, parse_spec, spec_text

from .http_errors import ApiError


def check_entries(entries: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """``entries`` if the engine would take them as a spec, else 422 ``bad_entries`` with the
    parser's reason and detail (the reason is the label a request's refusal is counted under)."""
    if not entries:
        raise ApiError(422, "bad_entries", "a preset needs at least one entry")
    for i, entry in enumerate(entries):
        if "preset" in entry:
            raise ApiError(422, "bad_entries", f"entries[{i}] names preset {entry['preset']!r}: "
                           "a preset cannot contain presets; list that preset's entries instead")
        _parse(entry, f"entries[{i}]: ")
    _parse(list(entries), "")
    try:
        json.dumps(entries, allow_nan=False)
    except ValueError:
        raise ApiError(422, "bad_entries", "entries hold a non-finite number, which JSON cannot "
                       "carry") from None
    chars = len(spec_text(entries))
    if chars > MAX_SPEC_CHARS:
        raise ApiError(422, "bad_entries", f"too_large: the entries are {chars} characters as the "
                       f"engine receives them (compact JSON), and a spec is at most {MAX_SPEC_CHARS}: "
                       "no request could be steered with this preset")
    return tuple(entries)


def _parse(spec: Any, where: str) -> None:
    try:
        parse_spec(spec)
    except SpecError as e:
        raise ApiError(422, "bad_entries", f"{where}{e.reason}: {e.detail}") from None
