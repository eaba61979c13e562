"""No ask can hang; bounded mailboxes; snapshots that consume nothing."""

from __future__ import annotations

import threading

import pytest

from castor.messages.errors import ActorStopped, CastorError, MailboxFull, NotFound, Retired, Timeout
from castor.supervision import ActorSystem, ChildSpec, Restart

from .helpers import Block, Journal, Ping, worker

RACE_TRIALS = 200
MAX_ASKS_PER_TRIAL = 500


def _spam(handle, stop: threading.Event, out: list) -> None:
    """Send asks as fast as possible until told to stop or the actor refuses."""
    while not stop.is_set() and len(out) < MAX_ASKS_PER_TRIAL:
        try:
            out.append(handle.ask_pending(Ping(n=len(out)), timeout=30))
        except CastorError:
            return


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ending", ["stop", "crash", "retire"])
def test_no_ask_is_ever_stranded_by_a_racing_stop_crash_or_retirement(ending):
    """pykka strands ~1 in 10^4 asks racing a stop (anchors.md §0.3); castor strands none.

    Each trial floods a temporary child with asks from another thread while the
    child ends. Once the child is closed, every ask must already be resolved
    (answered or failed with a typed error): none may wait for its deadline.
    """
    journal = Journal()
    system = ActorSystem()
    stranded = answered = refused = 0
    try:
        for trial in range(RACE_TRIALS):
            handle = system.spawn(ChildSpec(f"t{trial}", worker("t", journal), restart=Restart.TEMPORARY))
            sent: list = []
            stop = threading.Event()
            spammer = threading.Thread(target=_spam, args=(handle, stop, sent))
            spammer.start()
            while not sent and spammer.is_alive():  # let the race begin before the ending
                spammer.join(0.0005)
            if ending == "stop":
                system.stop_child(handle.path)
            elif ending == "crash":
                handle.kill("race")  # a crash at the next boundary, ahead of the queued asks
            else:
                handle.retire("race")
            assert handle.closed.wait(10) or handle.snapshot().state == "retired"
            if ending == "retire":
                # A retired handle revives on new demand; stop it for good to end the spam.
                stop.set()
            spammer.join(10)
            stop.set()
            if ending == "retire":
                try:
                    system.stop_child(handle.path)
                except NotFound:
                    pass  # removed meanwhile: a retired temporary child leaves the table by itself
                assert handle.closed.wait(10)
            for pending in sent:
                if not pending.done:
                    stranded += 1
                    continue
                try:
                    pending.result()
                    answered += 1
                except (ActorStopped, Retired):
                    refused += 1
    finally:
        system.shutdown(10)
    assert stranded == 0, f"{stranded} stranded asks (answered={answered}, refused={refused})"
    assert answered > 0 and refused > 0  # both sides of the race were exercised


@pytest.mark.timeout(10)
def test_ask_timeout_says_whether_the_work_may_have_started():
    journal = Journal()
    system = ActorSystem([ChildSpec("w", worker("w", journal))])
    try:
        handle = system.lookup("/root/w")
        in_flight = handle.ask_pending(Block(key="gate"), timeout=0.2)
        assert journal.event("gate:entered").wait(5)
        queued = handle.ask_pending(Ping(n=7), timeout=0.2)
        with pytest.raises(Timeout) as started:
            in_flight.result()
        assert started.value.may_have_started is True
        with pytest.raises(Timeout) as not_started:
            queued.result()
        assert not_started.value.may_have_started is False
        journal.event("gate").set()
        assert handle.ask(Ping(n=8), timeout=5) == ("w", 1, 8)
        assert journal.count("ping", "w", 7) == 0  # the withdrawn request never ran
    finally:
        system.shutdown(10)


@pytest.mark.timeout(10)
def test_a_bounded_mailbox_rejects_overflow_at_once_and_never_blocks_the_sender():
    journal = Journal()
    system = ActorSystem([ChildSpec("w", worker("w", journal), mailbox_capacity=5)])
    try:
        handle = system.lookup("/root/w")
        handle.tell(Block(key="gate"))
        assert journal.event("gate:entered").wait(5)
        accepted = [handle.ask_pending(Ping(n=i), timeout=5) for i in range(5)]
        with pytest.raises(MailboxFull) as full:
            handle.tell(Ping(n=99))
        assert full.value.may_have_started is False and full.value.code == "mailbox_full"
        with pytest.raises(MailboxFull):
            handle.ask(Ping(n=100), timeout=5)
        snap = handle.snapshot().mailbox
        assert snap.depth == 5 and snap.capacity == 5 and snap.rejected == 2
        journal.event("gate").set()
        assert [p.result()[2] for p in accepted] == [0, 1, 2, 3, 4]
    finally:
        system.shutdown(10)


@pytest.mark.timeout(30)
def test_snapshots_taken_while_another_thread_floods_the_actor_consume_nothing():
    journal = Journal()
    system = ActorSystem([ChildSpec("w", worker("w", journal))])
    total = 20_000
    try:
        handle = system.lookup("/root/w")
        handle.tell(Block(key="gate"))
        assert journal.event("gate:entered").wait(5)
        flooded = threading.Event()

        def flood() -> None:
            for i in range(total):
                handle.tell(Ping(n=i))
            flooded.set()

        flooder = threading.Thread(target=flood)
        flooder.start()
        snaps = []
        while not flooded.is_set():
            snaps.append(handle.snapshot())
        flooder.join(10)
        final = handle.snapshot()
        assert final.mailbox.depth == total
        assert final.mailbox.by_type == {"test.ping": total}
        assert final.mailbox.in_flight is not None and final.mailbox.in_flight.message_type == "test.block"
        assert final.mailbox.oldest_age_s is not None and final.mailbox.oldest_age_s >= 0
        depths = [s.mailbox.depth for s in snaps]
        assert depths == sorted(depths)  # nothing was consumed while the actor was blocked
        assert all(sum(s.mailbox.by_type.values()) == s.mailbox.depth for s in snaps)
        journal.event("gate").set()
        assert handle.ask(Ping(n=-1), timeout=20) == ("w", 1, -1)
        assert journal.count("ping", "w") == total + 1  # every flooded message handled exactly once
        assert handle.snapshot().mailbox.processed == total + 2
    finally:
        system.shutdown(10)
