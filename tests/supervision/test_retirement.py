"""Retirement: owned processes die, the queue is rejected, nothing is replayed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from castor.messages.base import Message
from castor.messages.errors import ActorStopped, Retired, WorkerRetired
from castor.supervision import Actor, ActorSystem, ChildSpec, Restart, handles

from .helpers import Journal, Ping, poll_until, process_gone

pytestmark = pytest.mark.timeout(20)


class Retire(Message, type_name="test.retire"):
    reason: str


class ReadChild(Message, type_name="test.read_child"):
    """Block reading the child's stdout (returns when the child dies)."""


class ProcessOwner(Actor):
    """Owns one real child process; retires on request."""

    def __init__(self, journal: Journal) -> None:
        super().__init__()
        self.journal = journal
        self.proc: subprocess.Popen | None = None

    def on_start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE
        )
        self.journal.add("spawned", self.incarnation, self.proc.pid)

    def owned_pids(self) -> list[int]:
        return [self.proc.pid] if self.proc else []

    def on_terminate(self, cause: str) -> None:
        if self.proc:
            self.proc.kill()
            self.proc.wait(5)
        self.journal.add("end", self.incarnation, cause)

    @handles(Ping)
    def ping(self, message: Ping) -> tuple[int, int]:
        self.journal.add("ping", self.incarnation, message.n)
        return (self.incarnation, message.n)

    @handles(Retire)
    def do_retire(self, message: Retire) -> str:
        self.retire(message.reason, error=WorkerRetired)
        return "retiring"

    @handles(ReadChild)
    def read_child(self, _message: ReadChild) -> bytes:
        self.journal.event("reading").set()
        return self.proc.stdout.read()


def _system(journal: Journal, restart: Restart = Restart.PERMANENT) -> ActorSystem:
    return ActorSystem([ChildSpec("owner", lambda: ProcessOwner(journal), restart=restart)])


def test_retire_rejects_every_queued_request_and_never_replays_it():
    journal = Journal()
    system = _system(journal)
    try:
        owner = system.lookup("/root/owner")
        assert journal.wait_for(lambda e: any(x[0] == "spawned" for x in e))
        pid = next(x[2] for x in journal.entries if x[0] == "spawned")
        heard = system.root.processed  # the supervisor's messages handled so far
        # Queue the retirement, then 50 requests behind it.
        retire = owner.ask_pending(Retire(reason="timed out"), timeout=5)
        queued = [owner.ask_pending(Ping(n=i), timeout=5) for i in range(50)]
        assert retire.result() == "retiring"
        for pending in queued:
            with pytest.raises(WorkerRetired) as info:
                pending.result()
            assert info.value.may_have_started is False
            assert info.value.data["reason"] == "timed out"
        assert poll_until(lambda: process_gone(pid))
        assert owner.wait_exited(5) and owner.snapshot().state == "retired"
        # Once the supervisor has handled the exit (nothing else is sent to it here), it has not
        # restarted the retired child: no new incarnation without new demand.
        assert poll_until(lambda: system.root.processed > heard, timeout=10)
        assert owner.incarnation == 1 and owner.restarts == 0  # the supervisor did not restart it
        # New demand: a fresh incarnation handles only the new message.
        assert owner.ask(Ping(n=999), timeout=5) == (2, 999)
        assert [x for x in journal.entries if x[0] == "ping"] == [("ping", 2, 999)]
    finally:
        system.shutdown(10)


def test_the_rejected_count_covers_the_asks_a_retirement_rejected_and_survives_the_fresh_mailbox():
    """An Icarus worker retired with a call queued behind the one that timed out: the queued call
    was rejected (``worker_retired``), yet ``inspect mailbox`` read ``rejected 0`` -- only a put
    refused at the door counted. The first send after the retirement (new demand, delivered to
    a fresh mailbox) was counted as a rejection instead, and the fresh mailbox then started the
    count again at 0. Now the rejected asks count, a delivered send does not, and the count spans
    the handle's life."""
    journal = Journal()
    system = _system(journal)
    try:
        owner = system.lookup("/root/owner")
        assert journal.wait_for(lambda e: any(x[0] == "spawned" for x in e))
        retire = owner.ask_pending(Retire(reason="timed out"), timeout=5)
        queued = [owner.ask_pending(Ping(n=i), timeout=5) for i in range(3)]
        assert retire.result() == "retiring"
        for pending in queued:
            with pytest.raises(WorkerRetired):
                pending.result()
        assert owner.wait_exited(5)
        assert owner.snapshot().mailbox.rejected == 3
        assert owner.ask(Ping(n=999), timeout=5) == (2, 999)  # new demand: delivered, not rejected
        box = owner.snapshot().mailbox
        assert box.rejected == 3 and box.processed == 2, box
    finally:
        system.shutdown(10)


def test_retire_from_outside_unblocks_an_in_flight_read_by_killing_the_owned_process():
    journal = Journal()
    system = _system(journal)
    try:
        owner = system.lookup("/root/owner")
        in_flight = owner.ask_pending(ReadChild(), timeout=10)
        assert journal.event("reading").wait(5)
        queued = [owner.ask_pending(Ping(n=i), timeout=10) for i in range(10)]
        owner.retire("operator said so")
        assert in_flight.result() == b""  # the read returned because the child died
        for pending in queued:
            with pytest.raises(Retired):
                pending.result()
        assert journal.count("ping") == 0
    finally:
        system.shutdown(10)


def test_a_retired_temporary_child_is_removed_not_revived():
    journal = Journal()
    system = _system(journal, Restart.TEMPORARY)
    try:
        owner = system.lookup("/root/owner")
        assert owner.ask(Retire(reason="done"), timeout=5) == "retiring"
        assert poll_until(lambda: owner.closed.is_set())
        with pytest.raises((ActorStopped, Retired)):
            owner.ask(Ping(n=1), timeout=5)
        assert journal.count("ping") == 0
    finally:
        system.shutdown(10)


class SlowExit(ProcessOwner):
    """Lingers in on_terminate so sends can land between mailbox closure and exit."""

    def on_terminate(self, cause: str) -> None:
        if cause == "retired":
            self.journal.event("terminating").set()
            self.journal.event("let-exit").wait(5)
        super().on_terminate(cause)


def test_a_send_that_lands_while_a_retiree_is_still_exiting_gets_a_fresh_incarnation():
    journal = Journal()
    system = ActorSystem([ChildSpec("owner", lambda: SlowExit(journal))])
    try:
        owner = system.lookup("/root/owner")
        owner.retire("slow exit")
        assert journal.event("terminating").wait(5)
        assert owner.has_new_demand is False  # the queue was rejected before on_terminate
        assert owner.alive  # ... and the old incarnation has not exited yet
        pending = owner.ask_pending(Ping(n=1), timeout=10)
        journal.event("let-exit").set()
        assert pending.result() == (2, 1)
    finally:
        journal.event("let-exit").set()
        system.shutdown(10)
