"""A prompt stepped without an ask (hook_controller, "A prompt's own step"): an idle controller's
commonest prompt is stepped on the asker's thread under the mailbox's inline claim and the step
lock, with no message; anything else (a queued message, a handler running, a fault to inject, a
prompt the general machine decides) takes the ask as before. The order of arrival, the answers of
an ``/icarus off`` racing it, a crashed worker and a step that raises are what they were."""

from __future__ import annotations

import threading

import pytest

from castor.actors.icarus.messages import HookStatus, SetHooksEnabled
from castor.domain.icarus import lifecycle as lc
from castor.messages.errors import WorkerCrashed
from castor.supervision import ActorSystem
from tests.support.hook_rig import MEMORY, HookRig
from tests.support.icarus import wait_until

pytestmark = pytest.mark.timeout(60)


def Rig(system: ActorSystem, result: object = None) -> HookRig:  # noqa: N802 -- read as the rig's class
    return HookRig(system, result, door=True)


@pytest.mark.parametrize("helped", [True, False], ids=["endpoint", "direct"])
def test_an_idle_controller_s_prompt_is_no_message_at_all(system, helped):
    rig = Rig(system)
    answer: list = []
    before = rig.hooks.processed
    out = rig.client.event("before_agent_start", {"prompt": "q"}, answer=answer.append if helped else None)
    assert out == MEMORY and (answer == [MEMORY] if helped else answer == [])
    assert rig.hooks.processed == before  # neither the prompt nor its completion was a message
    assert rig.controller().state.inflight == {} and rig.controller()._futures == {}
    assert rig.worker.calls[-1][2] == {"session_id": "S1", "user_message": "q", "is_first_turn": True}
    assert rig.client.event("before_agent_start", {"prompt": "q2"}) == MEMORY
    assert rig.worker.calls[-1][2]["is_first_turn"] is False


def test_a_prompt_the_general_machine_decides_is_still_an_ask(system):
    rig = Rig(system)
    before, calls = rig.hooks.processed, rig.prompts()
    assert rig.client.event("before_agent_start", {"prompt": "   "}) is None  # blank: no retrieval
    assert rig.client.event("before_agent_start", {"prompt": "q", "custom": True}) is None
    assert rig.hooks.processed == before + 2 and rig.prompts() == calls


def test_a_message_queued_before_the_prompt_is_stepped_before_it(system):
    """An ``/icarus off`` queued behind a running handler, then a prompt: the prompt finds hooks off
    (no retrieval), as it would queued behind the off. Stepped at once instead (no claim of the
    mailbox), it would retrieve."""
    rig = Rig(system)
    calls = rig.prompts()
    answers: list = []
    with rig.hooks.turn:  # as while a handler runs: the loop takes the first message and waits
        rig.hooks.tell(HookStatus())
        rig.hooks.tell(SetHooksEnabled(enabled=False))
        thread = threading.Thread(target=lambda: answers.append(
            rig.client.event("before_agent_start", {"prompt": "q"}, answer=answers.append)), daemon=True)
        thread.start()
        wait_until(lambda: rig.hooks.snapshot().mailbox.depth >= 2 or rig.prompts() > calls, 5,
                   "the prompt queued behind the off (or stepped)")
    thread.join(5)
    assert not thread.is_alive() and answers == [None, None]
    assert rig.prompts() == calls and rig.controller().state.enabled is False


def test_a_running_handler_makes_the_prompt_wait_for_its_turn(system):
    rig = Rig(system)
    calls = rig.prompts()
    answers: list = []
    with rig.hooks.turn:  # as while a handler runs (the loop has taken a message and waits for it)
        rig.hooks.tell(HookStatus())
        thread = threading.Thread(target=lambda: answers.append(
            rig.client.event("before_agent_start", {"prompt": "q"}, answer=answers.append)), daemon=True)
        thread.start()
        wait_until(lambda: rig.hooks.snapshot().mailbox.depth >= 1 or rig.prompts() > calls, 5,
                   "the prompt queued (or stepped)")
        assert rig.prompts() == calls  # not stepped while another holds the turn
    thread.join(5)
    assert not thread.is_alive() and answers == [MEMORY, MEMORY]


@pytest.mark.parametrize("result", [{"context": "memory"}, WorkerCrashed("fake worker: gone", may_have_started=True)],
                         ids=["answered", "crashed"])
def test_a_completion_is_applied_before_its_caller_is_answered(system, result):
    """Whatever the harness sends once answered is stepped after the completion: when the answer
    reaches the caller, the prompt is no longer in flight (also for a crashed worker, whose
    completion is a message)."""
    rig = Rig(system, result=result)
    seen: list = []

    def answered(value: object) -> None:
        seen.append((value, dict(rig.controller().state.inflight), dict(rig.controller()._futures)))

    for _ in range(5):
        seen.clear()
        out = rig.client.event("before_agent_start", {"prompt": "q"}, answer=answered)
        assert out == (MEMORY if isinstance(result, dict) else None)
        assert seen == [(out, {}, {})]


def test_a_crashed_worker_mid_prompt_answers_none_and_the_next_prompt_retrieves(system):
    rig = Rig(system, result=WorkerCrashed("fake worker: gone", may_have_started=True))
    answers: list = []
    assert rig.client.event("before_agent_start", {"prompt": "q"}, answer=answers.append) is None
    assert answers == [None] and rig.controller().state.inflight == {} and rig.controller()._futures == {}
    rig.worker.results["pre_llm_call"] = {"context": "memory"}
    assert rig.client.event("before_agent_start", {"prompt": "q"}, answer=lambda _: None) == MEMORY


@pytest.mark.parametrize("settle", ["off", "abort", "new_session"])
def test_a_prompt_stepped_without_an_ask_is_found_and_answered_at_once_during_its_retrieval(system, settle):
    rig = Rig(system)
    gate = rig.worker.gates["pre_llm_call"] = threading.Event()
    answers: list = []
    before, calls, made = rig.hooks.processed, rig.prompts(), len(rig.worker.calls)
    thread = threading.Thread(target=lambda: answers.append(
        rig.client.event("before_agent_start", {"prompt": "q"}, answer=answers.append)), daemon=True)
    thread.start()
    assert rig.worker.wait_calls(made + 1) and rig.prompts() == calls + 1
    assert rig.hooks.processed == before  # stepped without a message
    (request,) = rig.controller().state.inflight
    if settle == "off":
        assert rig.client.set_enabled(False) is False
    elif settle == "abort":
        rig.client.abort(request)
        rig.client.status()  # the abort (a tell) has been handled
    else:  # its own start waits behind the held retrieval on the lane: sent, not waited for
        rig.client.submit("session_start", {"session_id": "S2"})
        rig.client.status()  # handled
    assert answers == [None]  # the early answer, while the retrieval still runs
    gate.set()
    thread.join(5)
    assert not thread.is_alive() and answers == [None, None]
    ctl = rig.controller()
    assert request not in ctl.state.inflight and request not in ctl._futures


def _race_off_and_prompt(rig: Rig) -> bool:
    """One round: a prompt and an ``/icarus off`` let go together; True when the prompt got None."""
    assert rig.client.set_enabled(True) is True
    start = threading.Barrier(2)
    answers: list = []
    offs: list = []

    def prompt() -> None:
        start.wait(5)
        answers.append(rig.client.event("before_agent_start", {"prompt": "q"}, answer=answers.append))

    def off() -> None:
        start.wait(5)
        offs.append(rig.client.set_enabled(False))

    threads = [threading.Thread(target=prompt, daemon=True), threading.Thread(target=off, daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert not any(t.is_alive() for t in threads)
    # every caller answered once (the early answer, then the same value returned)
    assert offs == [False] and len(answers) == 2 and answers[0] in (None, MEMORY) and answers[1] == answers[0]
    ctl = rig.controller()
    assert ctl.state.inflight == {} and ctl._futures == {} and ctl.state.enabled is False
    return answers[0] is None


def test_icarus_off_racing_the_prompt_s_step_answers_each_caller_once_and_leaves_nothing_in_flight(system):
    rig = Rig(system)
    for _ in range(100):
        _race_off_and_prompt(rig)
    assert rig.hooks.restarts == 0


def test_a_step_that_raises_crashes_the_controller_as_a_handler_s_raise(system, monkeypatch):
    """The prompt's step raising (a bug in the machine) is no quiet refusal: the step is taken
    again in the turn, where it crashes the controller (restarted, the snapshot shows it), and the
    caller is answered None."""
    rig = Rig(system)

    def broken(state: lc.HookState, request: str, prompt: str) -> object:
        raise RuntimeError("bug")

    monkeypatch.setattr(lc, "_retrieve", broken)
    answers: list = []
    assert rig.client.event("before_agent_start", {"prompt": "q"}, answer=answers.append) is None
    wait_until(lambda: rig.hooks.restarts == 1 and rig.door.step is not None, 5, "the controller's restart")
    failure = rig.hooks.snapshot().last_failure
    assert failure is not None and failure.error_type == "RuntimeError" and failure.message_type == "icarus.hooks.event"
    monkeypatch.undo()
    rig.client.event("session_start", {"session_id": "S1"})
    assert rig.client.event("before_agent_start", {"prompt": "q"}, answer=lambda _: None) == MEMORY


class _Interrupt(BaseException):
    """As a signal handler's exception landing mid-step (Ctrl-C's KeyboardInterrupt)."""


def test_an_interrupt_after_the_step_crashes_the_controller_and_answers_the_caller(system):
    rig = Rig(system)
    rig.client.set_enabled(True)  # the next prompt's footer is sent (the UI call below)

    def interrupted(key: str, text: str | None) -> None:
        raise _Interrupt

    rig.ui.set_status = interrupted  # type: ignore[method-assign]
    answers: list = []
    with pytest.raises(_Interrupt):
        rig.client.event("before_agent_start", {"prompt": "q"}, answer=answers.append)
    wait_until(lambda: rig.hooks.restarts == 1, 5, "the controller's restart")
    assert answers == [None]  # the crashed incarnation answered its caller
    failure = rig.hooks.snapshot().last_failure
    assert failure is not None and failure.error_type == "ActorKilled"
