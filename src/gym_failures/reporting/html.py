"""A `Summary` as one self-contained HTML page: inline CSS and SVG charts, no script, no network.

Charts: failure share by class, failure share by kind (coloured by the kind's class), and failures
over attempt number (stacked by class). Every text from the rows is escaped, so a hostile reason
cannot inject markup.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only annotations need them: rendering a summary does not load duckdb
    from gym_failures.reporting.summary import GroupCount, Summary

__all__ = ["render_html"]

_CLASS_COLOURS = {"model": "#4e79a7", "evaluation": "#e15759", "unknown": "#9d9d9d"}
_CLASS_ORDER = ("model", "evaluation", "unknown")
# A kind chart taller than this many bars stops being readable; the rest are summed as "other".
_MAX_KIND_BARS = 15

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 64rem; color: #222; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 2rem; }
table { border-collapse: collapse; margin: .5rem 0; }
th, td { border-bottom: 1px solid #ddd; padding: .25rem .75rem; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.legend span { display: inline-block; margin-right: 1rem; }
.swatch { display: inline-block; width: .8rem; height: .8rem; margin-right: .3rem; vertical-align: -1px; }
svg text { font: 12px system-ui, sans-serif; fill: #222; }
code { font-size: 12px; }
"""


def _label(value: object) -> str:
    return "(none)" if value is None else str(value)


def _percent(share: float) -> str:
    return f"{share:.1%}"


def _hbar_chart(bars: Sequence[tuple[str, int, float, str]]) -> str:
    """Horizontal bars: (label, count, share, colour) each, the bar's length its share."""
    if not bars:
        return "<p>No failure rows.</p>"
    label_width, bar_width, row_height = 260, 420, 22
    height = row_height * len(bars) + 8
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_width + bar_width + 140}" '
        f'height="{height}" role="img">'
    ]
    for index, (label, count, share, colour) in enumerate(bars):
        y = 4 + index * row_height
        length = max(1.0, share * bar_width) if count else 0.0
        parts.append(
            f'<text x="{label_width - 8}" y="{y + 15}" text-anchor="end">{escape(label[:40])}</text>'
            f'<rect x="{label_width}" y="{y + 3}" width="{length:.1f}" height="{row_height - 6}" '
            f'fill="{colour}"><title>{escape(label)}: {count}</title></rect>'
            f'<text x="{label_width + length + 6:.1f}" y="{y + 15}">{count} ({_percent(share)})</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _attempt_chart(summary: Summary) -> str:
    """Columns per attempt number, stacked by class."""
    attempts = summary.by_attempt
    if not attempts:
        return "<p>No failure rows.</p>"
    column, gap, plot_height, top, bottom, left = 48, 24, 220, 12, 28, 48
    tallest = max(item.count for item in attempts) or 1
    width = left + len(attempts) * (column + gap) + gap
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{plot_height + top + bottom}" role="img">',
        f'<line x1="{left}" y1="{top + plot_height}" x2="{width}" y2="{top + plot_height}" stroke="#888"/>',
        f'<text x="{left - 6}" y="{top + 10}" text-anchor="end">{tallest}</text>',
        f'<text x="{left - 6}" y="{top + plot_height}" text-anchor="end">0</text>',
    ]
    for index, item in enumerate(attempts):
        x = left + gap + index * (column + gap)
        y = float(top + plot_height)
        for name in _CLASS_ORDER:
            count = item.by_class.get(name, 0)
            if not count:
                continue
            height = count / tallest * plot_height
            y -= height
            parts.append(
                f'<rect x="{x}" y="{y:.1f}" width="{column}" height="{height:.1f}" '
                f'fill="{_CLASS_COLOURS[name]}"><title>attempt {item.attempt}, {name}: {count}</title></rect>'
            )
        parts.append(
            f'<text x="{x + column / 2}" y="{top + plot_height + 18}" text-anchor="middle">'
            f"{item.attempt}</text>"
            f'<text x="{x + column / 2}" y="{y - 4:.1f}" text-anchor="middle">{item.count}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _legend() -> str:
    return (
        '<p class="legend">'
        + "".join(
            f'<span><span class="swatch" style="background:{colour}"></span>{name}</span>'
            for name, colour in _CLASS_COLOURS.items()
        )
        + "</p>"
    )


def _table(header: Sequence[str], rows: Sequence[Sequence[object]], numeric: frozenset[int]) -> str:
    if not rows:
        return "<p>None.</p>"
    head = "".join(f"<th>{escape(name)}</th>" for name in header)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="n">{escape(str(cell))}</td>' if index in numeric else f"<td>{escape(str(cell))}</td>"
            for index, cell in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _group_table(title: str, groups: Sequence[GroupCount]) -> str:
    rows = [(_label(group.value), group.count, group.final, _percent(group.share)) for group in groups]
    return f"<h2>By {escape(title)}</h2>" + _table(
        (title, "failure rows", "final", "share"), rows, frozenset({1, 2, 3})
    )


def render_html(summary: Summary, title: str = "gym-failures summary") -> str:
    """`summary` as a self-contained HTML page."""
    class_bars = [
        (_label(group.value), group.count, group.share, _CLASS_COLOURS.get(str(group.value), "#9d9d9d"))
        for group in summary.by_class
    ]
    kinds = summary.by_kind
    kind_bars = [
        (_label(kind.value), kind.count, kind.share, _CLASS_COLOURS.get(kind.failure_class, "#9d9d9d"))
        for kind in kinds[:_MAX_KIND_BARS]
    ]
    if len(kinds) > _MAX_KIND_BARS:
        rest = kinds[_MAX_KIND_BARS:]
        kind_bars.append(
            (
                f"other ({len(rest)} kinds)",
                sum(kind.count for kind in rest),
                sum(kind.share for kind in rest),
                "#c7c7c7",
            )
        )
    totals = [
        ("rows", summary.rows),
        ("success rows", summary.success_rows),
        ("  of which recovered from failures", summary.recovered_success_rows),
        ("failure rows (failed attempts)", summary.failure_rows),
        ("  of which final", summary.final_failure_rows),
        ("other lines (invalid, or not a row)", summary.other_rows),
        ("torn last lines (skipped)", len(summary.torn_tails)),
    ]
    sections = [
        f"<h1>{escape(title)}</h1>",
        "<p>Files: " + ", ".join(f"<code>{escape(name)}</code>" for name in summary.files) + "</p>",
        _table(("", "count"), totals, frozenset({1})),
        "<h2>Failure share by class</h2>",
        _hbar_chart(class_bars),
        "<h2>Failure share by kind</h2>",
        _legend(),
        _hbar_chart(kind_bars),
        "<h2>Failures over attempt number</h2>",
        _legend(),
        _attempt_chart(summary),
        "<h2>By kind</h2>",
        _table(
            ("kind", "class", "failure rows", "final", "share"),
            [
                (_label(kind.value), kind.failure_class, kind.count, kind.final, _percent(kind.share))
                for kind in kinds
            ],
            frozenset({2, 3, 4}),
        ),
        _group_table("boundary", summary.by_boundary),
        _group_table("stage", summary.by_stage),
        _group_table("HTTP status", summary.by_http_status),
        "<h2>Most common reasons</h2>",
        _table(
            ("count", "kind", "reason"),
            [(reason.count, _label(reason.kind), reason.reason) for reason in summary.top_reasons],
            frozenset({0}),
        ),
        "<h2>Quota reset times</h2>",
        _table(
            ("resets at", "quota events"),
            [(reset.resets_at, reset.events) for reset in summary.quota_resets],
            frozenset({1}),
        ),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>\n"
        + "\n".join(sections)
        + "\n</body></html>\n"
    )
