"""Every request castor sends the harness has a deadline, also when the caller names none.

``Connection.call`` without ``timeout=`` takes ``ConnectionSettings.default_call_timeout``;
``WireHarness`` passes its own bound on every request (``UI_DEADLINE_S`` for ``model.list`` when
the caller gives no deadline). The peer here is a real pipe that never answers.
"""

from __future__ import annotations

import math
import os
import time

import pytest

from castor.endpoint import ConnectionSettings, Dispatcher, harness_link
from castor.endpoint.connection import Connection
from castor.endpoint.transport import PipeTransport
from castor.messages.errors import Timeout
from castor.runtime import RuntimeSettings


@pytest.fixture
def silent_peer():
    """A Connection whose peer reads nothing and answers nothing; call it with settings."""
    made: list[tuple[Connection, int, int]] = []

    def make(**settings) -> Connection:
        to_peer_r, to_peer_w = os.pipe()
        from_peer_r, from_peer_w = os.pipe()
        conn = Connection(PipeTransport(from_peer_r, to_peer_w, peer="silent"), Dispatcher(),
                          settings=ConnectionSettings(**settings), name="to-silent-peer").start()
        made.append((conn, to_peer_r, from_peer_w))
        return conn

    yield make
    for conn, to_peer_r, from_peer_w in made:
        conn.close("test over")
        os.close(to_peer_r)
        os.close(from_peer_w)


def test_a_call_without_timeout_carries_the_connection_default_deadline(silent_peer):
    default = ConnectionSettings().default_call_timeout
    assert math.isfinite(default) and 0 < default <= 60
    conn = silent_peer()
    before = time.monotonic()
    pending = conn.call_async("never.answered", {})
    after = time.monotonic()
    assert before + default <= pending.deadline <= after + default


@pytest.mark.timeout(30)
def test_a_call_without_timeout_ends_timeout_at_the_configured_default(silent_peer):
    conn = silent_peer(default_call_timeout=0.2)
    with pytest.raises(Timeout) as info:
        conn.call("never.answered", {})
    assert info.value.may_have_started is True  # sent: the peer may be working on it


class _Spy:
    """Wraps the real connection and records the timeout each request carries."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.timeouts: list[tuple[str, float | None]] = []

    def call(self, method, params=None, *, timeout=None):
        self.timeouts.append((method, timeout))
        if timeout is None or timeout > 1:  # fail now rather than wait out a missing bound
            raise AssertionError(f"{method} sent without the expected short deadline: {timeout!r}")
        return self.conn.call(method, params, timeout=timeout)

    def notify(self, method, params=None):
        return self.conn.notify(method, params)


@pytest.mark.timeout(30)
def test_every_harness_request_carries_a_finite_deadline_also_without_one_from_the_caller(silent_peer,
                                                                                          monkeypatch):
    assert math.isfinite(harness_link.UI_DEADLINE_S) and 0 < harness_link.UI_DEADLINE_S <= 60
    monkeypatch.setattr(harness_link, "UI_DEADLINE_S", 0.2)
    spy = _Spy(silent_peer(default_call_timeout=3600))  # a dropped bound would wait for an hour
    harness = harness_link.WireHarness(spy, "s1")  # type: ignore[arg-type]  # a recording stand-in connection
    with pytest.raises(Timeout):
        harness.list_models()  # no deadline from the caller
    with pytest.raises(Timeout):
        harness.context_usage(0.2)
    with pytest.raises(Timeout):
        harness.append_entry("castor.test", {}, time.monotonic() + 0.2)
    assert [m for m, _ in spy.timeouts] == ["model.list", "session.context_usage", "session.append_entry"]
    assert spy.timeouts[0][1] == 0.2
    assert all(t is not None and 0 < t <= 0.2 for _m, t in spy.timeouts), spy.timeouts


def test_the_runtime_bounds_on_harness_requests_are_finite_by_default():
    settings = RuntimeSettings()
    for value in (settings.compaction_timeout_s, settings.context_usage_timeout_s, settings.session_open_timeout_s):
        assert math.isfinite(value) and value > 0


@pytest.mark.timeout(10)
def test_a_model_entry_castor_cannot_read_is_left_out_not_the_whole_list():
    """One entry of ``model.list`` whose ``base_url`` was no string (a harness's odd model) made the
    whole answer fail validation: the filter then saw no model at all (``provider_error``). Such an
    entry is left out (castor cannot tell whether it is local), the others stay."""

    class _Answers:
        def call(self, method, params=None, *, timeout=None):
            assert method == "model.list"
            return {"models": [{"provider": "odd", "id": "m1", "base_url": 5},
                               {"provider": "odd", "id": "m2", "base_url": {"url": "http://127.0.0.1:1"}},
                               {"provider": "local", "id": "m3", "base_url": "http://127.0.0.1:11434"},
                               {"provider": "remote", "id": "m4"}, {"id": "no-provider"}, "not a map"]}

    harness = harness_link.WireHarness(_Answers(), "s1")  # type: ignore[arg-type]  # a stand-in connection
    models = harness.list_models(time.monotonic() + 1)
    assert [(m.provider, m.id) for m in models] == [("local", "m3"), ("remote", "m4")]
    assert models[0].local and not models[1].local
