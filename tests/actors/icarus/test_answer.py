"""The hook path's answer slot: set once, waited for with a deadline, one callback on the setting thread."""

from __future__ import annotations

import threading
import time

import pytest

from castor.actors.icarus.messages import Answer

pytestmark = pytest.mark.timeout(30)


def test_the_first_answer_wins_and_later_ones_change_nothing() -> None:
    answer = Answer()
    assert not answer.done()
    assert answer.set_result({"a": 1}) is True
    assert answer.set_result(None) is False
    assert answer.done() and answer.result(0) == {"a": 1}


def test_a_wait_past_its_deadline_raises_timeout_error() -> None:
    answer = Answer()
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        answer.result(0.05)
    assert 0.04 <= time.monotonic() - started < 2
    answer.set_result(3)
    assert answer.result(0) == 3


def test_every_waiter_on_every_thread_gets_the_answer() -> None:
    answer = Answer()
    got: list[object] = []
    ready = threading.Barrier(9)

    def wait() -> None:
        ready.wait(5)
        got.append(answer.result(10))

    threads = [threading.Thread(target=wait) for _ in range(8)]
    for t in threads:
        t.start()
    ready.wait(5)
    answer.set_result("x")
    for t in threads:
        t.join(10)
    assert got == ["x"] * 8


def test_the_callback_runs_once_on_the_thread_that_answers() -> None:
    answer = Answer()
    seen: list[tuple[object, int]] = []
    answer.add_done_callback(lambda value: seen.append((value, threading.get_ident())))
    setter = threading.Thread(target=answer.set_result, args=("v",))
    setter.start()
    setter.join(5)
    answer.set_result("w")  # ignored: no second call
    assert seen == [("v", setter.ident)]


def test_a_callback_added_after_the_answer_runs_at_once_on_the_adding_thread() -> None:
    answer = Answer()
    answer.set_result(7)
    seen: list[tuple[object, int]] = []
    answer.add_done_callback(lambda value: seen.append((value, threading.get_ident())))
    assert seen == [(7, threading.get_ident())]


def test_one_callback_only() -> None:
    answer = Answer()
    answer.add_done_callback(lambda _v: None)
    with pytest.raises(RuntimeError):
        answer.add_done_callback(lambda _v: None)


def test_a_failing_callback_does_not_undo_the_answer_or_reach_the_setter() -> None:
    answer = Answer()

    def boom(_value: object) -> None:
        raise ValueError("callback bug")

    answer.add_done_callback(boom)
    assert answer.set_result(1) is True  # the setter (the controller) is not hurt
    assert answer.result(0) == 1


def test_racing_setters_one_wins_and_the_callback_sees_the_winner() -> None:
    for _ in range(200):
        answer = Answer()
        seen: list[object] = []
        answer.add_done_callback(seen.append)
        wins: list[object] = []
        go = threading.Event()

        def set_(value: object, go: threading.Event, answer: Answer, wins: list[object]) -> None:
            go.wait(5)
            if answer.set_result(value):
                wins.append(value)

        threads = [threading.Thread(target=set_, args=(i, go, answer, wins)) for i in range(4)]
        for t in threads:
            t.start()
        go.set()
        for t in threads:
            t.join(5)
        assert len(wins) == 1 and seen == wins and answer.result(0) == wins[0]


def test_a_callback_given_at_the_start_runs_once_on_the_thread_that_answers() -> None:
    seen: list[tuple[object, int]] = []
    answer = Answer(lambda value: seen.append((value, threading.get_ident())))
    with pytest.raises(RuntimeError):
        answer.add_done_callback(lambda _v: None)  # still one callback only
    setter = threading.Thread(target=answer.set_result, args=("v",))
    setter.start()
    setter.join(5)
    answer.set_result("w")
    assert seen == [("v", setter.ident)] and answer.result(0) == "v"


def test_a_waiter_after_one_that_timed_out_is_still_woken_by_the_answer() -> None:
    """The gate a waiting reader makes stays for the next: a reader past its deadline leaves it
    closed, and one that waits after it passes when the answer comes from another thread."""
    answer = Answer()
    with pytest.raises(TimeoutError):
        answer.result(0.01)
    got: list[object] = []
    waiting = threading.Thread(target=lambda: got.append(answer.result(10)))
    waiting.start()
    threading.Thread(target=answer.set_result, args=("late",)).start()
    waiting.join(10)
    assert got == ["late"] and answer.result(0) == "late"
