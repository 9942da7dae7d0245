"""Plain-text tables for the CLI."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns, two spaces apart; ``None`` shows as ``-``."""
    cells = [[str(h) for h in headers]]
    cells += [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells)
    return "\n".join(line.rstrip() for line in lines)
