"""Failure reasons normalized (`gym_failures.reporting._reasons`): what varies between two runs of one
failure becomes a placeholder, every ordinary word stays, and the summary's SQL does the same."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gym_failures.failures import AgentFailure
from gym_failures.reporting._reasons import REASON_SCAN_CHARS, normalized_reason, reason_macro
from gym_failures.reporting.summary import summarize
from tests.saved_rows import failure_row, write_jsonl
from tests.strategies import examples


@pytest.mark.parametrize(
    ("first", "second", "normalized"),
    [
        (
            # NeMo Gym's own message for a failed `/run` (`str()` of aiohttp's ClientResponseError).
            "500, message='Internal Server Error', url='http://127.0.0.1:40371/run'",
            "500, message='Internal Server Error', url='http://127.0.0.1:18713/run'",
            "<n>, message='Internal Server Error', url='http://<ip>:<port>/run'",
        ),
        (
            "cannot connect to localhost:8001",
            "cannot connect to localhost:51234",
            "cannot connect to localhost:<port>",
        ),
        ("[::1]:8000 refused", "[::1]:9000 refused", "[<ip>]:<port> refused"),
        (
            "https://api.example.com:443/v1 timed out",
            "https://api.example.com:8443/v1 timed out",
            "https://api.example.com:<port>/v1 timed out",
        ),
        ("10.0.0.7 is down", "192.168.1.20 is down", "<ip> is down"),
        (
            "model_server_error: the model answered 503 (event aB3_x-9QzLmxPqRs)",
            "model_server_error: the model answered 503 (event Zq8-kLmN0pQrStUv)",
            "model_server_error: the model answered <n> (event <id>)",
        ),
        ("event_id=abcdefghijklmno_", "event_id=q-rstuvwxyzabcde", "event_id=<id>"),
        (
            "request 1b4e28ba-2fa1-11d2-883f-0016d3cca427 lost",
            "request 6fa459ea-ee8a-3ca4-894e-db77e160355e lost",
            "request <uuid> lost",
        ),
        ("trace 4bf92f3577b34da6 dropped", "trace 00f067aa0ba902b7 dropped", "trace <hex> dropped"),
        (
            "quota; resets at 2026-07-01 00:00 UTC",
            "quota; resets at 2026-08-15 12:30 UTC",
            "quota; resets at <time> UTC",
        ),
        ("timed out after 60s", "timed out after 120s", "timed out after <n>s"),
        ("used 12.5 GiB of 16 GiB", "used 3.1 GiB of 16 GiB", "used <n> GiB of <n> GiB"),
    ],
)
def test_two_runs_of_one_failure_read_the_same(first: str, second: str, normalized: str) -> None:
    assert normalized_reason(first) == normalized_reason(second) == normalized


@pytest.mark.parametrize(
    "text",
    [
        "the sandbox was killed",
        "ReadTimeoutError",  # 16 letters, camel case
        "responsibilities internationalize",  # 16 letters each
        "the event responsibilities and the id Internationalize",  # 16 letters after `event` and `id`
        "deadbeef accede defaced cafe",  # letters that are hex digits
        "gpt-4o on h100, x86_64 and utf8 with base64 and s3",  # words with digits
        "invalid: responsibilities",
        "model_context_limit: shorten it",
        "provider_quota_exhausted",
        "",
    ],
)
def test_ordinary_words_survive(text: str) -> None:
    assert normalized_reason(text) == text


@given(
    st.lists(st.from_regex(r"[A-Za-z]{1,20}", fullmatch=True), max_size=12),
    st.sampled_from([" ", ", ", ": ", "\n"]),
)
def test_a_text_of_words_is_kept_as_it_is(words: list[str], separator: str) -> None:
    text = separator.join(words)
    assert normalized_reason(text) == text


def test_only_the_first_2000_characters_are_read() -> None:
    assert normalized_reason("x" * 3000) == "x" * REASON_SCAN_CHARS
    assert (
        normalized_reason("y" * (REASON_SCAN_CHARS - 3) + " 12345") == "y" * (REASON_SCAN_CHARS - 3) + " <n>"
    )


def test_reasons_that_differ_only_by_port_are_one_reason_with_a_real_example(tmp_path: Path) -> None:
    rows = [
        failure_row(
            AgentFailure(failure_kind="agent_run_error", failure_reason=f"cannot reach 127.0.0.1:{port}"),
            f"{index}:0",
        )
        for index, port in enumerate((40001, 40002, 51234))
    ]
    (reason,) = summarize([write_jsonl(tmp_path / "rows.jsonl", rows)]).top_reasons
    assert (reason.kind, reason.reason, reason.count, reason.example) == (
        "agent_run_error",
        "cannot reach <ip>:<port>",
        3,
        "cannot reach 127.0.0.1:40001",
    )


# --- the summary's SQL normalizes as the Python does --------------------------------------------


@pytest.fixture(scope="module")
def connection() -> Iterator[duckdb.DuckDBPyConnection]:
    connection = duckdb.connect(":memory:")
    connection.execute(reason_macro("_gf_reason"))
    yield connection
    connection.close()


_PIECES = st.sampled_from(
    [
        "127.0.0.1",
        ":8000",
        "localhost",
        "http://",
        "[::1]",
        "event ",
        "id=",
        "event_id: ",
        "aB3_x-9QzLmxPqRs",
        "abcdefghijklmnop",
        "1b4e28ba-2fa1-11d2-883f-0016d3cca427",
        "4bf92f3577b34da6",
        "0x1F",
        "12.5",
        "60s",
        "512MiB",
        "2026-07-01 00:00",
        "2026-07-01T00:00:00Z",
        " ",
        "-",
        ".",
        "_",
        "'",
        '"',
        "é",
        "words",
    ]
)


@settings(max_examples=examples(200, fuzz=3000), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.one_of(
        st.lists(_PIECES, max_size=12).map("".join), st.text(), st.text(alphabet="0123456789.:-_ abcAB[]/xev")
    )
)
@example("event aB3_x-9QzLmxPqRs event bB3_x-9QzLmxPqRs event cB3_x-9QzLmxPqRs")
@example("1.2.3.4:5 6.7.8.9:10")
def test_the_summarys_sql_normalizes_as_the_python_does(
    connection: duckdb.DuckDBPyConnection, text: str
) -> None:
    found = connection.execute("SELECT _gf_reason(?)", [text]).fetchone()
    assert found is not None
    assert found[0] == normalized_reason(text)
