"""The cheap timestamp formatter writes exactly what ``datetime`` writes."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from castor.domain.timestamps import iso_now_ms, iso_utc, iso_utc_ms

pytestmark = pytest.mark.timeout(60)


def _micro(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat().replace("+00:00", "Z")


def _milli(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


EDGES = [0.0, 1.0, 1796131673.0, 1796131673.5, 1796131673.0000005, 1796131673.0000015, 1796131673.9999995,
         1796131673.9999994, 1796131673.999, 1796131673.0009999, 1796131673.000001, 951782400.25,  # a leap day
         4102444799.999999, 1e9 + 0.1234565]


@pytest.mark.parametrize("t", EDGES)
def test_edges_match_datetime(t):
    assert iso_utc(t) == _micro(t)
    assert iso_utc_ms(t) == _milli(t)


@settings(max_examples=2000, deadline=None)
@given(st.floats(min_value=0, max_value=4_102_444_800, allow_nan=False, allow_infinity=False))
def test_any_time_matches_datetime(t):
    assert iso_utc(t) == _micro(t)
    assert iso_utc_ms(t) == _milli(t)


def test_a_cached_second_is_not_reused_for_another_one():
    # Alternate between seconds (and a day boundary) so the one-second cache is replaced each time.
    for t in (1796131673.25, 1796131674.75, 1796131673.5, 1796169599.999, 1796169600.001):
        assert iso_utc(t) == _micro(t) and iso_utc_ms(t) == _milli(t)


def test_now_is_the_current_time():
    before = time.time()
    stamp = iso_now_ms()
    after = time.time()
    assert _milli(before - 0.001) <= stamp <= _milli(after)
