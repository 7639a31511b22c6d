"""What failures cost, in `summarize`: rows with known injected costs give exact tables (the `Cost`,
`--json`'s `cost`, the terminal's tables and the HTML section), rows NeMo Gym 0.7.0 wrote have their
attempts counted and nothing else reported, and the SQL reads every row's cost as Python does."""

from __future__ import annotations

import html
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gym_failures.reporting._cost import Cost
from gym_failures.reporting._cost_keys import DURATION_S, MODEL_CALLS, USAGE, micros, row_cost
from gym_failures.reporting.summary import Summary, summarize
from gym_failures.row_keys import saved
from gym_failures.rows import is_not_persisted, is_rollout_row, normalized
from tests.cli.invoke import run_cli
from tests.saved_rows import context_limit, failure_row, model_503_chain, success_row, write_jsonl
from tests.strategies import examples

RUNS = Path(__file__).resolve().parents[2] / "examples" / "nemo_gym_runs"


def _costing(
    row: dict[str, Any],
    seconds: float | None = None,
    usage: dict[str, int] | None = None,
    calls: tuple[int, int, int] | None = None,
) -> dict[str, Any]:
    """`row` in the form the collector saves it (`row_keys.saved`), with the cost keys given."""
    out = saved(row)
    if seconds is not None:
        out[DURATION_S] = seconds
    if usage is not None:
        out[USAGE] = usage
    if calls is not None:
        out[MODEL_CALLS] = dict(zip(("calls", "attempts", "failed_attempts"), calls, strict=True))
    return out


def _injected() -> list[dict[str, Any]]:
    """Four rollouts with known costs, a row without the keys, and a copy that closes a rollout on
    resume (no attempt: its keys are its last attempt's)."""
    agent_failure = failure_row(model_503_chain(), "1:0", attempt=1, final=False)
    closing = failure_row(context_limit(), "5:0", attempt=3, final=True)
    closing["closed_on_resume"] = True
    return [
        _costing(success_row("0:0"), 1.5, {"input_tokens": 100, "output_tokens": 20}, (2, 2, 0)),
        # 3 SDK retries times 3 client retries: 9 model attempts, all failed, for one logical call.
        _costing(agent_failure, 2.25, {"input_tokens": 50}, (1, 9, 9)),
        _costing({**agent_failure, "attempt": 2}, 2.25, {"input_tokens": 50}, (1, 9, 9)),
        _costing(success_row("1:0", attempt=3), 1.0, {"input_tokens": 100, "output_tokens": 20}, (1, 3, 2)),
        _costing(failure_row(context_limit(), "2:0"), 0.5, {"input_tokens": 300}),
        saved(success_row("3:0")),  # a row from before issue 30
        _costing(closing, 99.0, {"input_tokens": 10**6}, (1, 50, 50)),
    ]


@pytest.fixture(scope="module")
def injected(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A torn last line (a collector killed mid-append) is never counted, whatever it costs.
    torn = json.dumps(_costing(success_row("9:0"), 1000.0, {"input_tokens": 7}, (1, 100, 0))).encode()
    return write_jsonl(tmp_path_factory.mktemp("cost") / "rows.jsonl", _injected(), tail=torn)


@pytest.fixture(scope="module")
def cost(injected: Path) -> Cost:
    summary = summarize([injected])
    assert summary.cost is not None
    return summary.cost


def test_every_attempt_is_counted_with_its_seconds_and_tokens(cost: Cost) -> None:
    """6 attempts (the closing copy is none); 5 report seconds and input tokens, 2 output tokens."""
    assert cost.total.model_dump() == {
        "attempts": 6,
        "seconds": 7.5,
        "seconds_rows": 5,
        "input_tokens": 600,
        "input_tokens_rows": 5,
        "output_tokens": 40,
        "output_tokens_rows": 2,
        "model_calls": 5,
        "model_attempts": 23,
        "failed_model_attempts": 20,
        "model_rows": 4,
        "attempts_share": 1.0,
        "seconds_share": 1.0,
        "tokens_share": 1.0,
    }


def test_failed_attempts_cost_their_share_of_the_run(cost: Cost) -> None:
    assert cost.failed.model_dump() == {
        "attempts": 3,
        "seconds": 5.0,
        "seconds_rows": 3,
        "input_tokens": 400,
        "input_tokens_rows": 3,
        "output_tokens": None,  # no failed attempt reported any: not 0
        "output_tokens_rows": 0,
        "model_calls": 2,
        "model_attempts": 18,
        "failed_model_attempts": 18,
        "model_rows": 2,
        "attempts_share": 0.5,
        "seconds_share": round(5.0 / 7.5, 6),
        "tokens_share": round(400 / 640, 6),
    }


def test_reruns_are_the_attempts_past_a_rollouts_first_whatever_their_outcome(cost: Cost) -> None:
    reruns = cost.reruns
    assert (reruns.attempts, reruns.seconds, reruns.input_tokens, reruns.output_tokens) == (2, 3.25, 150, 20)
    assert (reruns.output_tokens_rows, reruns.model_attempts, reruns.seconds_share) == (
        1,
        12,
        round(3.25 / 7.5, 6),
    )


def test_failed_attempts_are_set_out_by_class_kind_and_root_cause(cost: Cost) -> None:
    def lines(items: list[Any]) -> list[tuple[Any, ...]]:
        return [
            (getattr(item, "kind", None), item.failure_class, item.attempts, item.seconds, item.input_tokens)
            for item in items
        ]

    assert lines(cost.failed_by_class) == [(None, "evaluation", 2, 4.5, 100), (None, "model", 1, 0.5, 300)]
    assert lines(cost.failed_by_kind) == [
        ("agent_request_failed", "evaluation", 2, 4.5, 100),
        ("model_context_limit", "model", 1, 0.5, 300),
    ]
    assert lines(cost.failed_by_root_kind) == [
        ("transport_timeout", "evaluation", 2, 4.5, 100),
        ("model_context_limit", "model", 1, 0.5, 300),
    ]
    assert cost.failed_by_kind[1].model_attempts is None  # the context limit reported no model calls


def test_the_amplification_multiplies_across_layers(cost: Cost) -> None:
    amplification = cost.amplification
    assert (amplification.attempts, amplification.model_calls, amplification.model_attempts) == (4, 5, 23)
    assert (amplification.per_attempt_mean, amplification.per_attempt_max, amplification.per_call) == (
        5.75,
        9,
        4.6,
    )
    assert [(bucket.model_attempts, bucket.attempts) for bucket in amplification.distribution] == [
        ("2", 1),
        ("3", 1),
        ("4-9", 2),
    ]
    # Rollout 1:0: 9 + 9 + 3 model attempts over its 3 collector attempts.
    assert (amplification.rollouts, amplification.per_rollout_mean, amplification.per_rollout_max) == (
        2,
        11.5,
        21,
    )
    assert [item.model_dump() for item in amplification.largest] == [
        {"rollout_id": "1:0", "attempts": 3, "model_calls": 3, "model_attempts": 21},
        {"rollout_id": "0:0", "attempts": 1, "model_calls": 2, "model_attempts": 2},
    ]


def test_the_largest_amplifications_are_bounded(tmp_path: Path) -> None:
    rows = [_costing(success_row(f"{index}:0"), calls=(1, index + 1, index)) for index in range(15)]
    summary = summarize([write_jsonl(tmp_path / "rows.jsonl", rows)])
    assert summary.cost is not None
    largest = summary.cost.amplification.largest
    assert [item.rollout_id for item in largest] == [f"{index}:0" for index in range(14, 4, -1)]
    assert summary.cost.amplification.per_rollout_max == 15


def _table_rows(text: str, title: str) -> dict[str, list[str]]:
    """The rows of the rich table titled `title` in `text`, by their first cell."""
    lines = text.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith(title))
    rows: dict[str, list[str]] = {}
    for line in lines[start + 4 :]:
        if not line.startswith("│"):
            break
        cells = [part.strip() for part in line.strip("│").split("│")]
        rows[cells[0]] = cells[1:]
    return rows


def test_the_terminal_prints_the_cost_tables(injected: Path) -> None:
    code, out, _ = run_cli("summarize", injected)
    assert code == 0
    totals = _table_rows(out, "Cost (shares of the whole run)")
    assert totals["all attempts"] == [
        "6",
        "100.0%",
        "7.500 (5 of 6)",
        "100.0%",
        "600 (5 of 6)",
        "40 (2 of 6)",
        "100.0%",
        "23 (4 of 6)",
    ]
    assert totals["failed attempts"] == [
        "3",
        "50.0%",
        "5.000",
        "66.7%",
        "400",
        "not reported",
        "62.5%",
        "18 (2 of 3)",
    ]
    kinds = _table_rows(out, "Failed attempts' cost by kind")
    assert kinds["model_context_limit"] == [
        "model",
        "1",
        "16.7%",
        "0.500",
        "6.7%",
        "300",
        "not reported",
        "46.9%",
        "not reported",
    ]
    assert "transport_timeout" in _table_rows(out, "Failed attempts' cost by root cause")
    assert "Model attempts per rollout attempt: 5.75 on average, at most 9." in out
    assert "Model attempts per logical model call: 4.60." in out
    largest = _table_rows(out, "Largest amplifications")
    assert list(largest) == ["1:0", "0:0"]
    assert largest["1:0"] == ["3", "3", "21"]


def test_json_holds_the_cost(injected: Path) -> None:
    code, out, _ = run_cli("summarize", injected, "--json")
    assert code == 0
    document = json.loads(out)["cost"]
    assert set(document) == {
        "total",
        "failed",
        "reruns",
        "failed_by_class",
        "failed_by_kind",
        "failed_by_root_kind",
        "amplification",
    }
    assert document["failed"]["seconds"] == 5.0
    assert document["failed"]["output_tokens"] is None
    assert document["failed_by_kind"][0]["kind"] == "agent_request_failed"
    assert document["amplification"]["largest"][0] == {
        "rollout_id": "1:0",
        "attempts": 3,
        "model_calls": 3,
        "model_attempts": 21,
    }


def test_the_html_report_has_the_cost_section(injected: Path, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    code, _, _ = run_cli("summarize", injected, "--html", page)
    assert code == 0
    text = page.read_text()
    assert '<td class="n">7.500 (5 of 6)</td>' in text
    words = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text.replace("<wbr>", ""))).split())
    assert "What failures cost" in words
    assert "failed attempts 3 50.0% 5.000 66.7% 400 not reported 62.5% 18 (2 of 3)" in words
    assert "agent_request_failed evaluation 2 33.3% 4.500 60.0% 100 not reported 15.6% 18" in words
    largest = (
        "Largest amplifications (model attempts per rollout) rollout attempts model calls model attempts"
    )
    assert f"{largest} 1:0 3 3 21 0:0 1 2 2" in words


def _nemo_gym_files(case: str) -> list[Path]:
    return [RUNS / case / "rollouts.jsonl", RUNS / case / "rollouts_failures.jsonl"]


@pytest.mark.parametrize("case", sorted(path.name for path in RUNS.iterdir() if path.is_dir()))
def test_nemo_gyms_own_rows_have_their_attempts_counted_and_nothing_else_reported(case: str) -> None:
    """Rows NeMo Gym 0.7.0's own collector wrote (examples/nemo_gym_runs) carry no cost keys."""
    summary = summarize(_nemo_gym_files(case), max_attempts=3)
    assert summary.cost is not None
    assert summary.cost.total.attempts == summary.success_rows + summary.failure_rows
    assert summary.cost.failed.attempts == summary.failure_rows
    for line in (summary.cost.total, summary.cost.failed, summary.cost.reruns):
        assert (line.seconds, line.input_tokens, line.output_tokens, line.model_attempts) == (None,) * 4
        assert line.seconds_rows == line.model_rows == 0
    assert summary.cost.amplification.attempts == 0


def test_a_resumed_nemo_gym_run_counts_its_reruns_and_says_seconds_are_not_reported() -> None:
    """Rollout 2:0 succeeded at attempt 2; 3:0 failed twice, then succeeded at attempt 3."""
    files = _nemo_gym_files("resumed")
    summary = summarize(files, max_attempts=3)
    assert summary.cost is not None
    assert (summary.cost.total.attempts, summary.cost.failed.attempts, summary.cost.reruns.attempts) == (
        7,
        3,
        3,
    )
    _, out, _ = run_cli("summarize", *files)
    totals = _table_rows(out, "Cost (shares of the whole run)")
    assert totals["re-runs (attempts after a rollout's first)"][:3] == ["3", "42.9%", "not reported"]
    assert "Model attempts per rollout attempt: not reported" in out


# --- The SQL reads every row's cost as Python does -------------------------------------------------

_NUMBER = st.one_of(
    st.integers(-1, 12),
    st.sampled_from([10**6, 10**6 + 1, 10**12 + 1, 2**64, True, False, None, "2", 2.0, 1.25, -0.0]),
    st.floats(0, 10**6 + 1, allow_nan=False, allow_infinity=False),
)
_GOOD_USAGE = st.fixed_dictionaries(
    {}, optional={"input_tokens": st.integers(0, 1000), "output_tokens": st.integers(0, 1000)}
).filter(bool)
_GOOD_CALLS = st.builds(
    lambda calls, extra, failed: {
        "calls": calls,
        "attempts": calls + extra,
        "failed_attempts": min(failed, calls + extra),
    },
    st.integers(1, 3),
    st.integers(0, 9),
    st.integers(0, 12),
)
_COST_KEYS = st.fixed_dictionaries(
    {},
    optional={
        DURATION_S: _NUMBER,
        USAGE: st.one_of(
            _GOOD_USAGE,
            st.dictionaries(
                st.sampled_from(["input_tokens", "output_tokens", "cached"]), _NUMBER, max_size=2
            ),
            st.sampled_from([None, [], "x", 5]),
        ),
        MODEL_CALLS: st.one_of(
            _GOOD_CALLS,
            _GOOD_CALLS.map(lambda calls: {**calls, "input_tokens": 5}),
            st.fixed_dictionaries(
                {},
                optional={
                    name: st.one_of(st.integers(0, 12), _NUMBER)
                    for name in ("calls", "attempts", "failed_attempts", "input_tokens")
                },
            ),
            st.sampled_from([None, [1], "x"]),
        ),
    },
)


@st.composite
def _rows(draw: st.DrawFn) -> dict[str, Any]:
    """A row of one of the forms a run holds: gym-failures' saved form (a closing copy among them),
    its form before issue 19, NeMo Gym's own; a success, a failure, a row never saved, or no row."""
    task, rollout = draw(st.integers(0, 3)), draw(st.integers(0, 1))
    form = draw(st.sampled_from(["saved", "old", "nemo_gym"]))
    outcome = draw(st.sampled_from(["success", "failure", "not_persisted", "other"]))
    row: dict[str, Any]
    if form == "nemo_gym":
        row = {"_ng_task_index": task, "_ng_rollout_index": rollout}
        attempt = draw(st.one_of(st.integers(0, 3), st.sampled_from([None, "1", True])))
        if attempt is not None:
            row["_ng_attempt_index"] = attempt
        if outcome == "failure":
            row["_ng_failure_class"] = "agent_run_error"
        elif outcome != "other":
            row.update(reward=1.0, response={"output": []})
    else:
        attempt = draw(st.integers(1, 4))
        row = (
            failure_row(context_limit(), f"{task}:{rollout}", attempt=attempt)
            if outcome == "failure"
            else (success_row(f"{task}:{rollout}", attempt=attempt))
        )
        if outcome == "other":
            del row["result"]
        if draw(st.booleans()):
            row["closed_on_resume"] = True
        row = saved(row) if form == "saved" else row
    if outcome == "not_persisted":
        row["_ng_no_persist"] = True
    row.update(draw(_COST_KEYS))
    return row


def _python_cost(rows: list[dict[str, Any]], max_attempts: int) -> dict[str, Any]:
    """What the summary's cost must say about `rows`, read from `rows.normalized` and `row_cost`."""
    lines: dict[str, list[int]] = defaultdict(lambda: [0] * 7)
    per_attempt: Counter[int] = Counter()
    rollouts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for raw in rows:
        row = normalized(raw, max_attempts)
        if not is_rollout_row(row) or is_not_persisted(row) or row.get("closed_on_resume") is True:
            continue
        cost = row_cost(raw)
        attempt = row.get("attempt")
        groups = ["total"]
        groups += ["failed"] if "failure" in row else []
        groups += ["reruns"] if type(attempt) is int and attempt > 1 else []
        for group in groups:
            line = lines[group]
            line[0] += 1
            if cost.seconds is not None:
                line[1] += micros(cost.seconds)
                line[2] += 1
            for index, tokens in ((3, cost.input_tokens), (5, cost.output_tokens)):
                if tokens is not None:
                    line[index] += tokens
                    line[index + 1] += 1
        if cost.model_attempts is not None:
            assert cost.model_calls is not None
            per_attempt[cost.model_attempts] += 1
            figures = rollouts[str(row["rollout_id"])]
            figures[0] += 1
            figures[1] += cost.model_calls
            figures[2] += cost.model_attempts
    largest = sorted(rollouts.items(), key=lambda item: (-item[1][2], -item[1][0], item[0]))[:10]
    reporting, model_attempts = (
        sum(per_attempt.values()),
        sum(value * count for value, count in per_attempt.items()),
    )
    return {
        "lines": dict(lines),
        "per_attempt_max": max(per_attempt, default=None),
        "model_attempts": model_attempts,
        "per_attempt_mean": round(model_attempts / reporting, 6) if reporting else None,
        "per_rollout_mean": (
            round(sum(figures[2] for figures in rollouts.values()) / len(rollouts), 6) if rollouts else None
        ),
        "largest": [(rollout, *figures) for rollout, figures in largest],
    }


def _sql_cost(summary: Summary) -> dict[str, Any]:
    cost = summary.cost
    assert cost is not None
    lines = {}
    for name in ("total", "failed", "reruns"):
        line = getattr(cost, name)
        if line.attempts:
            lines[name] = [
                line.attempts,
                round((line.seconds or 0) * 1_000_000),
                line.seconds_rows,
                line.input_tokens or 0,
                line.input_tokens_rows,
                line.output_tokens or 0,
                line.output_tokens_rows,
            ]
    amplification = cost.amplification
    # Every failed attempt is in one class, one kind and one root.
    for groups in (cost.failed_by_class, cost.failed_by_kind, cost.failed_by_root_kind):
        assert sum(group.attempts for group in groups) == cost.failed.attempts
    return {
        "lines": lines,
        "per_attempt_max": amplification.per_attempt_max,
        "model_attempts": amplification.model_attempts,
        "per_attempt_mean": amplification.per_attempt_mean,
        "per_rollout_mean": amplification.per_rollout_mean,
        "largest": [
            (item.rollout_id, item.attempts, item.model_calls, item.model_attempts)
            for item in amplification.largest
        ],
    }


# Each example is a DuckDB summary: 20 under `make test`, 500 under `make fuzz`.
@settings(
    max_examples=examples(20, fuzz=500),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(rows=st.lists(_rows(), max_size=10), max_attempts=st.integers(1, 3))
@example(  # a closing copy repeats its last attempt's keys: it is no attempt
    rows=[saved({**success_row("0:0"), "closed_on_resume": True}) | {DURATION_S: 3.0}], max_attempts=3
)
@example(  # a usage figure set to null is a bad figure, not a missing one
    rows=[saved(success_row("0:0")) | {USAGE: {"input_tokens": None, "output_tokens": 5}}], max_attempts=3
)
@example(  # more model attempts in all than the collector's reader takes: absent in both
    rows=[
        saved(success_row("0:0"))
        | {MODEL_CALLS: {"calls": 2000, "attempts": 1_500_000_000, "failed_attempts": 0}}
    ],
    max_attempts=3,
)
@example(  # a huge number of calls never fails the query
    rows=[
        saved(success_row("0:0"))
        | {MODEL_CALLS: {"calls": 2**63 - 1, "attempts": 2**63 - 1, "failed_attempts": 0}}
    ],
    max_attempts=3,
)
def test_the_summarys_sql_reads_every_rows_cost_as_python_reads_it(
    tmp_path: Path, rows: list[dict[str, Any]], max_attempts: int
) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert _sql_cost(summarize([path], max_attempts=max_attempts)) == _python_cost(rows, max_attempts)
