"""An Icarus worker call without ``timeout=`` still has a deadline: the session's ``timeoutMs``
(``IcarusWorkerClient(timeout_ms=...)``, default ``DEFAULT_TIMEOUT_MS``), plus ``ASK_GRACE_S`` on
the ask that carries it. The hook facade's events have their own default bound."""

from __future__ import annotations

import math
import time

import pytest

from castor.actors.icarus.hook_controller import HookClient
from castor.actors.icarus.worker import ASK_GRACE_S, DEFAULT_TIMEOUT_MS, IcarusWorkerClient, icarus_worker_spec
from castor.adapters.icarus.worker_process import next_request_id
from castor.domain.icarus.settings import IcarusSettings
from castor.messages.errors import Timeout
from castor.supervision import ActorSystem


class _RecordingHandle:
    """Stands in for the actor's handle: records what each ask carries, answers at once."""

    def __init__(self) -> None:
        self.asks: list[tuple[object, float | None]] = []
        self.incarnation = 1
        self.state = "running"

    def ask(self, message, *, timeout=None):
        self.asks.append((message, timeout))
        reply = getattr(message, "reply", None)
        if reply is not None:  # a HarnessEvent: the controller answers its future (nothing to inject)
            reply.set_result(None)
        return "answered"

    def ask_pending(self, message, *, timeout=None):
        self.asks.append((message, timeout))
        return None


def test_a_call_without_timeout_carries_the_default_call_deadline_and_a_bounded_ask():
    assert math.isfinite(DEFAULT_TIMEOUT_MS) and 0 < DEFAULT_TIMEOUT_MS <= 120_000
    assert IcarusSettings(icarus_dir="/x", fabric_dir="/y").timeout_ms == DEFAULT_TIMEOUT_MS  # nothing set
    handle = _RecordingHandle()
    client = IcarusWorkerClient(handle)  # type: ignore[arg-type]  # a stand-in handle
    before = time.monotonic()
    assert client.call("hooks", "counter") == "answered"
    client.submit("hooks", "counter")
    after = time.monotonic()
    default_s = DEFAULT_TIMEOUT_MS / 1000
    for message, ask_timeout in handle.asks:
        assert before + default_s <= message.deadline <= after + default_s
        assert ask_timeout == default_s + ASK_GRACE_S
    configured = _RecordingHandle()
    IcarusWorkerClient(configured, timeout_ms=1500).call("hooks", "counter")  # type: ignore[arg-type]  # a stand-in handle
    assert configured.asks[0][1] == 1.5 + ASK_GRACE_S


@pytest.mark.timeout(30)
def test_a_call_without_timeout_ends_timeout_at_the_configured_call_deadline(harness):
    system = ActorSystem()
    try:
        handle = system.spawn(icarus_worker_spec("icarus-worker", lambda: harness.worker(harness.launch()),
                                                 next_request_id, timeout_ms=300))
        client = IcarusWorkerClient(handle, timeout_ms=300)
        assert client.call("hooks", "counter", timeout=20) == 1  # the worker's cold start gets its own bound
        with pytest.raises(Timeout) as info:
            client.call("hooks", "sleep", kwargs={"seconds": 20, "tag": "slow"})  # no timeout=
        assert info.value.may_have_started is True
    finally:
        system.shutdown(timeout=10)


def test_a_hook_event_without_timeout_carries_the_facade_default_bound():
    handle = _RecordingHandle()
    hooks = HookClient(handle)  # type: ignore[arg-type]  # a stand-in handle
    assert math.isfinite(hooks.default_timeout) and 0 < hooks.default_timeout <= 120
    hooks.event("session_start", {})
    assert handle.asks[0][1] == hooks.default_timeout
