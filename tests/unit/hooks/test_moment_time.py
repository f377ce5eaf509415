"""The moment's own time (issue 27): a spooled moment keeps its
``spooled_at_ms``, a live one takes its arrival; pure parts."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bridges.hooks_common.mapping import elapsed_ms, moment_ms, spooled_ms

NOW = 1_800_000_000_000


def test_a_spooled_moment_keeps_its_spool_time_a_live_one_its_arrival():
    assert moment_ms(NOW, NOW - 5_000) == NOW - 5_000
    assert moment_ms(NOW) == NOW
    assert moment_ms(NOW, None) == NOW


def test_a_spool_time_in_the_future_or_nonsense_is_not_trusted():
    assert moment_ms(NOW, NOW + 86_400_000) == NOW  # a shim clock ahead of ours
    for bad in (0, -1, True, 1.5, "123", [1]):
        assert moment_ms(NOW, bad) == NOW


def test_the_spooled_header_is_a_decimal_unix_ms():
    assert spooled_ms(None) is None
    assert spooled_ms("1700000000123") == 1_700_000_000_123
    assert spooled_ms(" 42 ") == 42
    for bad in ("", "yes", "-5", "1.5", "\u0661\u0662", "9" * 40):  # Arabic-Indic digits too
        assert spooled_ms(bad) is None


def test_elapsed_is_never_negative():
    assert elapsed_ms(1_000, 4_000) == 3_000
    assert elapsed_ms(4_000, 1_000) == 0


@given(st.integers(min_value=1, max_value=NOW), st.one_of(st.none(), st.integers(), st.booleans()))
def test_moment_time_is_positive_and_never_after_arrival(now, spooled):
    at = moment_ms(now, spooled)
    assert 0 < at <= now
