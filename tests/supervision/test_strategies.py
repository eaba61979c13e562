"""Strategies, restart types, ordered start and reverse shutdown."""

from __future__ import annotations

import pytest

from castor.messages.errors import ActorCrashed, ActorStopped
from castor.supervision import ActorSystem, ChildSpec, Restart, Strategy

from .helpers import Boom, Journal, Ping, Quit, poll_until, worker

pytestmark = pytest.mark.timeout(20)


def _system(journal: Journal, strategy: Strategy, restart: Restart = Restart.PERMANENT, **kw) -> ActorSystem:
    specs = [ChildSpec(name, worker(name, journal), restart=restart) for name in ("a", "b", "c")]
    return ActorSystem(specs, strategy=strategy, **kw)


def _incarnations(system: ActorSystem) -> dict[str, int]:
    return {p.rsplit("/", 1)[1]: system.lookup(p).incarnation for p in ("/root/a", "/root/b", "/root/c")}


def _crash(system: ActorSystem, journal: Journal, name: str) -> None:
    handle = system.lookup(f"/root/{name}")
    with pytest.raises(ActorCrashed) as info:
        handle.ask(Boom(), timeout=5)
    assert isinstance(info.value.__cause__, ValueError) and info.value.may_have_started is True


def test_children_start_in_order_and_stop_in_reverse():
    journal = Journal()
    system = _system(journal, Strategy.ONE_FOR_ONE)
    assert journal.wait_for(lambda e: sum(1 for x in e if x[0] == "start") == 3)
    assert [e[1] for e in journal.entries if e[0] == "start"] == ["a", "b", "c"]
    assert system.shutdown(10)
    assert [e[1] for e in journal.entries if e[0] == "end"] == ["c", "b", "a"]


def test_one_for_one_restarts_only_the_failed_child():
    journal = Journal()
    system = _system(journal, Strategy.ONE_FOR_ONE)
    try:
        _crash(system, journal, "b")
        assert system.lookup("/root/b").ask(Ping(n=1), timeout=5) == ("b", 2, 1)
        assert _incarnations(system) == {"a": 1, "b": 2, "c": 1}
        assert system.lookup("/root/b").restarts == 1
    finally:
        system.shutdown(10)


def test_one_for_all_restarts_every_child_in_order():
    journal = Journal()
    system = _system(journal, Strategy.ONE_FOR_ALL)
    try:
        _crash(system, journal, "b")
        assert poll_until(lambda: _incarnations(system) == {"a": 2, "b": 2, "c": 2})
        for name in "abc":
            assert system.lookup(f"/root/{name}").ask(Ping(n=0), timeout=5)[1] == 2
        restarts = [e[1] for e in journal.entries if e[0] == "start" and e[2] == 2]
        assert restarts == ["a", "b", "c"]
        stopped = [e[1] for e in journal.entries if e[0] == "end" and e[3] == "stopped"]
        assert stopped == ["c", "a"]  # siblings stop in reverse order; b had crashed
    finally:
        system.shutdown(10)


def test_rest_for_one_restarts_the_failed_child_and_later_ones():
    journal = Journal()
    system = _system(journal, Strategy.REST_FOR_ONE)
    try:
        _crash(system, journal, "b")
        assert poll_until(lambda: _incarnations(system) == {"a": 1, "b": 2, "c": 2})
        assert system.lookup("/root/c").ask(Ping(n=5), timeout=5) == ("c", 2, 5)
        assert system.lookup("/root/a").ask(Ping(n=5), timeout=5) == ("a", 1, 5)
    finally:
        system.shutdown(10)


@pytest.mark.parametrize(
    ("restart", "crash_restarts", "normal_restarts"),
    [(Restart.PERMANENT, True, True), (Restart.TRANSIENT, True, False), (Restart.TEMPORARY, False, False)],
)
def test_restart_types(restart, crash_restarts, normal_restarts):
    journal = Journal()
    system = ActorSystem(
        [ChildSpec("x", worker("x", journal), restart=restart), ChildSpec("y", worker("y", journal), restart=restart)]
    )
    try:
        x, y = system.lookup("/root/x"), system.lookup("/root/y")
        _crash(system, journal, "x")
        if crash_restarts:
            assert x.ask(Ping(n=1), timeout=5) == ("x", 2, 1)
        else:
            assert x.closed.wait(5)
            with pytest.raises(ActorStopped):
                x.ask(Ping(n=1), timeout=5)
            assert system.find("/root/x") is None
        y.tell(Quit())
        assert journal.wait_for(lambda e: ("end", "y", 1, "stopped") in e)  # stop_self runs on_terminate
        if normal_restarts:
            assert y.ask(Ping(n=2), timeout=5) == ("y", 2, 2)
        else:
            assert y.closed.wait(5)
            with pytest.raises(ActorStopped):
                y.tell(Ping(n=2))
    finally:
        system.shutdown(10)


def test_queued_messages_survive_a_restart_but_the_failing_one_is_not_redelivered():
    journal = Journal()
    system = ActorSystem([ChildSpec("w", worker("w", journal))])
    try:
        handle = system.lookup("/root/w")
        from .helpers import Block

        handle.tell(Block(key="gate"))
        assert journal.event("gate:entered").wait(5)
        handle.tell(Boom())  # crashes the first incarnation
        pending = [handle.ask_pending(Ping(n=i), timeout=5) for i in range(5)]
        journal.event("gate").set()
        assert [p.result() for p in pending] == [("w", 2, i) for i in range(5)]
        assert journal.count("boom", "w") == 1  # never redelivered to the new incarnation
    finally:
        system.shutdown(10)
