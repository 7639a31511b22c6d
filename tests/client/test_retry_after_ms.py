"""`retry-after-ms`, the sub-second hint OpenAI's and Anthropic's APIs send beside `Retry-After`."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gym_failures.client._reply import retry_after_s
from gym_failures.failures import MAX_RETRY_AFTER_S


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1500", 1.5),
        ("250.5", 0.2505),
        (" 40 ", 0.04),
        ("0", 0.0),
        (".5", 0.0005),
        (str(int(MAX_RETRY_AFTER_S * 1000)), MAX_RETRY_AFTER_S),  # at the bound
        (str(int(MAX_RETRY_AFTER_S * 1000) + 1), MAX_RETRY_AFTER_S),  # past it
        ("9" * 400, MAX_RETRY_AFTER_S),
    ],
)
def test_retry_after_ms_is_read_in_seconds_and_bounded(value: str, expected: float) -> None:
    assert retry_after_s({"retry-after-ms": value, "Retry-After": "9"}) == pytest.approx(expected)


@pytest.mark.parametrize("value", ["", "-5", "nan", "inf", "1e3", "1_000", "²", "1.2.3", ".", "0x10"])
def test_a_retry_after_ms_that_is_no_number_falls_back_to_retry_after(value: str) -> None:
    assert retry_after_s({"retry-after-ms": value, "Retry-After": "9"}) == 9.0
    assert retry_after_s({"retry-after-ms": value}) is None


@given(value=st.text(st.characters(exclude_categories=())))
def test_retry_after_ms_never_raises(value: str) -> None:
    wait = retry_after_s({"retry-after-ms": value})
    assert wait is None or 0.0 <= wait <= MAX_RETRY_AFTER_S


@given(milliseconds=st.integers(min_value=0, max_value=10**30))
def test_retry_after_ms_of_whole_milliseconds_is_their_seconds_within_the_bound(milliseconds: int) -> None:
    assert retry_after_s({"retry-after-ms": str(milliseconds)}) == pytest.approx(
        min(milliseconds / 1000, MAX_RETRY_AFTER_S)
    )
