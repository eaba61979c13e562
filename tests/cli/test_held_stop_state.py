"""The held stop's state (castor.cli.common), in process: the moments a real signal hits too
rarely for a process test (tests/adversarial/test_demo_stop_held_by_a_hung_handler.py has those).

A second stop that comes while the first is held but after the main thread has left the actor
code (the watch, which looks every few milliseconds, has not seen it yet) is no reason to cut the
command loose: the held stop is taken there and then, as the watch would have handed it back."""

from __future__ import annotations

import signal
import threading

import pytest

from castor.cli import common
from castor.cli.common import Terminated, stopped_as_by_ctrl_c

pytestmark = pytest.mark.timeout(30)


class _CutLoose(Exception):
    pass


def _no_cut_loose(monkeypatch) -> None:
    def cut_loose(signum, frame, when):
        raise _CutLoose(when)

    monkeypatch.setattr(common, "_cut_loose", cut_loose)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signal handlers: main thread")
def test_a_second_stop_once_the_actor_code_was_left_takes_the_held_stop_instead_of_cutting_loose(monkeypatch):
    _no_cut_loose(monkeypatch)
    with pytest.raises(Terminated), stopped_as_by_ctrl_c(hold_limit_s=None):
        handler = signal.getsignal(signal.SIGINT)
        assert callable(handler)
        released = threading.Event()
        with common._STOPS.lock:  # as _hold_stop leaves it, without its watch: a SIGTERM held
            common._STOPS.hold, common._STOPS.held, common._STOPS.released = (
                common._Hold.HELD, signal.SIGTERM, released)
        handler(signal.SIGINT, None)  # a Ctrl-C, outside any actor code: the held SIGTERM is raised
    assert released.is_set() and common._STOPS.hold is common._Hold.NONE and common._STOPS.held is None


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signal handlers: main thread")
def test_the_end_of_the_command_ends_a_hold_and_its_watch(monkeypatch):
    _no_cut_loose(monkeypatch)
    released = threading.Event()
    with stopped_as_by_ctrl_c(hold_limit_s=5.0, stopped_line="castor demo: stopped"):
        assert (common._STOPS.limit_s, common._STOPS.stopped_line) == (5.0, "castor demo: stopped")
        with common._STOPS.lock:
            common._STOPS.hold, common._STOPS.held, common._STOPS.released = (
                common._Hold.HELD, signal.SIGTERM, released)
    assert released.is_set() and common._STOPS.hold is common._Hold.NONE
    assert (common._STOPS.limit_s, common._STOPS.stopped_line) == (None, None)
