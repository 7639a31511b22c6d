"""The HTML report: what it holds, what it leaves out, and how it lays out in a real browser.

The layout tests render the page in headless Chromium (Debian's `chromium`; `make unit` installs it
when missing) inside an iframe of the phone's or the desktop's width, and read the page's scroll
width and the size of its smallest chart text from the DOM. Chromium's own window cannot be narrower
than 500 px in headless mode, hence the iframe. A missing Chromium fails the test, never skips it.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from gym_failures import gate as acceptance
from gym_failures.failures import AgentFailure, ModelFailure, ResourcesServerFailure
from gym_failures.reporting.explain import longest_chain
from gym_failures.reporting.html import render_html
from gym_failures.reporting.summary import Summary, summarize
from tests.saved_rows import (
    failure_row,
    model_503_chain,
    oom_chain,
    quota_chain,
    raised,
    success_row,
    write_jsonl,
)

# Long words a phone cannot fit on one line: a namespaced kind and an unbroken token in a reason.
LONG_KIND = "my_environment_server:verifier_answer_extraction_failed_with_an_unexpected_layout"
LONG_REASON = "the judge replied " + "x" * 300 + " and nothing else"


def _run(tmp_path: Path) -> list[Path]:
    failures = [
        failure_row(model_503_chain(), "4:0", attempt=1, final=False),
        failure_row(model_503_chain(), "4:0", attempt=2, final=False),
        failure_row(model_503_chain(), "4:0", attempt=3, final=True),
        failure_row(oom_chain(), "5:0"),
        failure_row(quota_chain(), "7:0", attempt=2),
        failure_row(
            raised(
                ResourcesServerFailure(
                    failure_kind=LONG_KIND, failure_reason=LONG_REASON, stage="verification"
                ),
                ModelFailure(failure_kind="judge_failed", failure_reason="judge 502", http_status=502),
            ),
            "8:0",
        ),
    ]
    # What the attempts cost, on most rows: the cost section's tables lay out on a phone too.
    for index, row in enumerate(failures[2:]):
        row.update(
            _gf_duration_s=12.5 + index,
            _gf_usage={"input_tokens": 1200 * index, "output_tokens": 30},
            _gf_model_calls={"calls": 2, "attempts": 9 + index, "failed_attempts": 7},
        )
    rows = tmp_path / "rollouts.jsonl"
    write_jsonl(rows, [success_row(f"{index}:0") for index in range(4)])
    write_jsonl(tmp_path / "rollouts_failures.jsonl", failures)
    (tmp_path / "rollouts.manifest.json").write_text(json.dumps({"expected_rollouts": 9}))
    return [rows, tmp_path / "rollouts_failures.jsonl"]


def test_the_report_says_what_failures_cost(report: str) -> None:
    words = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", report.replace("<wbr>", ""))).split())
    assert "What failures cost" in words
    assert (
        "failed attempts 6 60.0% 56.000 (4 of 6) 100.0% 7,200 (4 of 6) 120 (4 of 6) 100.0% 42 (4 of 6)"
        in words
    )
    assert "Largest amplifications (model attempts per rollout)" in words


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> str:
    files = _run(tmp_path_factory.mktemp("run"))
    verdict = acceptance.check(acceptance.read_coverage(files), acceptance.GateThresholds())
    return render_html(summarize(files), verdict=verdict, explanation=longest_chain(files))


def _summary_of(tmp_path: Path, rows: list[dict[str, Any]]) -> Summary:
    return summarize([write_jsonl(tmp_path / "rows.jsonl", rows)])


# --- content -----------------------------------------------------------------------------------


def test_the_report_holds_the_gates_verdict_and_reasons(report: str) -> None:
    assert '<span class="failed">FAILED</span> · 4 of 9 scored' in report
    assert "scored share 44.44% is below the minimum 95.00%" in report


def test_the_report_holds_the_longest_cause_tree_with_its_1_based_line(report: str) -> None:
    section = report[report.index("The failed attempt with the longest cause chain") :]
    assert "rollouts_failures.jsonl:3</code> rollout 4:0 · attempt 3 · failure · final" in section
    assert section.index("agent_request_failed") < section.index("model_server_error")
    assert section.index("model_server_error") < section.index("transport_timeout")


def test_the_report_is_a_phone_page_with_scalable_charts(report: str) -> None:
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in report
    charts = re.findall(r"<svg [^>]*>", report)
    assert len(charts) == 4  # by class, kind and root cause, and over attempts
    for chart in charts:
        assert "viewBox=" in chart
        assert not re.search(r'\swidth="', chart)
    for start in (match.start() for match in re.finditer("<svg", report)):
        ElementTree.fromstring(report[start : report.index("</svg>", start) + len("</svg>")])


def test_of_which_rows_are_indented(report: str) -> None:
    assert '<tr class="sub"><td>of which recovered from failures</td>' in report
    assert '<tr class="sub"><td>of which final</td>' in report


def test_a_run_without_failures_draws_no_empty_chart(tmp_path: Path) -> None:
    page = render_html(_summary_of(tmp_path, [success_row("0:0")]))
    assert "<svg" not in page
    assert "No failure rows: nothing to chart." in page
    assert "By HTTP status" not in page


def test_a_grouping_with_only_none_values_is_left_out(tmp_path: Path) -> None:
    failure = AgentFailure(failure_kind="agent_run_error", failure_reason="no answer")
    page = render_html(_summary_of(tmp_path, [failure_row(raised(failure))]))
    assert "No failure row names its HTTP status." in page
    assert "<td>(none)</td>" not in page


def test_failures_without_a_reason_draw_no_empty_reasons_table(tmp_path: Path) -> None:
    failure = AgentFailure(failure_kind="agent_limit", stage="agent")
    page = render_html(_summary_of(tmp_path, [failure_row(failure, "0:0")]))
    assert "<h2>Most common reasons</h2>\n<p>No failure row gives a reason.</p>" in page


# --- layout in a real browser ------------------------------------------------------------------

_PROBE = """<script>
const frame = document.getElementById('page');
frame.addEventListener('load', () => {
  const root = frame.contentDocument.documentElement;
  let smallest = Infinity;
  for (const text of frame.contentDocument.querySelectorAll('svg text')) {
    const height = text.getBoundingClientRect().height;
    if (height > 0) smallest = Math.min(smallest, height);
  }
  const out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = JSON.stringify({scrollWidth: root.scrollWidth, clientWidth: root.clientWidth,
                                    smallestChartText: smallest});
  document.body.appendChild(out);
});
</script>"""


def _layout(page: str, width: int) -> dict[str, float]:
    """The page's scroll and client width, and its smallest chart text's height, at `width` CSS px."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("chromium is not installed: `make unit` installs it (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="gym-failures-chromium-") as scratch:
        wrapper = Path(scratch) / "wrapper.html"
        wrapper.write_text(
            '<!DOCTYPE html><html><body style="margin:0">'
            f'<iframe id="page" style="border:0;width:{width}px;height:900px" '
            f'srcdoc="{html.escape(page, quote=True)}"></iframe>{_PROBE}</body></html>',
            encoding="utf-8",
        )
        flags = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={scratch}/profile",
            f"--window-size={width + 100},1000",
        ]
        done = subprocess.run(
            [chromium, *flags, "--dump-dom", wrapper.as_uri()], capture_output=True, text=True, timeout=120
        )
    found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout)
    assert found is not None, done.stderr[-2000:]
    layout: dict[str, float] = json.loads(html.unescape(found.group(1)))
    return layout


@pytest.mark.parametrize("width", [375, 1400])
def test_the_report_has_no_horizontal_overflow(report: str, width: int) -> None:
    layout = _layout(report, width)
    assert layout["scrollWidth"] <= layout["clientWidth"], layout


def test_chart_text_stays_readable_on_a_phone(report: str) -> None:
    assert _layout(report, 375)["smallestChartText"] >= 10


def test_the_fixed_width_charts_of_before_overflowed_a_phone(report: str) -> None:
    """The check can fail: the same page with one chart drawn 820 px wide, as before, overflows."""
    fixed = report.replace('class="chart" viewBox="0 0 400', 'width="820" viewBox="0 0 400', 1)
    layout = _layout(fixed, 375)
    assert layout["scrollWidth"] > layout["clientWidth"]


def test_the_report_holds_the_gates_outcomes_by_kind_and_its_notes(tmp_path: Path) -> None:
    from tests.cli.invoke import run_cli
    from tests.saved_rows import responses_object

    truncated = responses_object(text="The", status="incomplete", incomplete_reason="max_output_tokens")
    rows = [success_row(f"{index}:0", response=truncated) for index in range(3)]
    rows += [success_row(f"{index}:0", response=responses_object(text=None)) for index in range(3, 5)]
    degraded = success_row("5:0")
    degraded["failure_kind"] = "judge_failed"
    masked = success_row("6:0")
    masked["mask_sample"] = True
    rows += [degraded, masked, failure_row(oom_chain(), "7:0", attempt=1, final=False)]
    files = [write_jsonl(tmp_path / "rollouts.jsonl", rows)]
    _, gate_text, _ = run_cli("gate", *files)
    page = tmp_path / "report.html"
    run_cli("summarize", *files, "--html", page)
    text = html.unescape(re.sub(r"<[^>]+>", " ", page.read_text().replace("<wbr>", "")))
    words = " ".join(text.split())
    for kind, count in (("truncated_answer", 3), ("empty_answer", 2)):
        assert re.search(rf"{kind}\s*│\s*{count}", gate_text)
        assert f"{kind} {count}" in words
    assert "Outcomes by kind" in words
    assert "Degraded (scored, a failure kind named): judge_failed 1" in words
    assert "degraded (scored, a failure kind named): judge_failed 1" in gate_text
    assert "0 retried attempts (not outcomes); 1 failed attempt not retried yet" in words
    assert "masked 1" in words
