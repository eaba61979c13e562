"""The crash-loop rule on paper: deaths in a window, the give-up, the cool-down, the probe."""

from __future__ import annotations

import pytest

from castor.domain.icarus.crash_loop import CrashLoop, CrashLoopLimit

pytestmark = pytest.mark.timeout(10)

LIMIT = CrashLoopLimit(max_deaths=3, within_s=10.0, cool_down_s=30.0)


def test_the_limit_th_death_within_the_window_gives_up_and_calls_wait_out_the_cool_down():
    loop = CrashLoop(LIMIT)
    assert [loop.death(t, "exit code 3") for t in (0.0, 1.0, 2.0)] == [False, False, True]
    assert loop.state(2.0) == "given_up" and loop.admit(12.0) == pytest.approx(20.0)
    assert loop.admit(31.9) == pytest.approx(0.1) and loop.refused == 2
    view = loop.view(12.0)
    assert (view["retry_in_s"], view["give_ups"], view["last_death"]) == (20.0, 1, "exit code 3")
    assert "given up" in view["text"] and "2 refused" in view["text"]


def test_deaths_spread_wider_than_the_window_never_give_up():
    loop = CrashLoop(LIMIT)
    assert not any(loop.death(t) for t in (0.0, 6.0, 12.0, 18.0, 24.0))  # never three within 10 s
    assert loop.state(24.0) == "ok" and loop.admit(24.0) is None


def test_after_the_cool_down_one_probe_runs_a_death_gives_up_again_an_answer_clears_everything():
    loop = CrashLoop(LIMIT)
    for t in (0.0, 1.0, 2.0):
        loop.death(t)
    assert loop.admit(32.0) is None and loop.state(32.0) == "probing"
    assert loop.death(33.0) is True and loop.state(33.0) == "given_up" and loop.give_ups == 2  # one death is enough
    assert loop.admit(63.0) is None
    assert loop.answered() is True and loop.state(63.0) == "ok" and loop.deaths == []
    assert loop.answered() is False  # nothing to clear: not a recovery again
    assert loop.view(63.0)["text"].startswith("ok (0 deaths")


def test_an_answer_between_deaths_restarts_the_count():
    loop = CrashLoop(LIMIT)
    loop.death(0.0)
    loop.death(1.0)
    assert loop.answered() is False  # not given up: nothing recovered, but the count restarts
    assert not loop.death(2.0) and not loop.death(3.0) and loop.death(4.0)


@pytest.mark.parametrize("bad", [{"max_deaths": 0}, {"within_s": 0.0}, {"cool_down_s": -1.0},
                                 {"within_s": float("nan")}])
def test_a_limit_that_could_never_or_always_give_up_is_refused(bad):
    with pytest.raises(ValueError):
        CrashLoopLimit(**bad)
