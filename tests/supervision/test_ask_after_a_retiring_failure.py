"""An ask sent the moment a failure is seen never lands in the mailbox of the incarnation that
failure ended: a handler that retires its actor has the mailbox closed before its answer is
delivered (queued and inline asks alike), so the next ask goes to a fresh incarnation; a handler
that crashes leaves the mailbox to the next incarnation, which takes the next ask.

The retirement is slowed here as a loaded host slows it: once the failed answer is out, the
retiring incarnation's first step (killing what it owns) waits until the asker's next ask has been
queued. Before the fix that ask was queued in the old, still open mailbox and refused
``actor_retired`` by the retirement, every time."""

from __future__ import annotations

import pytest

from castor.messages.base import Message
from castor.messages.errors import ActorCrashed, CastorError, Timeout
from castor.supervision import Actor, ActorSystem, ChildSpec, Restart, handles
from castor.supervision.actor import running_actor
from castor.supervision.mailbox import ReplySlot

from .helpers import Journal, Ping, poll_until

pytestmark = pytest.mark.timeout(30)


class FailAndRetire(Message, type_name="test.retiring_failure.retire"):
    pass


class FailAndCrash(Message, type_name="test.retiring_failure.crash"):
    pass


class FailsThenSlowlyEnds(Actor):
    """Answers ``FailAndRetire`` with a timeout and retires, crashes on ``FailAndCrash``; its end
    (``kill_owned``, the first step of a retirement and of a crash) is slow once the failed answer
    has been delivered: it waits (on its loop thread) for the next ask to be queued in its own mailbox."""

    def __init__(self, journal: Journal) -> None:
        super().__init__()
        self.journal = journal
        self.failed_answer: ReplySlot | None = None

    @handles(Ping)
    def ping(self, message: Ping) -> tuple[int, int]:
        self.journal.add("ping", self.incarnation, message.n)
        return (self.incarnation, message.n)

    @handles(FailAndRetire)
    def fail_and_retire(self, _message: FailAndRetire) -> None:
        self.failed_answer = self._reply_slot()
        self.retire("the call timed out")
        raise Timeout("the call timed out", may_have_started=True)

    @handles(FailAndCrash)
    def fail_and_crash(self, _message: FailAndCrash) -> None:
        self.failed_answer = self._reply_slot()
        raise RuntimeError("the handler failed")

    def _reply_slot(self) -> ReplySlot:
        current = self.handle.current
        assert current is not None and current.reply is not None
        return current.reply

    def kill_owned(self) -> None:
        answer, self.failed_answer = self.failed_answer, None
        if answer is not None and answer.done and running_actor() is self.handle:
            # On the loop thread, descheduled between the answer and the end: the asker has sent
            # its next ask meanwhile. (On the asker's own thread -- an inline handler's crash --
            # the answer is not seen until this returns: nothing to wait for.)
            self.journal.add("slowed", self.incarnation, poll_until(lambda: len(self.inbox) > 0, timeout=5))


class InlineFailsThenSlowlyEnds(FailsThenSlowlyEnds):
    inline_asks = True


def _system(actor: type[FailsThenSlowlyEnds], journal: Journal) -> ActorSystem:
    return ActorSystem([ChildSpec("a", lambda: actor(journal), restart=Restart.PERMANENT)])


@pytest.mark.parametrize("actor", [FailsThenSlowlyEnds, InlineFailsThenSlowlyEnds], ids=["queued", "inline"])
@pytest.mark.parametrize(("failure", "seen"), [(FailAndRetire, Timeout), (FailAndCrash, ActorCrashed)],
                         ids=["retires", "crashes"])
def test_an_ask_sent_as_soon_as_a_failure_is_seen_reaches_the_next_incarnation(
        actor: type[FailsThenSlowlyEnds], failure: type[Message], seen: type[CastorError]) -> None:
    journal = Journal()
    system = _system(actor, journal)
    try:
        handle = system.lookup("/root/a")
        for round_ in range(1, 4):
            assert handle.ask(Ping(n=0), timeout=10) == (round_, 0)
            if actor.inline_asks:  # idle, its loop parked: the failing ask runs inline
                assert poll_until(lambda: handle._mailbox._waiters, timeout=5)
            with pytest.raises(seen):
                handle.ask(failure(), timeout=10)
            # At once: never refused by the old incarnation, never lost in its mailbox.
            assert handle.ask(Ping(n=round_), timeout=10) == (round_ + 1, round_)
        assert journal.count("ping") == 6
    finally:
        system.shutdown(10)
