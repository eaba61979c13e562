"""A worker call's completion that only answers its caller is applied on the thread that made the
call, under the controller's step lock, without a message to the controller (hook_controller,
"Completions"); every other completion is a message as before, and a concurrent ``/icarus off``,
abort or crash still answers the caller at once, exactly once."""

from __future__ import annotations

import threading

import pytest

from castor.messages.errors import WorkerCrashed
from tests.support.hook_rig import MEMORY, HookRig

pytestmark = pytest.mark.timeout(60)

Rig = HookRig  # every prompt an ask: no prompt door


@pytest.mark.parametrize("helped", [True, False], ids=["endpoint", "direct"])
def test_a_completion_that_only_answers_is_no_message_to_the_controller(system, helped):
    rig = Rig(system)
    answer: list = []
    before = rig.hooks.processed
    out = rig.client.event("before_agent_start", {"prompt": "q"}, answer=answer.append if helped else None)
    assert out == MEMORY and (answer == [MEMORY] if helped else answer == [])
    assert rig.hooks.processed == before + 1  # the prompt's event only: its completion was no message
    assert rig.controller().state.inflight == {} and rig.controller()._futures == {}


def test_a_completion_is_applied_while_another_handler_holds_the_controller_s_turn(system):
    rig = Rig(system)
    thread, answers, gate = rig.prompt_in_flight()
    with rig.hooks.turn:  # as while another message is handled (it never waits on the lane)
        gate.set()
        thread.join(5)
        assert not thread.is_alive() and answers == [MEMORY, MEMORY]  # answered without the turn
    assert rig.controller().state.inflight == {}


def test_a_failed_call_s_completion_is_still_a_message_and_answers_none(system):
    rig = Rig(system, result=WorkerCrashed("fake worker: gone", may_have_started=True))
    before = rig.hooks.processed
    assert rig.client.event("before_agent_start", {"prompt": "q"}, answer=lambda _: None) is None
    assert rig.hooks.processed == before + 2  # the event, then its completion (its step logs)
    assert rig.controller().state.inflight == {}
    rig.worker.results["pre_llm_call"] = {"context": "memory"}  # a fresh worker: the next prompt has memory
    assert rig.client.event("before_agent_start", {"prompt": "q"}, answer=lambda _: None) == MEMORY


@pytest.mark.parametrize("helped", [True, False], ids=["endpoint", "direct"])
def test_icarus_off_during_a_retrieval_answers_at_once_and_the_late_completion_changes_nothing(system, helped):
    rig = Rig(system)
    thread, answers, gate = rig.prompt_in_flight(helped=helped)
    assert rig.client.set_enabled(False) is False
    if helped:
        assert answers == [None]  # the early answer, while the call still runs
    gate.set()
    thread.join(5)
    assert not thread.is_alive() and answers[-1] is None
    ctl = rig.controller()
    assert ctl.state.inflight == {} and ctl._futures == {} and ctl.state.enabled is False
    calls = len(rig.worker.calls)
    assert rig.client.event("before_agent_start", {"prompt": "q"}) is None  # off: no retrieval
    assert len(rig.worker.calls) == calls


def test_an_abort_during_a_retrieval_answers_at_once_and_the_late_completion_changes_nothing(system):
    rig = Rig(system)
    thread, answers, gate = rig.prompt_in_flight()
    (request,) = rig.controller().state.inflight
    rig.client.abort(request)
    rig.client.status()  # the abort (a tell) has been handled
    assert answers == [None]
    gate.set()
    thread.join(5)
    assert not thread.is_alive() and answers == [None, None]
    assert rig.controller().state.inflight == {} and rig.controller()._futures == {}
    assert rig.client.event("before_agent_start", {"prompt": "q"}, answer=lambda _: None) == MEMORY


def test_completions_racing_icarus_off_answer_each_caller_once_and_leave_nothing_in_flight(system):
    rig = Rig(system)
    for _ in range(60):
        assert rig.client.set_enabled(True) is True
        thread, answers, gate = rig.prompt_in_flight()
        off = threading.Thread(target=rig.client.set_enabled, args=(False,), daemon=True)
        off.start()
        gate.set()  # the completion and the off race for the step lock
        thread.join(5)
        off.join(5)
        assert not thread.is_alive() and not off.is_alive()
        assert len(answers) == 2 and answers[0] in (None, MEMORY) and answers[1] == answers[0]
        ctl = rig.controller()
        assert ctl.state.inflight == {} and ctl._futures == {} and ctl.state.enabled is False
