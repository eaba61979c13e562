"""The hook call's hot path builds its messages and effects without re-validating what castor made:
what it builds must be what validation gives."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from castor.actors.icarus.messages import Answer, Feedback, HarnessEvent, feedback, harness_event
from castor.domain.icarus import lifecycle as lc


@pytest.mark.parametrize("current_model,helper", [(None, None), (("anthropic", "claude"), 1234)])
def test_the_fast_harness_event_is_the_validated_message(current_model, helper):
    event = lc.BeforeAgentStart(request="r-1", prompt="hello", custom=False)
    reply = Answer()
    fast = harness_event(event, reply, current_model, helper)
    slow = HarnessEvent(event=event, reply=reply, current_model=current_model, helper=helper)
    assert fast == slow and type(fast) is HarnessEvent
    assert fast.model_fields_set == slow.model_fields_set
    assert list(fast.__dict__) == list(slow.__dict__)
    assert fast.event is event and fast.reply is reply
    with pytest.raises(ValidationError):
        fast.helper = 1  # frozen like any message


@pytest.mark.parametrize("event", [lc.WorkerDone(request="r", ok=True, result={"context": "x"}),
                                   lc.FilterDone(request="r", text=None), lc.TurnAborted(request="r")])
def test_the_fast_feedback_is_the_validated_message(event):
    fast, slow = feedback(event), Feedback(event=event)
    assert fast == slow and type(fast) is Feedback
    assert fast.model_fields_set == slow.model_fields_set
    with pytest.raises(ValidationError):
        fast.event = event


def test_a_prompts_effects_and_state_are_those_of_the_validated_models():
    """The footer is one shared ``SetStatus`` per text, and a prompt's state is one copy (the turn's
    changes and its in-flight entry together): equal to what building each step apart gives."""
    state = lc.initial_state(lc.HookConfig())
    nxt, effects = lc.step(state, lc.BeforeAgentStart(request="r-1", prompt="hello"))
    assert effects[0] == lc.SetStatus(text=state.config.footer_status)
    again, effects2 = lc.step(nxt, lc.BeforeAgentStart(request="r-2", prompt="more"))
    assert effects2[0] is effects[0]  # shared, frozen
    expected = state.evolve(first_turn=False, pending=lc.Pending(generation=0, prompt="hello"))
    expected = expected.evolve(inflight={"r-1": lc.InFlight(kind="prompt", generation=0, prompt="hello")})
    assert nxt == expected
    off = lc.step(nxt, lc.SetEnabled(enabled=False))[1]
    assert lc.SetStatus(text=None) in off
