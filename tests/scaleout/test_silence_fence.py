"""SilenceFence: a cast host's watch on the serving process's drains (no Ray needed)."""

from __future__ import annotations

import threading
import time

import pytest

from castor.scaleout.host import SilenceFence

pytestmark = pytest.mark.timeout(30)


def test_it_fires_once_after_the_silence_and_not_while_it_is_heard():
    fired = threading.Event()
    calls: list[float] = []

    def on_silence() -> None:
        calls.append(time.monotonic())
        fired.set()

    started = time.monotonic()
    fence = SilenceFence(0.4, on_silence)
    deadline = started + 1.2
    while time.monotonic() < deadline:  # drained every 50 ms for 1.2 s: three silences' worth
        fence.heard()
        assert not fired.wait(0.05)
    assert fired.wait(2.0)
    assert calls[0] - deadline >= 0.4 - 0.05  # counted from the last drain, not from the start
    threading.Event().wait(0.6)  # a second silence's worth: it fired once, and is done
    assert len(calls) == 1


def test_a_stopped_fence_never_fires():
    fired = threading.Event()
    fence = SilenceFence(0.2, fired.set)
    fence.stop()
    assert not fired.wait(0.6)
