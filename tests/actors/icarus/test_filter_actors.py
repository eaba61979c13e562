"""ClassifierActor, AuditActor and HookController on the real supervision core.

Fakes only for what cannot exist here (the LLM classifier, the Icarus worker,
the harness UI/session): see fakes.py. Synchronisation uses events and
deadlines, never bare sleeps.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from castor.actors.icarus.audit import AUDIT_WARNING, AuditActor
from castor.actors.icarus.classifier import REMOTE_NOTICE, CancelToken, ClassifierActor, run_bounded
from castor.actors.icarus.hook_controller import HookClient, HookController
from castor.actors.icarus.messages import AuditAndRelease, Classify
from castor.domain.icarus.classify import Outcome, Reason, parse_choice
from castor.domain.icarus.lifecycle import HookConfig
from castor.messages.errors import Cancelled, InvalidParams, Timeout
from castor.ports.classifier import ClassifierPort
from castor.ports.session import SessionPort, SessionUiPort
from castor.ports.worker import WorkerCalls
from castor.supervision import ChildSpec
from tests.support.icarus_fakes import REMOTE, SAMPLE, FakeClassifier, FakeSessionLog, FakeUi, FakeWorker
from tests.support.waiting import wait_for

FILTERED = SAMPLE.replace("\n  [2026-01-02 11:00] pi-agent: grandma's chocolate cake needs three eggs", "").replace(
    "\n  ### notes: baking (score: 0.40)\n  the cake frosting recipe uses butter and icing sugar", "")


class Rig:
    def __init__(self, system, *, classifier=None, log=None, worker=None, ui=None, choice="default",
                 classifier_timeout=2.0, filtering=True, context_display=True, audit_timeout=2.0):
        self.fake = classifier or FakeClassifier(reject_words=("cake",))
        self.log = log or FakeSessionLog()
        self.worker = worker or FakeWorker({"pre_llm_call": {"context": SAMPLE}})
        self.ui = ui or FakeUi()
        n = next(_ids)
        self.cls = system.spawn(
            ChildSpec(id=f"cls{n}", factory=lambda: ClassifierActor(self.fake, parse_choice(choice)))
        )
        self.aud = system.spawn(ChildSpec(id=f"aud{n}", factory=lambda: AuditActor(self.log, self.ui,
                                                                                  audit_timeout=audit_timeout)))
        cfg = HookConfig(filtering=filtering, context_display=context_display)
        self.hooks = system.spawn(ChildSpec(id=f"hooks{n}", factory=lambda: HookController(
            cfg, worker=self.worker, ui=self.ui, classifier=self.cls, audit=self.aud,
            worker_timeout=5.0, classifier_timeout=classifier_timeout, audit_timeout=audit_timeout)))
        self.client = HookClient(self.hooks, default_timeout=10)

    def start(self, sid="S1"):
        return self.client.event("session_start", {"session_id": sid})


_ids = itertools.count(1)


def test_fakes_satisfy_ports():
    assert isinstance(FakeClassifier(), ClassifierPort)
    assert isinstance(FakeSessionLog(), SessionPort)
    assert isinstance(FakeUi(), SessionUiPort)
    assert isinstance(FakeWorker(), WorkerCalls)


def test_end_to_end_filtered_injection_with_audit(system):
    rig = Rig(system, worker=FakeWorker({"on_session_start": {"context": "startup memory"},
                                        "pre_llm_call": {"context": SAMPLE}}))
    assert rig.start() is None
    assert rig.ui.messages == [("icarus-session-context", "startup memory", True, False)]
    out = rig.client.event("before_agent_start", {"prompt": "fix sqlite locks"})
    assert out == {"message": {"customType": "icarus-memory-context", "content": FILTERED, "display": True}}
    ((ctype, data),) = rig.log.entries
    assert ctype == "icarus-context-filter" and data["outcome"] == "filtered" and data["counts"]["rejected"] == 2
    assert "sqlite" not in str(data) and "cake" not in str(data)
    assert rig.fake.sent_texts() and not any("startup" in t for t in rig.fake.sent_texts())  # 54
    assert rig.worker.functions() == ["on_session_start", "pre_llm_call"]
    assert rig.worker.calls[1][2] == {"session_id": "S1", "user_message": "fix sqlite locks", "is_first_turn": True}


def test_49_audit_persisted_before_text_released(system):
    gate = threading.Event()
    rig = Rig(system, log=FakeSessionLog(gate=gate))
    rig.start()
    _, fut = rig.client.submit("before_agent_start", {"prompt": "fix sqlite locks"})
    assert rig.log.entered.wait(5)
    assert not fut.done()  # audit not yet acknowledged: nothing released
    gate.set()
    assert fut.result(5)["message"]["content"] == FILTERED
    assert len(rig.log.entries) == 1


def test_50_audit_failure_injects_original_and_warns(system):
    rig = Rig(system, log=FakeSessionLog(fail=OSError("disk full")))
    rig.start()
    out = rig.client.event("before_agent_start", {"prompt": "fix sqlite locks"})
    assert out["message"]["content"] == SAMPLE
    assert (AUDIT_WARNING, "warning") in rig.ui.notices


def test_45_slow_classifier_keeps_original_within_deadline_worker_untouched(system):
    slow = FakeClassifier(gate=threading.Event())  # never released
    rig = Rig(system, classifier=slow, classifier_timeout=0.3)
    rig.start()
    pid = rig.worker.pid
    # The classifier never answers: only its 0.3 s deadline can give the original back (the hook
    # facade's own bound, 40 s, would answer None instead).
    out = rig.client.event("before_agent_start", {"prompt": "q"})
    assert out["message"]["content"] == SAMPLE
    assert rig.worker.pid == pid and rig.worker.closed == 0
    assert rig.worker.functions() == ["on_session_start", "pre_llm_call"]
    (entry,) = [d for _, d in rig.log.entries]
    assert (entry["outcome"], entry["reason"]) == ("fallback", "timeout")


def test_port_ignoring_its_deadline_is_still_bounded(system):
    gate = threading.Event()

    class Stubborn(FakeClassifier):
        def complete(self, request, deadline):
            gate.wait(30)  # ignores the deadline: released only once the event has been answered
            raise AssertionError("unreachable in time")
    rig = Rig(system, classifier=Stubborn(), classifier_timeout=0.3)
    rig.start()
    try:
        out = rig.client.event("before_agent_start", {"prompt": "q"})
        assert out["message"]["content"] == SAMPLE and not gate.is_set()
    finally:
        gate.set()


def test_46_abort_mid_classification_injects_nothing(system):
    slow = FakeClassifier(gate=threading.Event())
    rig = Rig(system, classifier=slow, classifier_timeout=5.0)
    rig.start()
    req, fut = rig.client.submit("before_agent_start", {"prompt": "q"})
    wait_for(lambda: slow.requests, timeout=5, what="the classifier request in flight")
    rig.client.abort(req)
    assert fut.result(2) is None  # the classifier's own deadline (5 s) cannot have answered first


def test_28_off_on_during_retrieval_injects_nothing(system):
    worker = FakeWorker({"pre_llm_call": {"context": SAMPLE}})
    gate = worker.gates["pre_llm_call"] = threading.Event()
    rig = Rig(system, worker=worker, filtering=False)
    rig.start()
    _, fut = rig.client.submit("before_agent_start", {"prompt": "q"})
    assert worker.wait_calls(2)
    assert rig.client.set_enabled(False) is False
    assert rig.client.set_enabled(True) is True
    assert fut.result(2) is None  # answered at invalidation, before the worker returned
    gate.set()
    assert rig.client.status().in_flight == 0
    assert ("icarus", None) in rig.ui.status and rig.ui.status[-1] == ("icarus", "🪽 Icarus")


def test_timeout_on_lane_drops_queued_calls_but_still_closes(system):
    worker = FakeWorker({"post_llm_call": Timeout("worker timed out", may_have_started=True)})
    gate = worker.gates["post_llm_call"] = threading.Event()
    rig = Rig(system, worker=worker, filtering=False)
    rig.start()
    assert rig.client.event("before_agent_start", {"prompt": "q"}) is None
    assert rig.client.event("agent_end", {"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "text", "text": "a"}], "stopReason": "stop"}]}) is None
    _, settled_fut = rig.client.submit("agent_settled", {})
    assert worker.wait_calls(3)  # the capture runs, held
    _, shut_fut = rig.client.submit("session_shutdown")
    assert settled_fut.result(2) is None  # invalidated by the shutdown: on_session_end is queued
    gate.set()  # now the in-flight capture fails with a timeout
    assert shut_fut.result(5) is None
    assert worker.functions() == ["on_session_start", "pre_llm_call", "post_llm_call"]  # on_session_end never sent
    assert worker.closed == 1 and rig.ui.status[-1] == ("icarus", None)


def test_a_shutdown_abandons_the_running_retrieval_and_ends_the_session_at_once(system):
    """The shutdown answered the waiting prompt; the retrieval still running was abandoned (its
    worker stopped) so on_session_end did not wait the rest of it; no calls were dropped."""
    worker = FakeWorker()
    worker.gates["pre_llm_call"] = threading.Event()  # held until the shutdown cancels it
    rig = Rig(system, worker=worker, filtering=False)
    rig.start()
    _, prompt_fut = rig.client.submit("before_agent_start", {"prompt": "q"})
    assert worker.wait_calls(2)
    assert rig.client.event("session_shutdown") is None
    assert prompt_fut.result(2) is None
    assert worker.cancelled == ["pre_llm_call"]
    assert worker.functions() == ["on_session_start", "pre_llm_call", "on_session_end"]
    assert worker.closed == 1


def test_a_retrieval_queued_behind_a_hung_one_is_never_sent_once_the_shutdown_answered_it(system):
    """``/icarus off`` answered a hung retrieval, the next prompt's retrieval queued behind it, then
    the user quit. The shutdown answered the queued one too, yet the lane sent it to the fresh
    worker the quit's grace left (a hung backend: the whole ``timeoutMs``) before
    ``on_session_end``. A retrieval whose asker was answered is dropped from the lane unsent."""
    worker = FakeWorker()
    worker.gates["pre_llm_call"] = threading.Event()  # every retrieval hangs until cancelled
    rig = Rig(system, worker=worker, filtering=False)
    rig.start()
    _, hung = rig.client.submit("before_agent_start", {"prompt": "first"})
    assert worker.wait_calls(2)
    assert rig.client.set_enabled(False) is False and rig.client.set_enabled(True) is True
    assert hung.result(2) is None
    _, queued = rig.client.submit("before_agent_start", {"prompt": "second"})
    assert rig.client.event("session_shutdown") is None
    assert queued.result(2) is None
    assert worker.cancelled == ["pre_llm_call"]  # the hung one, stopped after the grace
    assert worker.functions() == ["on_session_start", "pre_llm_call", "on_session_end"]
    assert worker.closed == 1


def test_an_aborted_prompts_retrieval_still_queued_is_never_sent(system):
    """The turn's abort answers its prompt with nothing; its retrieval, still queued behind a slow
    one, is taken off the lane: never run (its answer would be ignored) and the next prompt's
    retrieval runs right after the slow one."""
    worker = FakeWorker({"pre_llm_call": {"context": SAMPLE}})
    gate = worker.gates["pre_llm_call"] = threading.Event()
    rig = Rig(system, worker=worker, filtering=False)
    rig.start()
    _, slow = rig.client.submit("before_agent_start", {"prompt": "slow"})
    assert worker.wait_calls(2)
    aborted_req, aborted = rig.client.submit("before_agent_start", {"prompt": "aborted"})
    rig.client.abort(aborted_req)
    assert aborted.result(2) is None
    _, kept = rig.client.submit("before_agent_start", {"prompt": "kept"})
    gate.set()
    assert slow.result(5) is not None and kept.result(5) is not None
    assert [c[2].get("user_message") for c in worker.calls if c[1] == "pre_llm_call"] == ["slow", "kept"]


def test_a_shutdown_lets_a_retrieval_ending_soon_finish_on_the_worker_that_holds_the_session(system):
    """The backend keeps what it gathered of the session in its worker process and extracts it at
    the session's end: stopping every running retrieval at a quit ran on_session_end on a fresh
    worker, and the session's memories were lost. One that ends within the grace keeps its worker."""
    worker = FakeWorker()
    gate = worker.gates["pre_llm_call"] = threading.Event()
    rig = Rig(system, worker=worker, filtering=False)
    rig.start()
    _, prompt_fut = rig.client.submit("before_agent_start", {"prompt": "q"})
    assert worker.wait_calls(2)
    threading.Timer(0.3, gate.set).start()  # the retrieval ends 0.3 s into the quit
    assert rig.client.event("session_shutdown") is None
    assert prompt_fut.result(2) is None
    assert worker.cancelled == []  # not stopped: on_session_end ran after it, on the same worker
    assert worker.functions() == ["on_session_start", "pre_llm_call", "on_session_end"]
    assert worker.closed == 1


def test_36_every_hook_failing_is_ambient(system):
    boom = RuntimeError("backend exploded")
    worker = FakeWorker({f: boom for f in ("on_session_start", "pre_llm_call", "post_llm_call", "on_session_end")})
    rig = Rig(system, worker=worker, ui=FakeUi(fail=True))
    assert rig.start() is None
    assert rig.client.event("before_agent_start", {"prompt": "q"}) is None
    assert rig.client.event("agent_end", {"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "text", "text": "a"}], "stopReason": "stop"}]}) is None
    assert rig.client.event("agent_settled", {}) is None
    assert rig.client.event("session_shutdown") is None
    assert worker.functions() == ["on_session_start", "pre_llm_call", "post_llm_call", "on_session_end"]
    assert worker.closed == 1


def test_capture_once_through_actor(system):
    rig = Rig(system, worker=FakeWorker({"pre_llm_call": None}))
    rig.start()
    rig.client.event("before_agent_start", {"prompt": "q"})
    for text, stop in (("partial", "error"), ("final", "stop")):
        rig.client.event("agent_end", {"messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": text, "stopReason": stop}]})
    rig.client.event("agent_settled", {})
    posts = [c for c in rig.worker.calls if c[1] == "post_llm_call"]
    assert [p[2]["assistant_response"] for p in posts] == ["final"]


def test_invalid_event_is_a_typed_error(system):
    rig = Rig(system)
    with pytest.raises(InvalidParams):
        rig.client.event("agent_exploded", {})
    with pytest.raises(InvalidParams):
        rig.client.event("agent_end", {"messages": "nope"})


def test_controller_crash_answers_waiting_callers(system):
    worker = FakeWorker({"pre_llm_call": {"context": SAMPLE}})
    worker.gates["pre_llm_call"] = threading.Event()
    rig = Rig(system, worker=worker)
    rig.start()
    _, fut = rig.client.submit("before_agent_start", {"prompt": "q"})
    assert worker.wait_calls(2)
    rig.hooks.kill("test")
    assert fut.result(5) is None
    worker.gates["pre_llm_call"].set()
    assert rig.client.status(timeout=5).in_flight == 0  # restarted incarnation ignores late completions


# ---- ClassifierActor and AuditActor directly

def test_classifier_actor_remote_notice_once(system):
    fake = FakeClassifier(models=[REMOTE])
    h = system.spawn(ChildSpec(id="c-remote", factory=lambda: ClassifierActor(fake, parse_choice("default"))))
    first = h.ask(Classify(context=SAMPLE, prompt="q", deadline=time.monotonic() + 5), timeout=6)
    second = h.ask(Classify(context=SAMPLE, prompt="q", deadline=time.monotonic() + 5), timeout=6)
    assert first.notices == (REMOTE_NOTICE,) and second.notices == ()
    assert first.result.outcome is Outcome.FILTERED


def test_classifier_actor_none_and_registry_missing(system):
    fake = FakeClassifier(models=None)
    h = system.spawn(ChildSpec(id="c-none", factory=lambda: ClassifierActor(fake, parse_choice("none"))))
    assert h.ask(Classify(context=SAMPLE, prompt="q", deadline=time.monotonic() + 5)).result is None
    h2 = system.spawn(ChildSpec(id="c-noreg", factory=lambda: ClassifierActor(fake, parse_choice("default"))))
    res = h2.ask(Classify(context=SAMPLE, prompt="q", deadline=time.monotonic() + 5)).result
    assert res.reason is Reason.NO_REGISTRY and res.text == SAMPLE


def test_run_bounded_deadline_and_cancel():
    hold = threading.Event()
    with pytest.raises(Timeout):  # the work takes 5 s: only the 0.1 s deadline raises
        run_bounded(lambda: hold.wait(5), time.monotonic() + 0.1, None)
    token = CancelToken()
    threading.Timer(0.05, token.cancel).start()
    with pytest.raises(Cancelled):
        run_bounded(lambda: hold.wait(5), time.monotonic() + 5, token)
    with pytest.raises(Cancelled):
        run_bounded(lambda: 1, time.monotonic() + 5, token)  # already cancelled: not even started
    assert run_bounded(lambda: 7, time.monotonic() + 5, CancelToken()) == 7
    hold.set()


def test_audit_actor_best_effort_for_fallback(system):
    log = FakeSessionLog(fail=OSError("x"))
    ui = FakeUi()
    h = system.spawn(ChildSpec(id="aud-fb", factory=lambda: AuditActor(log, ui)))
    from castor.domain.icarus.classify import classify_context
    fake = FakeClassifier(raw="not json")
    res = classify_context(SAMPLE, "q", parse_choice("default"), list_models=fake.list_models,
                           complete=lambda r: fake.complete(r, float("inf")))
    out = h.ask(AuditAndRelease(original=SAMPLE, result=res, duration_ms=3))
    assert out.text == SAMPLE and not out.persisted and not out.warned and ui.notices == []


def test_a_worker_that_cannot_start_is_said_once_with_its_cause():
    """A python that does not exist: every prompt said "lost the worker process; a fresh one starts
    on the next call" -- no worker ever ran, and none would."""
    from castor.actors.icarus.session import _ObservedWorker
    from castor.messages.errors import WorkerCrashed

    class NoWorker:
        def call(self, *_args, **_kwargs):
            raise WorkerCrashed("icarus worker could not start: No such file or directory", may_have_started=False,
                                data={"reason": "spawn_failed", "python": "/opt/venv-typo/bin/python3"})

    said: list[str] = []
    observed = _ObservedWorker(lambda: NoWorker(), said.append)
    for _ in range(3):
        with pytest.raises(WorkerCrashed):
            observed.call("hooks", "pre_llm_call", [], {})
    assert len(said) == 1 and "could not start" in said[0] and "/opt/venv-typo/bin/python3" in said[0], said
