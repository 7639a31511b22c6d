"""A `Summary` as one self-contained HTML page: inline CSS and SVG charts, no script, no network.

The page holds the totals; the gate's verdict with its coverage (when given a `GateVerdict`); the
failed attempt with the longest cause chain, as a nested list (when given its `RowExplanation`);
charts of the failure share by class, by kind and by root cause (each coloured by its class) and of
failures over attempt number (stacked by class); and the tables by kind, the kind the failed call
reported, root cause, boundary, stage and HTTP status (with the root's status), and of the most
common reasons (normalized, with one real example) and quota resets, as `gym-failures summarize`
prints them; last, what the attempts cost (`gym_failures.reporting._cost_html`). Its tables are
`gym_failures.reporting._html_parts`'.

Decisions:

- Responsive: a viewport meta, and every chart an SVG with a `viewBox` scaled to the page's width
  (capped, so that text keeps about its drawn size). A bar chart puts each label on its own line
  above its bar, so at 375 px its text is still about 10 px; long words and tables wrap or scroll
  inside their own box, never the page (checked in headless Chromium at 375 and 1400 px).
- A chart or a grouping with nothing to show (no failure rows; every value `(none)`, such as the
  HTTP status of runs whose failures had none) is left out, with one line saying why, rather than
  drawn empty. The root-cause chart is drawn when a root differs from its failure's own kind (else
  it would repeat the kind chart); a table's column every row leaves empty is left out.
- A run whose only failures are those its tainted success rows were built on has no chart (a tainted
  row is in no share) but its tables by kind and by root cause, for their tainted column.
- Every text from the rows is escaped, so a hostile reason cannot inject markup.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING

from gym_failures.failure_kinds import reporting_failure_kind
from gym_failures.reporting._cost_html import cost_section
from gym_failures.reporting._html_parts import Html as _Html
from gym_failures.reporting._html_parts import breakable as _breakable
from gym_failures.reporting._html_parts import label as _label
from gym_failures.reporting._html_parts import percent as _percent
from gym_failures.reporting._html_parts import table as _table

if TYPE_CHECKING:  # only annotations need them: rendering a summary does not load duckdb
    from gym_failures.gate import GateVerdict
    from gym_failures.reporting.explain import EventNode, RowExplanation
    from gym_failures.reporting.summary import GroupCount, KindCount, Summary

__all__ = ["render_html"]

_CLASS_COLOURS = {"model": "#4e79a7", "evaluation": "#e15759", "unknown": "#9d9d9d"}
_CLASS_ORDER = ("model", "evaluation", "unknown")
# A kind chart taller than this many bars stops being readable; the rest are summed as "other".
_MAX_KIND_BARS = 15
# A bar chart's drawing width in SVG units; the page shows it at most this many CSS pixels wide, so
# 12-unit text is never drawn larger than 12 px, and at 375 px (about 340 px of content) about 10 px.
_BAR_CHART_WIDTH = 400

_STYLE = """
*, *::before, *::after { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, sans-serif; margin: 0 auto; padding: 1rem; max-width: 64rem;
       color: #222; overflow-wrap: break-word; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; margin: .5rem 0; }
th, td { border-bottom: 1px solid #ddd; padding: .25rem .6rem; text-align: left; vertical-align: top; }
@media (max-width: 480px) { body { font-size: 14px; padding: .6rem; } th, td { padding: .2rem .3rem; } }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.sub td:first-child { padding-left: 1.8rem; }
.legend span { display: inline-block; margin-right: 1rem; }
.swatch { display: inline-block; width: .8rem; height: .8rem; margin-right: .3rem; vertical-align: -1px; }
svg.chart { display: block; width: 100%; height: auto; }
svg text { font: 12px system-ui, sans-serif; fill: #222; }
code, .dim, .reason { overflow-wrap: anywhere; } code { font-size: 13px; }
.passed { color: #1a7f37; font-weight: bold; } .failed { color: #cf222e; font-weight: bold; }
ul.tree, ul.tree ul { list-style: none; margin: 0; padding-left: 1.1rem; border-left: 1px solid #ccc; }
ul.tree { padding-left: .6rem; }
ul.tree li { margin: .35rem 0; }
.kind { font-weight: bold; } .boundary { color: #0a6a8a; } .dim { color: #666; }
.reason { font-style: italic; display: block; }
"""


def _hbar_chart(bars: Sequence[tuple[str, int, float, str]]) -> str:
    """Horizontal bars: (label, count, share, colour) each, the bar's length its share, the label
    on its own line above the bar so that it keeps its size on a narrow screen."""
    row_height, bar_height, count_room = 40, 12, 90
    bar_width = _BAR_CHART_WIDTH - count_room
    height = row_height * len(bars) + 4
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {_BAR_CHART_WIDTH} {height}" '
        f'style="max-width:{_BAR_CHART_WIDTH}px" role="img">'
    ]
    for index, (label, count, share, colour) in enumerate(bars):
        y = 4 + index * row_height
        length = max(1.0, share * bar_width) if count else 0.0
        shown = label if len(label) <= 56 else label[:55] + "…"
        parts.append(
            f'<text x="0" y="{y + 12}">{escape(shown)}</text>'
            f'<rect x="0" y="{y + 17}" width="{length:.1f}" height="{bar_height}" '
            f'fill="{colour}"><title>{escape(label)}: {count}</title></rect>'
            f'<text x="{length + 6:.1f}" y="{y + 28}">{count} ({_percent(share)})</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _attempt_chart(summary: Summary) -> str:
    """Columns per attempt number, stacked by class."""
    attempts = summary.by_attempt
    column, gap, plot_height, top, bottom, left = 48, 24, 220, 12, 28, 48
    tallest = max(item.count for item in attempts) or 1
    width = left + len(attempts) * (column + gap) + gap
    height = plot_height + top + bottom
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" '
        f'style="max-width:{width}px" role="img">',
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
            bar = count / tallest * plot_height
            y -= bar
            parts.append(
                f'<rect x="{x}" y="{y:.1f}" width="{column}" height="{bar:.1f}" '
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


def _group_table(title: str, groups: Sequence[GroupCount]) -> str:
    from gym_failures.reporting.summary import nothing_to_show  # loaded: `groups` is a summary's

    heading = f"<h2>By {escape(title)}</h2>"
    if nothing_to_show(groups):
        return heading + f"<p>No failure row names its {escape(title)}.</p>"
    rows = [(_label(group.value), group.count, group.final, _percent(group.share)) for group in groups]
    return heading + _table((title, "failure rows", "final", "share"), rows, frozenset({1, 2, 3}))


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _verdict_section(verdict: GateVerdict) -> str:
    """The verdict, its reasons and warnings, and the coverage table with the lines around it, the
    table's cells `gym_failures.gate.coverage_rows`', as `gym-failures gate` prints them."""
    from gym_failures.gate import (
        COVERAGE_COLUMNS,
        coverage_note,
        coverage_remarks,
        coverage_rows,
        failures_by_root,
        group_cells,
        outcomes_by_kind,
    )

    coverage = verdict.coverage
    rows = coverage_rows(coverage)
    sub = frozenset(index for index, row in enumerate(rows) if row.part)
    state = '<span class="passed">PASSED</span>' if verdict.passed else '<span class="failed">FAILED</span>'
    reasons = "".join(f"<li>{escape(reason)}</li>" for reason in verdict.reasons)
    warnings = "".join(f"<li>{escape(warning)}</li>" for warning in verdict.warnings)
    remarks = "".join(
        f'<p class="dim">{escape(_sentence(remark))}</p>' for remark in coverage_remarks(coverage)
    )
    kinds = outcomes_by_kind(coverage)
    roots = failures_by_root(coverage)
    groups = ""
    if coverage.groups is not None:
        # The same rows `gym-failures gate` prints (`gym_failures.gate.group_cells`).
        groups = "<h3>Groups</h3>" + _table(("", "count"), group_cells(coverage.groups), frozenset({1}))
        if coverage.groups.short_groups:
            tasks = ", ".join(coverage.groups.short_groups)
            groups += f'<p class="dim">Short groups (tasks): {escape(tasks)}</p>'
    return (
        "<h2>Acceptance gate</h2>"
        f"<p>{state} · {escape(coverage.line)}</p>"
        + (f"<ul>{reasons}</ul>" if reasons else "")
        + (f'<p class="dim">Warnings:</p><ul class="dim">{warnings}</ul>' if warnings else "")
        + _table(COVERAGE_COLUMNS, [row.cells for row in rows], frozenset({1, 2}), sub=sub)
        + remarks
        + ("<h3>Outcomes by kind</h3>" + _table(("kind", "rollouts"), kinds, frozenset({1})) if kinds else "")
        + (
            "<h3>Final failures by root cause</h3>"
            + _table(("root cause's kind", "rollouts"), roots, frozenset({1}))
            if roots
            else ""
        )
        + groups
        + f'<p class="dim">{escape(_sentence(coverage_note(coverage)))}</p>'
    )


def _event_item(node: EventNode, prefix: str) -> str:
    event = node.event
    parts = [
        f"{escape(prefix)}",
        f'<span class="boundary">[{escape(_label(event.get("boundary", "?")))}]</span> ',
        f'<span class="kind">{escape(_label(event.get("failure_kind", "?")))}</span>',
    ]
    for name, key in (("stage", "stage"), ("http", "http_status"), ("operation", "operation")):
        if key in event:
            parts.append(f" {name}={escape(_label(event[key]))}")
    kind = event.get("failure_kind")
    reading = reporting_failure_kind(kind, event.get("http_status")) if isinstance(kind, str) else None
    if reading is not None and reading != kind:
        # As `gym-failures explain` shows it: the kind its status reads as, the event unchanged.
        parts.append(f' <span class="dim">(read as {escape(_label(reading))})</span>')
    parts.append(f' <span class="dim">id={escape(_label(event.get("event_id")))}</span>')
    if node.injected:
        parts.append(' <span class="dim">injected on purpose (a test\'s fault)</span>')
    if event.get("failure_reason"):
        parts.append(f'<span class="reason">{escape(str(event["failure_reason"]))}</span>')
    children = ""
    if node.cause is not None:
        children = f"<ul>{_event_item(node.cause, 'caused by ')}</ul>"
    elif node.cause_shown_above is not None:
        children = f'<ul><li class="dim">caused by {escape(node.cause_shown_above)} (shown above)</li></ul>'
    elif node.causes_may_be_omitted:
        children = '<ul><li class="dim">[omitted] causes may have been lost on the way</li></ul>'
    return f"<li>{''.join(parts)}{children}</li>"


def _cause_tree_section(explanation: RowExplanation) -> str:
    where = explanation.path if explanation.line is None else f"{explanation.path}:{explanation.line}"
    state = "failure"
    if explanation.final:
        state += explanation.final_label
    elif explanation.final is False:
        state += explanation.not_final_label
    attempt = explanation.attempt if explanation.attempt is not None else "?"
    items = []
    failure = explanation.failure
    if failure is not None:
        items.append(
            "<li>episode failure: "
            f'<span class="kind">{escape(_label(failure.get("failure_kind") or "(no kind)"))}</span>'
            + (f" stage={escape(_label(failure['stage']))}" if failure.get("stage") else "")
            + f" terminal={escape(_label(failure.get('terminal'))).lower()}"
            + (
                f'<span class="reason">{escape(str(failure["failure_reason"]))}</span>'
                if failure.get("failure_reason")
                else ""
            )
            + "</li>"
        )
    reported = explanation.reported_failure
    if reported is not None:
        facts = "".join(
            f" {name.replace('_', ' ')}={escape(_label(reported[name]))}"
            for name in ("boundary", "event_id")
            if reported.get(name)
        )
        items.append(
            "<li>the reply's body names: "
            f'<span class="kind">{escape(_label(reported.get("failure_kind")))}</span>{facts}'
            + (
                ' <span class="dim">(body cut: read as far as it goes)</span>'
                if reported.get("truncated")
                else ""
            )
            + (
                f'<span class="reason">{escape(str(reported["failure_reason"]))}</span>'
                if reported.get("failure_reason")
                else ""
            )
            + "</li>"
        )
    if explanation.omitted:
        items.append('<li class="dim">[omitted] this report lost events on the way</li>')
    if explanation.tree is not None:
        items.append(_event_item(explanation.tree, "✖ "))
    if explanation.observations:
        observed = "".join(_event_item(node, "") for node in explanation.observations)
        items.append(f"<li>other observations<ul>{observed}</ul></li>")
    return (
        "<h2>The failed attempt with the longest cause chain</h2>"
        f"<p><code>{escape(where)}</code> rollout {escape(_label(explanation.rollout_id))} · attempt "
        f"{attempt} · {escape(state)}</p>"
        f'<ul class="tree">{"".join(items)}</ul>'
    )


def _kind_bars(
    kinds: Sequence[tuple[object, int, float, str]], noun: str
) -> list[tuple[str, int, float, str]]:
    """Bars of (kind, failure rows, share, class): the first `_MAX_KIND_BARS`, the rest as "other"."""
    bars = [
        (_label(kind), count, share, _CLASS_COLOURS.get(failure_class, "#9d9d9d"))
        for kind, count, share, failure_class in kinds[:_MAX_KIND_BARS]
    ]
    if len(kinds) > _MAX_KIND_BARS:
        rest = kinds[_MAX_KIND_BARS:]
        count, share = sum(item[1] for item in rest), sum(item[2] for item in rest)
        bars.append((f"other ({len(rest)} {noun})", count, share, "#c7c7c7"))
    return bars


def _root_kinds(summary: Summary) -> list[tuple[object, int, float, str]]:
    """Failure rows by root kind alone (boundary, status and the failure's kind summed), largest first,
    each with its most rows' class."""
    totals: dict[str | None, list[float]] = {}
    classes: dict[str | None, Counter[str]] = {}
    for root in summary.by_root_kind:
        if root.count:
            total = totals.setdefault(root.root_kind, [0, 0.0])
            total[0] += root.count
            total[1] += root.share
            classes.setdefault(root.root_kind, Counter())[root.failure_class] += root.count
    ordered = sorted(totals.items(), key=lambda item: (-item[1][0], item[0] is None, str(item[0])))
    return [
        (kind, int(count), round(share, 6), classes[kind].most_common(1)[0][0])
        for kind, (count, share) in ordered
    ]


def _tainted_note(tainted: int) -> str:
    """The end of the no-chart line: where a run's tainted rows, if any, are counted instead."""
    if not tainted:
        return "."
    rows = "1 tainted success row" if tainted == 1 else f"{tainted} tainted success rows"
    return (
        f", but {rows} (built on a call that ended in failure): by that failure's kind and root "
        "cause, in the tables' tainted column below."
    )


def _charts(summary: Summary) -> list[str]:
    from gym_failures.reporting.summary import nothing_to_show  # loaded: `summary` is one

    if not summary.failure_rows:
        # The charts are of failure shares: a tainted row is in none (its tables follow).
        tainted = summary.tainted_success_rows
        return ["<h2>Charts</h2>", f"<p>No failure rows: nothing to chart{_tainted_note(tainted)}</p>"]
    sections: list[str] = []
    if not nothing_to_show(summary.by_class):
        bars = [
            (_label(group.value), group.count, group.share, _CLASS_COLOURS.get(str(group.value), "#9d9d9d"))
            for group in summary.by_class
        ]
        sections += ["<h2>Failure share by class</h2>", _hbar_chart(bars)]
    kinds = [kind for kind in summary.by_kind if kind.count]
    if not nothing_to_show(kinds):
        rows = [(kind.value, kind.count, kind.share, kind.failure_class) for kind in kinds]
        sections += ["<h2>Failure share by kind</h2>", _legend(), _hbar_chart(_kind_bars(rows, "kinds"))]
    if any(root.count and root.root_kind != root.kind for root in summary.by_root_kind):
        sections += [
            "<h2>Failure share by root cause</h2>",
            '<p class="dim">The deepest failure each failed attempt\'s cause chain reaches.</p>',
            _legend(),
            _hbar_chart(_kind_bars(_root_kinds(summary), "root kinds")),
        ]
    if summary.by_attempt:
        sections += ["<h2>Failures over attempt number</h2>", _legend(), _attempt_chart(summary)]
    return sections


def _kinds_table(kinds: Sequence[KindCount], tainted: bool) -> str:
    header = ("kind", "class", "failure rows", "final", "share", *(("tainted",) if tainted else ()))
    rows = [
        (
            _label(kind.value),
            kind.failure_class,
            kind.count,
            kind.final,
            _percent(kind.share),
            *((kind.tainted,) if tainted else ()),
        )
        for kind in kinds
    ]
    return "<h2>By kind</h2>" + _table(header, rows, frozenset({2, 3, 4, 5}))


def _roots_table(summary: Summary) -> str:
    """As the terminal's: the root's kind, class, boundary and status beside the failure's kind."""
    roots = summary.by_root_kind
    boundary = any(root.root_boundary is not None for root in roots)
    status = any(root.root_http_status is not None for root in roots)
    tainted = bool(summary.tainted_success_rows)
    header = [
        "root kind",
        "class",
        *(("boundary",) if boundary else ()),
        *(("HTTP status",) if status else ()),
        "the failure's kind",
        "failure rows",
        "final",
        "share",
        *(("tainted",) if tainted else ()),
    ]
    rows = [
        (
            _label(root.root_kind),
            root.failure_class,
            *((_label(root.root_boundary),) if boundary else ()),
            *((_label(root.root_http_status),) if status else ()),
            _label(root.kind),
            root.count,
            root.final,
            _percent(root.share),
            *((root.tainted,) if tainted else ()),
        )
        for root in roots
    ]
    first_count = header.index("failure rows")
    return "<h2>By root cause</h2>" + _table(header, rows, frozenset(range(first_count, len(header))))


def _statuses_table(summary: Summary) -> str:
    statuses = summary.by_http_status_and_root
    if all(item.http_status is None and item.root_http_status is None for item in statuses):
        return "<h2>By HTTP status</h2><p>No failure row names its HTTP status.</p>"
    rows = [
        (
            _label(item.http_status),
            _label(item.root_http_status),
            item.count,
            item.final,
            _percent(item.share),
        )
        for item in statuses
    ]
    header = ("HTTP status", "root's HTTP status", "failure rows", "final", "share")
    return "<h2>By HTTP status</h2>" + _table(header, rows, frozenset({2, 3, 4}))


def _reasons_table(summary: Summary) -> str:
    if not summary.top_reasons:
        return "<h2>Most common reasons</h2>\n<p>No failure row gives a reason.</p>"
    rows = []
    for reason in summary.top_reasons:
        shown = _breakable(reason.reason)
        if reason.example is not None and reason.example != reason.reason:
            shown += f'<span class="reason dim">e.g. {escape(reason.example)}</span>'
        rows.append((reason.count, _label(reason.kind), _Html(shown)))
    return "<h2>Most common reasons</h2>\n" + _table(("count", "kind", "reason"), rows, frozenset({0}))


def render_html(
    summary: Summary,
    title: str = "gym-failures summary",
    *,
    verdict: GateVerdict | None = None,
    explanation: RowExplanation | None = None,
) -> str:
    """`summary` as a self-contained HTML page, with the gate's `verdict` and the cause tree of
    `explanation` (the failed attempt with the longest cause chain) when given."""
    totals = [
        ("rows", summary.rows),
        ("success rows", summary.success_rows),
        ("of which recovered from failures", summary.recovered_success_rows),
        ("of which tainted: built on a call that ended in failure", summary.tainted_success_rows),
        ("of which masked (mask_sample)", summary.masked_success_rows),
        ("of which degraded (a failure kind named, not masked)", summary.degraded_success_rows),
        ("failure rows (failed attempts)", summary.failure_rows),
        ("of which final", summary.final_failure_rows),
        ("of which injected on purpose (a test's fault at their root)", summary.injected_failure_rows),
        ("other lines (invalid, or not a row)", summary.other_rows),
        ("torn last lines (skipped)", len(summary.torn_tails)),
    ]
    if summary.expected_rollouts is not None:
        totals += [
            ("rollouts in the materialized inputs", summary.expected_rollouts),
            ("of which left no row", summary.missing_rollouts or 0),
        ]
    sections = [
        f"<h1>{escape(title)}</h1>",
        "<p>Files: " + ", ".join(f"<code>{escape(name)}</code>" for name in summary.files) + "</p>",
        _table(("", "count"), totals, frozenset({1}), sub=frozenset({2, 3, 4, 5, 7, 11})),
    ]
    if verdict is not None:
        sections.append(_verdict_section(verdict))
    if explanation is not None:
        sections.append(_cause_tree_section(explanation))
    sections += _charts(summary)
    if not summary.failure_rows and summary.tainted_success_rows:
        # Only tainted rows failed: their failures by kind and root cause, in the tainted column.
        sections += [
            _kinds_table(summary.by_kind, tainted=True),
            *([_roots_table(summary)] if summary.by_root_kind else []),
        ]
    if summary.failure_rows:
        sections += [
            _kinds_table(summary.by_kind, bool(summary.tainted_success_rows)),
            *(
                [_group_table("kind the failed call reported", summary.by_reported_kind)]
                if summary.by_reported_kind
                else []
            ),
            *([_roots_table(summary)] if summary.by_root_kind else []),
            _group_table("boundary", summary.by_boundary),
            _group_table("stage", summary.by_stage),
            _statuses_table(summary),
            _reasons_table(summary),
        ]
    if summary.quota_resets:
        sections += [
            "<h2>Quota reset times</h2>",
            _table(
                ("resets at", "quota events"),
                [(reset.resets_at, reset.events) for reset in summary.quota_resets],
                frozenset({1}),
            ),
        ]
    if summary.cost is not None:
        sections.append(cost_section(summary.cost))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>\n"
        + "\n".join(sections)
        + "\n</body></html>\n"
    )
