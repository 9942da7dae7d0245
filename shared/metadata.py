"""Vector metadata: a JSON object that reads back as it was written.

One rule for the control API (an upload's ``metadata``) and the importers (what a source says
about its vectors), so an import checks before sending what the control API would refuse.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator

MAX_METADATA_DEPTH = 32  # nesting of metadata objects and lists


def metadata_problem(value: Any) -> str | None:
    """Why ``value`` cannot be stored as metadata, or None: NaN and infinities (JSON has none;
    they would read back as null), and nesting past what can be stored and served."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return f"holds a non-finite number ({item}), which JSON cannot carry"
        if isinstance(item, (dict, list)):
            if depth > MAX_METADATA_DEPTH:
                return f"nests deeper than {MAX_METADATA_DEPTH} levels"
            children = item.values() if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)
    return None


def checked_metadata(value: dict[str, Any]) -> dict[str, Any]:
    """``value``, or :class:`ValueError` with :func:`metadata_problem`'s reason."""
    problem = metadata_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


# A request model's metadata field: a JSON object that reads back as it was written.
Metadata = Annotated[dict[str, Any], AfterValidator(checked_metadata)]
