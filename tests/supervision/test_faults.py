"""Every fault kind, deterministically."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

from castor.messages.errors import ActorCrashed
from castor.supervision import ActorHandle, ActorKilled, ActorSystem, ChildSpec, InjectedCrash, faults

from .helpers import Block, Journal, Ping, poll_until, process_gone, worker
from .test_retirement import ProcessOwner, ReadChild

pytestmark = pytest.mark.timeout(15)


@contextlib.contextmanager
def _one_worker(journal: Journal) -> Iterator[ActorHandle]:
    """A system of one worker ``/root/w`` journaling into ``journal``; shut down after the block."""
    system = ActorSystem([ChildSpec("w", worker("w", journal))])
    try:
        yield system.lookup("/root/w")
    finally:
        system.shutdown(10)


def test_kill_crashes_the_actor_at_its_next_boundary_and_the_supervisor_restarts_it():
    journal = Journal()
    with _one_worker(journal) as handle:
        handle.tell(Block(key="gate"))
        assert journal.event("gate:entered").wait(5)
        queued = handle.ask_pending(Ping(n=1), timeout=5)
        faults.kill(handle)
        journal.event("gate").set()
        # The kill jumps the queue: the queued ping is handled by the *next* incarnation.
        assert queued.result() == ("w", 2, 1)
        assert isinstance(handle.last_error, ActorKilled)
        assert ("end", "w", 1, "crashed") in journal.entries


def test_a_kill_or_retirement_with_no_incarnation_to_carry_it_out_says_so():
    """A retired (dormant) actor runs no incarnation: a kill or a retirement of it is refused,
    ``False``, not reported done and dropped; the next send still starts a fresh incarnation."""
    journal = Journal()
    with _one_worker(journal) as handle:
        handle.retire("drill")
        assert poll_until(lambda: not handle.alive)
        assert faults.kill(handle) is False
        assert handle.retire("again") is False
        assert handle.ask(Ping(n=1), timeout=5) == ("w", 2, 1)  # new demand, not killed
        assert faults.kill(handle) is True
        assert poll_until(lambda: handle.incarnation == 3)


def test_crash_next_of_a_given_type_crashes_only_on_that_type():
    journal = Journal()
    with _one_worker(journal) as handle:
        faults.crash_next(handle, "test.boom-never-sent")
        faults.crash_next(handle, "test.ping")
        with pytest.raises(ActorCrashed) as info:
            handle.ask(Ping(n=1), timeout=5)
        assert isinstance(info.value.__cause__, InjectedCrash)
        assert journal.count("ping") == 0  # the handler never ran
        assert handle.ask(Ping(n=2), timeout=5) == ("w", 2, 2)
        assert handle.restarts == 1


def test_delay_next_holds_the_message_in_flight_visibly():
    journal = Journal()
    with _one_worker(journal) as handle:
        faults.delay_next(handle, 0.5, "test.ping")
        pending = handle.ask_pending(Ping(n=3), timeout=5)
        assert poll_until(lambda: handle.snapshot().mailbox.in_flight is not None)
        flight = handle.snapshot().mailbox.in_flight
        assert flight.message_type == "test.ping" and flight.is_ask
        assert journal.count("ping") == 0  # still delayed
        assert pending.result() == ("w", 1, 3)
        assert handle.restarts == 0


def test_an_injected_delay_says_so_and_when_it_ends_not_that_the_handler_hangs():
    """A drill's ``delay_next 120`` read "handling materia.session.list for 65.8 s" in inspect and
    the console: a handler hanging, as far as anyone watching could tell. The delay says what it
    is and when it ends while it lasts; then the message's own handling shows."""
    journal = Journal()
    with _one_worker(journal) as handle:
        faults.delay_next(handle, 3.0, "test.ping")
        pending = handle.ask_pending(Ping(n=3), timeout=10)
        assert poll_until(lambda: (handle.snapshot().activity or None) is not None
                          and handle.snapshot().activity.kind == "fault_delay")
        activity = handle.snapshot().activity
        assert activity.text == "injected delay of 3s before handling test.ping", activity
        assert 0 < activity.deadline_in_s <= 3.0 and activity.data == {"seconds": 3.0, "message_type": "test.ping"}
        assert pending.result() == ("w", 1, 3)
        assert poll_until(lambda: handle.snapshot().activity.kind == "idle")


def test_kill_process_kills_the_owned_process_tree_and_the_actor_sees_it_through_its_io():
    journal = Journal()
    system = ActorSystem([ChildSpec("owner", lambda: ProcessOwner(journal))])
    try:
        handle = system.lookup("/root/owner")
        reading = handle.ask_pending(ReadChild(), timeout=10)
        assert journal.event("reading").wait(5)
        pids = faults.kill_process(handle)
        assert len(pids) == 1
        assert reading.result() == b""  # the pipe closed because the process died
        assert poll_until(lambda: process_gone(pids[0]))
    finally:
        system.shutdown(10)


def test_kill_process_trees_reaches_grandchildren():
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess,sys,time; p=subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']);"
         "print(p.pid, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )
    grandchild = int(child.stdout.readline())
    faults.kill_process_trees([child.pid])
    child.wait(5)
    assert poll_until(lambda: process_gone(grandchild))
