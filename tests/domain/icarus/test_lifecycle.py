"""Hook lifecycle machine (§3, §8 21-37, 39): pure, deterministic walk-throughs."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from castor.domain.icarus.lifecycle import (
    AgentEnd,
    AgentSettled,
    BeforeAgentStart,
    CallWorker,
    CancelFilter,
    CloseWorker,
    ContextEvent,
    Filter,
    FilterDone,
    HookConfig,
    InFlight,
    Pending,
    Reply,
    SendMessage,
    SessionShutdown,
    SessionStart,
    SetEnabled,
    SetStatus,
    SetVisible,
    TurnAborted,
    WorkerDone,
    flatten,
    initial_state,
    step,
)


class Driver:
    """Feeds events, collects effects; never uses threads."""

    def __init__(self, **cfg):
        self.state = initial_state(HookConfig(**cfg))
        self.effects: list = []
        self._ids = itertools.count(1)

    def send(self, event):
        self.state, eff = step(self.state, event)
        self.effects.extend(eff)
        return eff

    def req(self) -> str:
        return f"r{next(self._ids)}"

    def calls(self, function=None):
        return [e for e in self.effects if isinstance(e, CallWorker) and (function is None or e.function == function)]

    def reply(self, request):
        (r,) = [e for e in self.effects if isinstance(e, Reply) and e.request == request]
        return r.result

    def replies(self, request):
        return [e for e in self.effects if isinstance(e, Reply) and e.request == request]

    def start(self, sid="S1", context=None):
        r = self.req()
        self.send(SessionStart(request=r, session_id=sid))
        if self.calls("on_session_start") and self.calls("on_session_start")[-1].request == r:
            self.send(WorkerDone(request=r, ok=True, result=None if context is None else {"context": context}))
        return r

    def prompt(self, text, custom=False):
        r = self.req()
        self.send(BeforeAgentStart(request=r, prompt=text, custom=custom))
        return r


def test_21_startup_context_sent_hidden_without_turn():
    d = Driver(context_display=False)
    r = d.start(context="startup memory")
    msgs = [e for e in d.effects if isinstance(e, SendMessage)]
    assert msgs == [SendMessage(custom_type="icarus-session-context", content="startup memory",
                                display=False, trigger_turn=False)]
    assert d.reply(r) is None


def test_22_blank_startup_context_sends_nothing():
    d = Driver()
    d.start(context="  ")
    assert not [e for e in d.effects if isinstance(e, SendMessage)]


def test_23_on_session_start_kwargs_exact():
    d = Driver()
    d.start(sid="abc")
    assert d.calls("on_session_start")[0].kwargs == {"session_id": "abc", "platform": "pi"}
    assert d.calls("on_session_start")[0].module == "hooks"


def test_24_disabled_and_blank_prompts_do_not_consume_first_turn():
    d = Driver()
    d.start()
    d.send(SetEnabled(enabled=False))
    d.prompt("while off")
    d.send(SetEnabled(enabled=True))
    d.prompt("")
    d.prompt("   \n ")
    assert d.calls("pre_llm_call") == []
    d.prompt("first real")
    d.prompt("second")
    assert [c.kwargs["is_first_turn"] for c in d.calls("pre_llm_call")] == [True, False]
    assert d.calls("pre_llm_call")[0].kwargs == {"session_id": "S1", "user_message": "first real",
                                                 "is_first_turn": True}


def test_25_new_session_rearms_first_turn_with_new_id():
    d = Driver()
    d.start("A")
    d.prompt("one")
    d.start("B")
    d.prompt("two")
    assert [(c.kwargs["session_id"], c.kwargs["is_first_turn"]) for c in d.calls("pre_llm_call")] == [
        ("A", True), ("B", True)]


def test_26_context_injected_with_visibility():
    d = Driver(filtering=False, context_display=False)
    d.start()
    r = d.prompt("hi")
    d.send(WorkerDone(request=r, ok=True, result={"context": "m"}))
    assert d.reply(r) == {"message": {"customType": "icarus-memory-context", "content": "m", "display": False}}


@pytest.mark.parametrize("filtering", [False, True])
def test_26c_a_runaway_context_is_dropped_with_a_warning_and_the_hook_answers_none(filtering):
    """A 17 MB context made the hook's answer larger than a frame may be: ``harness.event`` answered
    ``internal`` (result too large) instead of the ambient ``{}``. Over the bound it is not injected
    (nor filtered); the warning carries its size, never its text."""
    from castor.domain.icarus.lifecycle import MAX_CONTEXT_CHARS, Filter, Log, SendMessage

    d = Driver(filtering=filtering)
    d.start(context="s" * (MAX_CONTEXT_CHARS + 1))
    r = d.prompt("hi")
    d.send(WorkerDone(request=r, ok=True, result={"context": "y" * (MAX_CONTEXT_CHARS + 1)}))
    assert d.reply(r) is None
    assert not [e for e in d.effects if isinstance(e, (SendMessage, Filter))]
    logs = [e for e in d.effects if isinstance(e, Log) and e.event == "icarus.context_too_large"]
    assert [(e.function, e.code) for e in logs] == [("start", f"{MAX_CONTEXT_CHARS + 1}>{MAX_CONTEXT_CHARS}"),
                                                   ("prompt", f"{MAX_CONTEXT_CHARS + 1}>{MAX_CONTEXT_CHARS}")]
    r2 = d.prompt("again")  # the bound is on length only: a context of exactly the limit is injected
    d.send(WorkerDone(request=r2, ok=True, result={"context": "z" * MAX_CONTEXT_CHARS}))
    if filtering:
        assert [e.context for e in d.effects if isinstance(e, Filter)] == ["z" * MAX_CONTEXT_CHARS]
    else:
        assert d.reply(r2)["message"]["content"] == "z" * MAX_CONTEXT_CHARS


def test_26b_filtering_routes_through_filter_then_injects_filtered_text():
    d = Driver()
    d.start()
    r = d.prompt("hi")
    d.send(WorkerDone(request=r, ok=True, result={"context": "[fabric] x"}))
    assert [e for e in d.effects if isinstance(e, Filter)] == [Filter(request=r, context="[fabric] x", prompt="hi")]
    assert d.replies(r) == []
    d.send(FilterDone(request=r, text="kept"))
    assert d.reply(r)["message"]["content"] == "kept"
    d2 = Driver()
    d2.start()
    r2 = d2.prompt("hi")
    d2.send(WorkerDone(request=r2, ok=True, result={"context": "c"}))
    d2.send(FilterDone(request=r2, text=None))  # all rejected
    assert d2.reply(r2) is None


def test_27_custom_run_skips_and_keeps_first_turn():
    d = Driver()
    d.start()
    r = d.prompt("hello", custom=True)
    assert d.calls("pre_llm_call") == [] and d.reply(r) is None
    d.prompt("real")
    assert d.calls("pre_llm_call")[0].kwargs["is_first_turn"] is True


def test_28_off_then_on_while_retrieval_in_flight_injects_nothing():
    d = Driver(filtering=False)
    d.start()
    r = d.prompt("hi")
    d.send(SetEnabled(enabled=False))
    d.send(SetEnabled(enabled=True))
    d.send(WorkerDone(request=r, ok=True, result={"context": "stale"}))
    assert d.replies(r) == [Reply(request=r, result=None)]  # answered once, at invalidation


@pytest.mark.parametrize("invalidator", ["shutdown", "new_session"])
def test_29_shutdown_or_replacement_drops_stale_result(invalidator):
    d = Driver(filtering=False)
    d.start()
    r = d.prompt("hi")
    if invalidator == "shutdown":
        d.send(SessionShutdown(request=d.req()))
    else:
        d.start("S2")
    d.send(WorkerDone(request=r, ok=True, result={"context": "stale"}))
    assert d.replies(r) == [Reply(request=r, result=None)]


def test_invalidation_during_classification_cancels_and_drops():
    d = Driver()
    d.start()
    r = d.prompt("hi")
    d.send(WorkerDone(request=r, ok=True, result={"context": "ctx"}))
    d.send(SetEnabled(enabled=False))
    assert CancelFilter(request=r) in d.effects
    d.send(SetEnabled(enabled=True))
    d.send(FilterDone(request=r, text="late filtered"))
    assert d.replies(r) == [Reply(request=r, result=None)]


def test_46_turn_abort_during_classification_injects_nothing():
    d = Driver()
    d.start()
    r = d.prompt("hi")
    d.send(WorkerDone(request=r, ok=True, result={"context": "ctx"}))
    d.send(TurnAborted(request=r))
    d.send(FilterDone(request=r, text="late"))
    assert CancelFilter(request=r) in d.effects and d.replies(r) == [Reply(request=r, result=None)]


def test_turn_abort_during_retrieval_does_not_cancel_worker_call():
    d = Driver(filtering=False)
    d.start()
    r = d.prompt("hi")
    d.send(TurnAborted(request=r))
    d.send(WorkerDone(request=r, ok=True, result={"context": "late"}))
    assert d.replies(r) == [Reply(request=r, result=None)]
    assert not [e for e in d.effects if isinstance(e, CancelFilter)]


def asst(text, stop="stop"):
    return {"role": "assistant", "content": [{"type": "text", "text": text}], "stopReason": stop}


def user(text):
    return {"role": "user", "content": text}


def test_30_retries_then_settle_capture_once_with_final_text():
    d = Driver()
    d.start()
    d.prompt("q")
    d.send(AgentEnd(request=d.req(), messages=(user("q"), asst("partial", "error"))))
    d.send(AgentEnd(request=d.req(), messages=(user("q"), asst("final answer"))))
    assert d.calls("post_llm_call") == []
    r = d.req()
    d.send(AgentSettled(request=r))
    (call,) = d.calls("post_llm_call")
    assert call.kwargs == {"session_id": "S1", "user_message": "q", "assistant_response": "final answer",
                           "platform": "pi"}
    d.send(AgentSettled(request=d.req()))  # a second settlement has nothing buffered
    assert len(d.calls("post_llm_call")) == 1
    d.send(WorkerDone(request=r, ok=True))
    assert d.reply(r) is None


def test_31_agent_end_without_settlement_never_captures():
    d = Driver()
    d.start()
    d.prompt("q")
    d.send(AgentEnd(request=d.req(), messages=(user("q"), asst("a"))))
    assert d.calls("post_llm_call") == []


@pytest.mark.parametrize("stop,text", [("aborted", "a"), ("error", "a"), ("length", "a"), ("toolUse", "a"),
                                       ("stop", ""), ("stop", "  ")])
def test_32_no_capture_for_non_stop_or_empty(stop, text):
    d = Driver()
    d.start()
    d.prompt("q")
    d.send(AgentEnd(request=d.req(), messages=(user("q"), asst(text, stop))))
    d.send(AgentSettled(request=d.req()))
    assert d.calls("post_llm_call") == []


def test_aborted_settlement_no_capture():
    d = Driver()
    d.start()
    d.prompt("q")
    d.send(AgentEnd(request=d.req(), messages=(user("q"), asst("a"))))
    d.send(AgentSettled(request=d.req(), aborted=True))
    assert d.calls("post_llm_call") == []


def test_33_queued_users_grouped_in_order_and_prompt_fallback():
    d = Driver()
    d.start()
    d.prompt("first")
    d.send(AgentEnd(request=d.req(), messages=(user("first"), asst("x", "toolUse"))))
    d.send(AgentEnd(request=d.req(), messages=(user("second"), asst("done"))))
    d.send(AgentSettled(request=d.req()))
    assert d.calls("post_llm_call")[-1].kwargs["user_message"] == "first\n\nsecond"
    d.prompt("only the prompt")
    d.send(AgentEnd(request=d.req(), messages=(asst("done"),)))
    d.send(AgentSettled(request=d.req()))
    assert d.calls("post_llm_call")[-1].kwargs["user_message"] == "only the prompt"


def castor_prompt(text):
    """A cast's hidden prompt as the harness reports it (Pi: a custom message castor sent)."""
    return {"role": "custom", "content": text, "custom_type": "pi-materia-prompt"}


@pytest.mark.timeout(10)
def test_a_cast_turn_run_inside_the_users_run_is_never_captured_as_the_users_answer():
    """Pi runs a cast's turn that arrives while the user's run goes on as a follow-up of that run:
    one agent_end then holds the user's exchange and the cast's hidden prompt and answer. The
    capture pairs the user's prompt with the user's answer, never with the cast's hidden one."""
    d = Driver()
    d.start()
    d.prompt("user asks")
    d.send(AgentEnd(request=d.req(), messages=(user("user asks"), asst("USER ANSWER"),
                                               castor_prompt("HIDDEN PROMPT"), asst("HIDDEN ANSWER"))))
    d.send(AgentSettled(request=d.req()))
    (call,) = d.calls("post_llm_call")
    assert (call.kwargs["user_message"], call.kwargs["assistant_response"]) == ("user asks", "USER ANSWER")


@pytest.mark.timeout(10)
def test_a_cast_turns_answer_buffered_before_a_user_prompt_is_not_captured_for_that_prompt():
    """The end of a cast's own run reaches castor, then the user's next prompt, then that cast
    run's settlement (Pi reports it after the turn's end): nothing of the cast's run is captured,
    and the user's own run is captured at its settlement."""
    d = Driver()
    d.start()
    d.prompt("HIDDEN PROMPT", custom=True)
    d.send(AgentEnd(request=d.req(), messages=(castor_prompt("HIDDEN PROMPT"), asst("HIDDEN ANSWER"))))
    d.prompt("user asks")
    d.send(AgentSettled(request=d.req()))  # the cast run's settlement, late
    assert d.calls("post_llm_call") == []
    d.send(AgentEnd(request=d.req(), messages=(user("user asks"), asst("USER ANSWER"))))
    d.send(AgentSettled(request=d.req()))
    (call,) = d.calls("post_llm_call")
    assert (call.kwargs["user_message"], call.kwargs["assistant_response"]) == ("user asks", "USER ANSWER")


@pytest.mark.timeout(10)
def test_a_user_message_queued_into_a_cast_turns_run_is_captured_with_its_own_answer():
    d = Driver()
    d.start()
    d.prompt("HIDDEN PROMPT", custom=True)
    d.send(AgentEnd(request=d.req(), messages=(castor_prompt("HIDDEN PROMPT"), asst("HIDDEN ANSWER"),
                                               user("typed meanwhile"), asst("ANSWER TO IT"))))
    d.send(AgentSettled(request=d.req()))
    (call,) = d.calls("post_llm_call")
    assert (call.kwargs["user_message"], call.kwargs["assistant_response"]) == ("typed meanwhile", "ANSWER TO IT")
    # Icarus's own injected context is a custom message too: the user's answer after it still counts
    d.prompt("q2")
    d.send(AgentEnd(request=d.req(), messages=(user("q2"), {"role": "custom", "content": "memory",
                                                            "custom_type": "icarus-memory-context"}, asst("A2"))))
    d.send(AgentSettled(request=d.req()))
    assert d.calls("post_llm_call")[-1].kwargs["assistant_response"] == "A2"


def test_34_disable_reenable_before_settlement_drops_buffer():
    d = Driver()
    d.start()
    d.prompt("q")
    d.send(AgentEnd(request=d.req(), messages=(user("q"), asst("a"))))
    d.send(SetEnabled(enabled=False))
    d.send(SetEnabled(enabled=True))
    d.send(AgentSettled(request=d.req()))
    assert d.calls("post_llm_call") == []


def test_35_shutdown_ends_session_clears_footer_closes_once():
    d = Driver()
    d.start("S9")
    r = d.req()
    d.send(SessionShutdown(request=r))
    assert d.calls("on_session_end")[0].kwargs == {"session_id": "S9", "platform": "pi"}
    assert not [e for e in d.effects if isinstance(e, CloseWorker)]
    d.send(WorkerDone(request=r, ok=True))
    assert d.effects[-3:] == [SetStatus(text=None), CloseWorker(), Reply(request=r)]
    d.send(SessionShutdown(request=d.req()))  # a repeated shutdown does not close again
    d.prompt("after shutdown")
    assert sum(isinstance(e, CloseWorker) for e in d.effects) == 1
    assert len(d.calls()) == 2


def test_36_every_hook_failing_returns_nothing_and_shutdown_still_closes():
    d = Driver(filtering=False)
    r0 = d.req()
    d.send(SessionStart(request=r0, session_id="S"))
    d.send(WorkerDone(request=r0, ok=False, error_code="internal"))
    r1 = d.prompt("hi")
    d.send(WorkerDone(request=r1, ok=False, error_code="timeout"))
    d.send(AgentEnd(request=d.req(), messages=(user("hi"), asst("a"))))
    r2 = d.req()
    d.send(AgentSettled(request=r2))
    d.send(WorkerDone(request=r2, ok=False, error_code="worker_crashed"))
    r3 = d.req()
    d.send(SessionShutdown(request=r3))
    d.send(WorkerDone(request=r3, ok=False, error_code="worker_retired"))
    for r in (r0, r1, r2, r3):
        assert d.reply(r) is None
    assert CloseWorker() in d.effects


def test_37_toggle_footer():
    d = Driver(footer_status="🪽 Icarus")
    d.start()
    eff = d.send(SetEnabled())
    assert eff[-1] == SetStatus(text=None) and d.state.enabled is False
    eff = d.send(SetEnabled())
    assert eff == [SetStatus(text="🪽 Icarus")]


def test_39_repeated_start_same_known_id_dedupes_empty_id_does_not():
    d = Driver()
    d.start("S1")
    d.start("S1")
    assert len(d.calls("on_session_start")) == 1
    d.start("")
    d.start("")
    assert len(d.calls("on_session_start")) == 3
    d.send(SessionShutdown(request=d.req()))
    d.start("S1")  # a start after shutdown is a real start again
    assert len(d.calls("on_session_start")) == 4


def test_dedupe_keeps_in_flight_startup_alive():
    d = Driver()
    r = d.req()
    d.send(SessionStart(request=r, session_id="S1"))
    d.send(SessionStart(request=d.req(), session_id="S1"))  # duplicate dispatch
    d.send(WorkerDone(request=r, ok=True, result={"context": "boot"}))
    assert [e.content for e in d.effects if isinstance(e, SendMessage)] == ["boot"]


def test_startup_result_dropped_when_replaced_mid_call():
    d = Driver()
    r = d.req()
    d.send(SessionStart(request=r, session_id="A"))
    d.start("B")
    d.send(WorkerDone(request=r, ok=True, result={"context": "from A"}))
    assert not [e for e in d.effects if isinstance(e, SendMessage) and e.content == "from A"]


def test_hooks_not_registered_only_closes_on_shutdown():
    d = Driver(hooks_registered=False)
    d.start()
    d.prompt("hi")
    d.send(AgentEnd(request=d.req(), messages=(user("hi"), asst("a"))))
    d.send(AgentSettled(request=d.req()))
    assert d.calls() == []
    r = d.req()
    d.send(SessionShutdown(request=r))
    assert d.effects[-2:] == [CloseWorker(), Reply(request=r)]


def test_disabled_session_start_clears_footer_and_skips_worker():
    d = Driver()
    d.send(SetEnabled(enabled=False))
    r = d.req()
    d.send(SessionStart(request=r, session_id="S"))
    assert d.calls() == [] and SetStatus(text=None) in d.effects and d.reply(r) is None


def test_visibility_toggle_and_context_event():
    d = Driver(filtering=False)
    d.start()
    d.send(SetVisible())
    r = d.prompt("x")
    d.send(WorkerDone(request=r, ok=True, result={"context": "c"}))
    assert d.reply(r)["message"]["display"] is False
    rc = d.req()
    d.send(ContextEvent(request=rc))
    assert d.reply(rc) is None


def test_every_request_gets_exactly_one_reply_in_a_long_random_walk():
    import random
    rng = random.Random(7)
    d = Driver()
    open_reqs: list[str] = []
    all_reqs: list[str] = []
    for _ in range(600):
        choice = rng.randrange(9)
        if choice == 0:
            r = d.req()
            d.send(SessionStart(request=r, session_id=rng.choice(["", "A", "B"])))
        elif choice == 1:
            r = d.prompt(rng.choice(["", "q", "hello"]), custom=rng.random() < 0.2)
        elif choice == 2:
            r = d.req()
            d.send(AgentEnd(request=r, messages=(user("u"), asst("a", rng.choice(["stop", "error"])))))
        elif choice == 3:
            r = d.req()
            d.send(AgentSettled(request=r, aborted=rng.random() < 0.2))
        elif choice == 4:
            r = d.req()
            d.send(SessionShutdown(request=r))
        elif choice == 5:
            d.send(SetEnabled(enabled=rng.choice([None, True, False])))
            continue
        elif choice in (6, 7) and open_reqs:
            r = rng.choice(open_reqs)
            if choice == 6:
                d.send(WorkerDone(request=r, ok=rng.random() < 0.8, result={"context": "ctx"}))
            else:
                d.send(FilterDone(request=r, text=rng.choice([None, "kept"])))
            continue
        elif choice == 8 and open_reqs:
            d.send(TurnAborted(request=rng.choice(open_reqs)))
            continue
        else:
            continue
        all_reqs.append(r)
        open_reqs = [x for x in all_reqs if not d.replies(x)]
    # drain: complete every outstanding worker call and filter
    for _ in range(3):
        for r in list(d.state.inflight):
            fl = d.state.inflight[r]
            d.send(WorkerDone(request=r, ok=True, result={"context": "c"}) if fl.stage == "worker"
                   else FilterDone(request=r, text="t"))
    for r in all_reqs:
        assert len(d.replies(r)) == 1, r
    assert not d.state.inflight


def test_flatten_rules():
    assert flatten("s") == "s"
    assert flatten(["a", "", {"text": "b"}, {"type": "thinking", "thinking": "x"}, {"content": "c"}, 5]) == "a\nb\nc"
    assert flatten(None) == "" and flatten({"type": "toolCall", "name": "x"}) == ""


# --------------------------------------------------------------------------- evolve == dataclasses.replace

@pytest.mark.parametrize("make, update", [
    (lambda: initial_state(HookConfig(session_id="s1")), {"first_turn": False, "generation": 3}),
    (lambda: initial_state(), {"inflight": {"r": InFlight(kind="prompt", generation=0)}, "pending": None}),
    (lambda: Pending(generation=1, prompt="p"), {"users": ("a", "b"), "assistant_text": None}),
    (lambda: InFlight(kind="capture", generation=2), {"stage": "filter"}),
    (lambda: initial_state(), {}),
])
def test_evolve_is_replace_with_update(make, update):
    original = make()
    before = dataclasses.astuple(original)
    evolved, replaced = original.evolve(**update), dataclasses.replace(original, **update)
    assert evolved == replaced and type(evolved) is type(replaced) and evolved is not original
    assert repr(evolved) == repr(replaced)
    assert dataclasses.astuple(original) == before  # the original is untouched


def test_evolve_refuses_a_name_that_is_no_field():
    with pytest.raises(TypeError, match="generaton"):
        initial_state().evolve(generaton=1)


def test_the_machines_values_are_slotted_and_compared_by_class():
    """No instance dict (every attribute is a slot: a misspelt store fails), and two values of
    different classes with the same fields are not equal."""
    state = initial_state()
    with pytest.raises(AttributeError):
        state.generaton = 1  # type: ignore[attr-defined]  # the misspelling is the test
    assert not hasattr(state, "__dict__")
    assert CancelFilter(request="r") != TurnAborted(request="r")


def _value_classes() -> list[type]:
    from castor.domain.icarus import lifecycle

    return [c for c in vars(lifecycle).values()
            if isinstance(c, type) and issubclass(c, lifecycle._Frozen) and c is not lifecycle._Frozen]


@pytest.mark.parametrize("cls", _value_classes(), ids=lambda c: c.__name__)
def test_build_is_the_class_call(cls):
    """``build`` (a plain function, for the hook call's hot path) makes the value the class call
    makes: with only the required fields, with every field given, and a default factory's value
    fresh each time; a name that is no field is a TypeError."""
    fields = dataclasses.fields(cls)
    required = {f.name: f"v-{f.name}" for f in fields
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    every = {f.name: f"w-{f.name}" for f in fields}
    for given in (required, every):
        built, called = cls.build(**given), cls(**given)
        assert built == called and type(built) is cls and repr(built) == repr(called)
        assert not hasattr(built, "__dict__")
    for f in fields:
        if f.default_factory is not dataclasses.MISSING:
            assert getattr(cls.build(**required), f.name) is not getattr(cls.build(**required), f.name)
    with pytest.raises(TypeError, match="no_such_field"):
        cls.build(**required, no_such_field=1)
