"""The HTML report's tables: a table in its own scrolling box, every text from the rows escaped, and
the cells' formats (`gym_failures.reporting.html`, and its cost section,
`gym_failures.reporting._cost_html`)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

__all__ = ["Html", "breakable", "label", "percent", "table"]


def label(value: object) -> str:
    return "(none)" if value is None else str(value)


def percent(share: float) -> str:
    return f"{share:.1%}"


class Html(str):
    """A table cell already written as HTML (its text from the rows escaped)."""


def table(
    header: Sequence[str],
    rows: Sequence[Sequence[object]],
    numeric: frozenset[int],
    sub: frozenset[int] = frozenset(),
) -> str:
    """A table inside its own scrolling box; the rows whose index is in `sub` are indented."""
    if not rows:
        return "<p>None.</p>"
    head = "".join(f"<th>{escape(name)}</th>" for name in header)
    body = "".join(
        ('<tr class="sub">' if number in sub else "<tr>")
        + "".join(
            f'<td class="n">{escape(str(cell))}</td>'
            if index in numeric
            else f"<td>{cell if isinstance(cell, Html) else breakable(cell)}</td>"
            for index, cell in enumerate(row)
        )
        + "</tr>"
        for number, row in enumerate(rows)
    )
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def breakable(value: object) -> str:
    """`value` escaped, with a line-break opportunity after each underscore: a kind such as
    `model_policy_response_timeout` then wraps on a phone instead of widening its table."""
    return escape(str(value)).replace("_", "_<wbr>")
