"""A row's explanation as a rich tree (`explanation_tree`): its outcome, its episode failure, what
the reply's body names, and its cause chain across every hop, for `gym-failures explain` and the
demo.

A tainted success (built on a call that ended in failure) says so on its first line, before its
reward, and its failure is drawn as a failure row's is, with a line on how the gate counts it; the
events a success recovered from are drawn under "recovered from", not as other observations.

Every value from the row is cleaned (`gym_failures.cli._text.clean`) and reaches rich as `Text`,
never markup. Past `MAX_SHOWN_DEPTH` levels a chain is counted, not drawn (`--json` holds it all).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich.text import Text
from rich.tree import Tree

from gym_failures.cli._console import cell
from gym_failures.cli._text import clean as _clean

if TYPE_CHECKING:
    from gym_failures.reporting.explain import EventNode, RowExplanation

__all__ = ["MAX_SHOWN_DEPTH", "explanation_tree", "status_reading"]


def _event_label(node: EventNode, prefix: str) -> Text:
    event = node.event
    label = Text(prefix)
    label.append(f"[{_clean(event.get('boundary', '?'))}] ", style="cyan")
    label.append(_clean(event.get("failure_kind", "?")), style="bold")
    for name, key in (("stage", "stage"), ("http", "http_status"), ("operation", "operation")):
        if key in event:
            label.append(f"  {name}={_clean(event[key])}")
    reading = status_reading(event)
    if reading is not None:
        label.append(f"  (read as {_clean(reading)})", style="dim")
    label.append(f"  id={_clean(event.get('event_id'))}", style="dim")
    if node.injected:
        label.append("  injected on purpose (a test's fault)", style="magenta")
    if event.get("failure_reason"):
        label.append(f"\n{_clean(event['failure_reason'])}", style="italic")
    foreign = event.get("foreign_error")
    if isinstance(foreign, dict):
        label.append(f"\nforeign error: {_clean(foreign.get('exception_type'))}", style="dim")
    return label


def status_reading(event: Mapping[str, Any]) -> str | None:
    """The kind an HTTP-shaped kind reads as with its status (`reporting_failure_kind`: a model
    server's plain 503 saved as `model_request_error` reads as `model_server_error`), when that
    differs from the kind saved; the event itself is never changed."""
    from gym_failures.failure_kinds import reporting_failure_kind

    kind = event.get("failure_kind")
    if not isinstance(kind, str):
        return None
    reading = reporting_failure_kind(kind, event.get("http_status"))
    return reading if reading is not None and reading != kind else None


_TAINTED_NOTE = "the gate counts this result as tainted, not scored (unless gate --score-tainted)"

# Each level of a tree indents by four columns: past this depth a terminal shows nothing readable, so
# the rest of a chain is counted (`--json` holds it all, up to `MAX_TREE_DEPTH`).
MAX_SHOWN_DEPTH = 16


def _add_chain(tree: Tree, node: EventNode, prefix: str, depth: int = 1) -> None:
    branch = tree.add(_event_label(node, prefix))
    if node.cause is not None and depth == MAX_SHOWN_DEPTH:
        hidden = _below(node.cause)
        branch.add(cell(f"caused by {hidden} more events (not shown; --json has them)", style="dim"))
    elif node.cause is not None:
        _add_chain(branch, node.cause, "caused by ", depth + 1)
    elif node.cause_shown_above is not None:
        branch.add(cell(f"caused by {node.cause_shown_above} (shown above)", style="dim"))
    elif node.causes_cut:
        branch.add(cell(f"caused by {node.causes_cut} more events (not shown)", style="dim"))
    elif node.causes_may_be_omitted:
        branch.add(Text("[omitted] causes may have been lost on the way", style="yellow"))


def _below(node: EventNode | None) -> int:
    """The events of a chain from `node` down, those the explanation cut off included."""
    count = 0
    while node is not None:
        count += 1 + node.causes_cut
        node = node.cause
    return count


def explanation_tree(explanation: RowExplanation) -> Tree:
    """One row's outcome, its episode failure and its cause tree, as a rich tree."""
    where = f"{explanation.path}:{explanation.line}" if explanation.line is not None else explanation.path
    title = Text(f"{_clean(where)}  ", style="dim")
    if explanation.outcome in ("invalid", "torn", "other"):
        title.append(f"{explanation.outcome} line: {_clean(explanation.problem)}", style="yellow")
        return Tree(title)
    title.append(f"rollout {_clean(explanation.rollout_id or '(unknown)')}", style="bold")
    title.append(f" · attempt {explanation.attempt if explanation.attempt is not None else '?'} · ")
    if explanation.outcome == "success":
        title.append("success", style="green" if explanation.tainted is None else "yellow")
        if explanation.tainted is not None:
            kind = _clean(explanation.tainted.failure_kind)  # "(unreadable)" for an invalid report
            kind = kind if kind.startswith("(") else f"({kind})"
            title.append(f" · tainted: built on a call that ended in failure {kind}", style="yellow")
        if explanation.reward is not None:
            title.append(f" · reward {explanation.reward:g}")
        if explanation.masked:
            title.append(" · masked (mask_sample)", style="yellow")
        elif explanation.degraded_kind is not None:
            title.append(f" · degraded ({_clean(explanation.degraded_kind)}, not masked)", style="yellow")
    else:
        title.append("failure", style="red")
        if explanation.final:
            title.append(_clean(explanation.final_label))
        elif explanation.final is False:
            title.append(explanation.not_final_label)
    tree = Tree(title)
    failure = explanation.failure
    if failure is not None:
        text = Text("episode failure: ")
        text.append(_clean(failure.get("failure_kind") or "(no kind)"), style="bold")
        if failure.get("stage"):
            text.append(f"  stage={_clean(failure['stage'])}")
        text.append(f"  terminal={_clean(failure.get('terminal')).lower()}")
        if failure.get("failure_reason"):
            text.append(f"\n{_clean(failure['failure_reason'])}", style="italic")
        tree.add(text)
    reported = explanation.reported_failure
    if reported is not None:
        text = Text("the reply's body names: ")
        text.append(_clean(reported.get("failure_kind")), style="bold")
        for name in ("boundary", "event_id"):
            if reported.get(name):
                text.append(f"  {name.replace('_', ' ')}={_clean(reported[name])}")
        if reported.get("truncated"):
            text.append("  (body cut by NeMo Gym's bound: read as far as it goes)", style="dim")
        if reported.get("failure_reason"):
            text.append(f"\n{_clean(reported['failure_reason'])}", style="italic")
        tree.add(text)
    if explanation.omitted:
        tree.add(Text("[omitted] this report lost events on the way (too large, or invalid)", style="yellow"))
    if explanation.tree is not None:
        _add_chain(tree, explanation.tree, "✖ ")
    elif failure is not None and reported is None:
        tree.add(Text("no failure event saved for this row", style="dim"))
    if explanation.tainted is not None and not explanation.masked:
        tree.add(Text(_TAINTED_NOTE, style="dim"))
    if explanation.observations:
        heading = "recovered from" if explanation.recovered else "other observations"
        observed = tree.add(Text(heading, style="bold"))
        for node in explanation.observations:
            _add_chain(observed, node, "")
    return tree
