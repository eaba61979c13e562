"""Restart intensity escalating through two levels; shutdown timeouts."""

from __future__ import annotations

from typing import Any

import pytest

from castor.messages.errors import ActorCrashed, ActorStopped
from castor.supervision import ActorSystem, ChildSpec, RestartIntensityExceeded, supervisor_spec
from castor.supervision.supervisor import StopChild

from .helpers import Block, Boom, Journal, Ping, poll_until, worker

pytestmark = pytest.mark.timeout(30)


def test_intensity_escalates_through_two_levels_to_a_fatal_root():
    journal = Journal()
    mid = supervisor_spec("mid", [ChildSpec("leaf", worker("leaf", journal))], max_restarts=1, within_seconds=60)
    system = ActorSystem([mid], max_restarts=1, within_seconds=60)
    mid_handle = system.lookup("/root/mid")

    def crash_leaf() -> None:
        leaf = system.lookup("/root/mid/leaf")
        with pytest.raises(ActorCrashed):
            leaf.ask(Boom(), timeout=5)

    # Level 1: the leaf restarts once within mid's intensity.
    crash_leaf()
    assert poll_until(
        lambda: system.find("/root/mid/leaf") is not None and system.lookup("/root/mid/leaf").incarnation == 2
    )
    # The second leaf crash exceeds mid (R=1): mid stops its children and fails to root,
    # which restarts mid (its first restart) with a fresh leaf.
    crash_leaf()
    assert poll_until(lambda: mid_handle.incarnation == 2 and system.find("/root/mid/leaf") is not None)
    assert isinstance(mid_handle.last_error, RestartIntensityExceeded)
    fresh_leaf = system.lookup("/root/mid/leaf")
    assert fresh_leaf.ask(Ping(n=1), timeout=5) == ("leaf", 1, 1)
    # Level 2: exhaust mid again -> root sees its second restart in the window (R=1) -> fatal.
    crash_leaf()
    assert poll_until(lambda: fresh_leaf.incarnation == 2 and fresh_leaf.alive)
    crash_leaf()
    assert system.fatal.wait(10)
    assert isinstance(system.fatal_error, RestartIntensityExceeded)
    assert system.root.closed.wait(5)
    # Every actor is stopped and refuses work with a typed error.
    with pytest.raises(ActorStopped):
        fresh_leaf.ask(Ping(n=2), timeout=5)
    assert all(e[0] != "start" or e[2] <= 2 for e in journal.entries)


def test_a_child_that_overruns_its_shutdown_timeout_is_killed_and_shutdown_is_bounded():
    journal = Journal()
    system = ActorSystem(
        [
            ChildSpec("first", worker("first", journal)),
            ChildSpec("stuck", worker("stuck", journal), shutdown_timeout=0.2),
        ]
    )
    stuck = system.lookup("/root/stuck")
    queued = None
    try:
        stuck.tell(Block(key="never"))
        assert journal.event("never:entered").wait(5)
        queued = stuck.ask_pending(Ping(n=1), timeout=10)
        system.shutdown(10)
        # 'stuck' was abandoned (its handler still blocked, no on_terminate: had shutdown waited
        # for the handler, 'stuck' would have stopped cleanly), then 'first' stopped (reverse order).
        ends = [e for e in journal.entries if e[0] == "end"]
        assert ends == [("end", "first", 1, "stopped")]
        with pytest.raises(ActorStopped) as info:
            queued.result()
        assert info.value.may_have_started is False
        assert stuck.snapshot().state == "stopped"
    finally:
        journal.event("never").set()


def test_a_child_past_its_own_intensity_is_given_up_without_failing_its_supervisor():
    journal = Journal()
    system = ActorSystem([
        ChildSpec("looper", worker("looper", journal), max_restarts=2, within_seconds=60),
        ChildSpec("bystander", worker("bystander", journal)),
    ], max_restarts=5, within_seconds=60)
    try:
        looper = system.lookup("/root/looper")
        for _ in range(3):  # two restarts allowed, the third crash gives up on the child
            with pytest.raises(ActorCrashed):
                looper.ask(Boom(), timeout=5)
        assert looper.closed.wait(5)
        with pytest.raises(ActorStopped):
            looper.ask(Ping(n=1), timeout=5)
        assert system.find("/root/looper") is None
        assert not system.fatal.is_set() and system.root.incarnation == 1
        assert system.lookup("/root/bystander").ask(Ping(n=2), timeout=5) == ("bystander", 1, 2)
    finally:
        system.shutdown(10)


def test_on_removed_runs_when_a_child_is_given_up():
    journal = Journal()
    removed: list[str] = []
    system = ActorSystem([ChildSpec("looper", worker("looper", journal), max_restarts=1, within_seconds=60,
                                    on_removed=removed.append)], max_restarts=5, within_seconds=60)
    try:
        looper = system.lookup("/root/looper")
        for _ in range(2):
            with pytest.raises(ActorCrashed):
                looper.ask(Boom(), timeout=5)
        assert looper.closed.wait(5)
        from .helpers import poll_until

        assert poll_until(lambda: len(removed) == 1) and "gave up" in removed[0]
    finally:
        system.shutdown(10)


def _first_and_a_stuck_sibling(journal: Journal) -> tuple[ActorSystem, Any]:
    """``/root/first`` and ``/root/stuck`` under one_for_all; ``stuck`` has 0.2 s to stop, so a
    handler of its that blocks is abandoned when ``first`` crashes."""
    from castor.supervision import Strategy

    system = ActorSystem([
        ChildSpec("first", worker("first", journal)),
        ChildSpec("stuck", worker("stuck", journal), shutdown_timeout=0.2),
    ], strategy=Strategy.ONE_FOR_ALL, max_restarts=5, within_seconds=60)
    return system, system.lookup("/root/stuck")


def test_an_abandoned_incarnation_never_steals_a_message_from_its_successor():
    """A child overruns its shutdown timeout during a sibling restart, is abandoned and relaunched:
    the stuck thread must not take (and drop) a message meant for the new incarnation, and the
    stop left for the old incarnation must not stop the new one."""
    journal = Journal()
    system, stuck = _first_and_a_stuck_sibling(journal)
    try:
        stuck.tell(Block(key="hold"))
        assert journal.event("hold:entered").wait(5)
        with pytest.raises(ActorCrashed):
            system.lookup("/root/first").ask(Boom(), timeout=5)  # one_for_all: stuck is stopped, overruns, abandoned
        from .helpers import poll_until

        assert poll_until(lambda: stuck.incarnation == 2 and stuck.alive)
        journal.event("hold").set()  # the abandoned thread returns from its handler now
        answers = [stuck.ask(Ping(n=i), timeout=5) for i in range(20)]
        assert answers == [("stuck", 2, i) for i in range(20)]
        assert stuck.alive and stuck.incarnation == 2
    finally:
        journal.event("hold").set()
        system.shutdown(10)


def test_the_successor_of_an_abandoned_incarnation_answers_while_the_old_handler_still_blocks():
    """A handler that blocks for ever overruns its shutdown timeout and is cut loose: the next
    incarnation handles messages at once (it waited for the old handler's turn, so every ask to
    it timed out for as long as that handler blocked), and a snapshot shows no message in flight
    but its own."""
    journal = Journal()
    system, stuck = _first_and_a_stuck_sibling(journal)
    try:
        stuck.tell(Block(key="forever"))
        assert journal.event("forever:entered").wait(5)
        with pytest.raises(ActorCrashed):
            system.lookup("/root/first").ask(Boom(), timeout=5)  # one_for_all: stuck is abandoned
        assert poll_until(lambda: stuck.incarnation == 2 and stuck.alive)
        assert stuck.snapshot().mailbox.in_flight is None  # the cut-loose handler is not the successor's
        assert stuck.ask(Ping(n=1), timeout=5) == ("stuck", 2, 1)
    finally:
        journal.event("forever").set()
        system.shutdown(10)


def test_a_supervisor_cut_loose_mid_handler_still_stops_its_children():
    """A shutdown whose root overruns its timeout (busy stopping a child slower than that) cuts the
    root loose: once the handler it was in returns, its other children are stopped all the same.
    They kept running for ever, answering asks after ``shutdown`` had returned."""
    journal = Journal()
    system = ActorSystem([
        ChildSpec("kept", worker("kept", journal)),
        ChildSpec("slow", worker("slow", journal), shutdown_timeout=1.0),
    ])
    kept = system.lookup("/root/kept")
    slow = system.lookup("/root/slow")
    try:
        slow.tell(Block(key="hold"))
        assert journal.event("hold:entered").wait(5)
        system.root.tell(StopChild(id="slow"))  # the root now waits up to 1 s for 'slow'
        assert poll_until(lambda: slow.state.value == "stopping")
        assert system.shutdown(0.1) is False  # the root is cut loose in that handler
        assert poll_until(lambda: kept.closed.is_set(), timeout=5)
        assert ("end", "kept", 1, "stopped") in journal.entries
        with pytest.raises(ActorStopped):
            kept.ask(Ping(n=1), timeout=1)
    finally:
        journal.event("hold").set()
        system.shutdown(5)


def test_spawn_after_shutdown_is_actor_stopped_not_not_found():
    """Once the system is shut down nothing starts again: a spawn answers ``actor_stopped`` (the
    runtime stopped), never ``not_found`` (which says the caller named a wrong supervisor)."""
    system = ActorSystem([supervisor_spec("mid", [])])
    assert system.shutdown(5)
    with pytest.raises(ActorStopped) as stopped:
        system.spawn(ChildSpec("late", worker("late", Journal())), under="/root/mid")
    assert stopped.value.data == {"path": "/root/mid", "state": "shut_down"}


def test_open_session_after_runtime_shutdown_is_actor_stopped(tmp_path):
    from castor.runtime import HarnessLink, Runtime, RuntimeSettings, SessionInfo

    runtime = Runtime(RuntimeSettings())
    runtime.shutdown(5)
    with pytest.raises(ActorStopped) as stopped:
        runtime.open_session(SessionInfo(session_id="late", cwd=str(tmp_path), trusted=True),
                             HarnessLink(agent=None, session_log=None, ui=None))
    assert stopped.value.data["state"] == "shut_down"
    assert not runtime.has_session("late")
