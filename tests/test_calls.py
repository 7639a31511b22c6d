"""The call identity a request names (`gym_failures.calls`): each reader at its bounds, and any input
read or refused, never raised on (property tests); `logical_call()`'s numbering."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gym_failures.calls import (
    CALL_ATTEMPT_HEADER,
    CALL_ID_HEADER,
    MAX_CALL_ATTEMPT,
    MAX_CALL_ID,
    call_attempt_of,
    call_headers,
    call_id_of,
    current_call,
    logical_call,
    new_call_id,
)


def test_a_call_id_at_its_bound() -> None:
    assert call_id_of("a" * MAX_CALL_ID) == "a" * MAX_CALL_ID
    assert call_id_of("a" * (MAX_CALL_ID + 1)) is None
    assert call_id_of("") is None
    assert call_id_of(b"abc") == "abc"
    for refused in ("a b", "caf\u00e9", "a\tb", "a\x7fb", b"\xff", 7, None):
        assert call_id_of(refused) is None


def test_an_attempt_number_at_its_bounds() -> None:
    assert call_attempt_of("1") == 1
    assert call_attempt_of(str(MAX_CALL_ATTEMPT)) == MAX_CALL_ATTEMPT
    assert call_attempt_of(str(MAX_CALL_ATTEMPT + 1)) is None
    for refused in ("0", "-1", "1.0", " 1", "", "\u0661", "99999999", b"\xff", 1, None):
        assert call_attempt_of(refused) is None


@given(st.one_of(st.text(max_size=200), st.binary(max_size=200)))
def test_any_call_id_is_read_or_refused(value: str | bytes) -> None:
    read = call_id_of(value)
    if read is not None:
        assert 0 < len(read) <= MAX_CALL_ID
        assert read.isascii()
        assert read.isprintable()
        assert " " not in read


@given(st.one_of(st.text(max_size=12), st.binary(max_size=12)))
def test_any_attempt_number_is_read_or_refused(value: str | bytes) -> None:
    read = call_attempt_of(value)
    assert read is None or 1 <= read <= MAX_CALL_ATTEMPT


def test_a_logical_call_numbers_its_attempts_and_ends_with_its_block() -> None:
    assert call_headers() == {}
    with logical_call() as call:
        assert current_call() is call
        assert call_headers() == {CALL_ID_HEADER: call.call_id, CALL_ATTEMPT_HEADER: "1"}
        assert call_headers()[CALL_ATTEMPT_HEADER] == "2"
        with logical_call("inner-call") as inner:
            assert current_call() is inner
        assert current_call() is call
    assert current_call() is None
    assert call_id_of(new_call_id()) is not None


def test_a_call_id_that_is_no_id_is_refused() -> None:
    with pytest.raises(ValueError, match="printable ASCII"), logical_call("not an id"):
        pass
