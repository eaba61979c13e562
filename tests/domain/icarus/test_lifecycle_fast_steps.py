"""The commonest prompt's two steps as functions of their own (``prompt_step``, ``prompt_answered``):
where they decide, the general ``step``'s very values; where ``step`` gives their shape, they decide."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from castor.domain.icarus.lifecycle import (
    MAX_CONTEXT_CHARS,
    BeforeAgentStart,
    CallWorker,
    HookConfig,
    HookState,
    InFlight,
    Pending,
    Reply,
    SetStatus,
    WorkerDone,
    initial_state,
    prompt_answered,
    prompt_step,
    step,
)

pytestmark = pytest.mark.timeout(60)

_texts = st.sampled_from(["q", "  ", "", "hello world", "\n", "x" * 3])
_inflight = st.dictionaries(
    st.sampled_from(["r1", "r2", "r3"]),
    st.builds(InFlight, kind=st.sampled_from(["start", "prompt", "capture", "shutdown"]),
              generation=st.integers(0, 2), prompt=_texts, stage=st.sampled_from(["worker", "filter"])),
    max_size=3)


@st.composite
def _states(draw: st.DrawFn) -> HookState:
    config = HookConfig(hooks_registered=draw(st.booleans()), filtering=draw(st.booleans()),
                        footer_status=draw(st.sampled_from(["footer", "other"])))
    state = initial_state(config)
    pending = draw(st.none() | st.builds(Pending, generation=st.integers(0, 2), prompt=st.none() | _texts,
                                         hidden=st.booleans()))
    return state.evolve(enabled=draw(st.booleans()) and config.hooks_registered, visible=draw(st.booleans()),
                        generation=draw(st.integers(0, 2)), session_id=draw(st.sampled_from(["", "S1"])),
                        started=draw(st.booleans()), shut_down=draw(st.booleans()), first_turn=draw(st.booleans()),
                        pending=pending, inflight=draw(_inflight))


@settings(max_examples=400, deadline=None)
@given(state=_states(), prompt=_texts | st.none() | st.just(["a list", {"text": "b"}]), custom=st.booleans(),
       request=st.sampled_from(["r1", "r9"]))
def test_prompt_step_is_step_where_it_decides_and_decides_every_retrieval(state, prompt, custom, request):
    event = BeforeAgentStart(request=request, prompt=prompt, custom=custom)
    general = step(state, event)
    fast = prompt_step(state, event)
    nxt, effects = general
    retrieval = (len(effects) == 2 and type(effects[0]) is SetStatus and type(effects[1]) is CallWorker)
    if fast is not None:
        assert (fast[0], [fast[1], fast[2]]) == (nxt, effects)
    else:
        assert not retrieval or type(prompt) is not str  # a non-string prompt is flattened by step alone


_results = (st.none() | st.just({}) | st.just({"context": None}) | st.just({"context": 7})
            | st.builds(lambda t: {"context": t}, _texts) | st.just({"context": " " * (MAX_CONTEXT_CHARS + 1)})
            | st.just({"context": "x" * (MAX_CONTEXT_CHARS + 1)}) | st.just("not a map"))


@settings(max_examples=400, deadline=None)
@given(state=_states(), request=st.sampled_from(["r1", "r2", "r9"]), ok=st.booleans(), result=_results)
def test_prompt_answered_is_step_where_it_decides_and_decides_every_prompt_answered_alone(state, request, ok, result):
    done = WorkerDone(request=request, ok=ok, result=result, error_code=None if ok else "timeout")
    nxt, effects = step(state, done)
    fast = prompt_answered(state, done)
    fl = state.inflight.get(request)
    if fast is not None:
        assert (fast[0], [fast[1]]) == (nxt, effects)
    elif fl is not None and fl.kind == "prompt":
        assert not (len(effects) == 1 and type(effects[0]) is Reply and effects[0].result is None)
