"""``interrupted_document`` (the listing's cheap read of a saved state) agrees with
``CastState.interrupted`` at every state a cast passes through: started, interrupted by the
user's Esc, continued, answered, complete; and after an abort of an interrupted cast."""

from __future__ import annotations

import json

import pytest

from castor.domain.materia.cast_messages import AbortRequested, ContinueRequested, TurnEnded
from castor.domain.materia.state import CastState, interrupted_document

from .test_interrupted_turns import esc, text_cast

pytestmark = pytest.mark.timeout(30)


def _saved(state: CastState) -> dict:
    """The document ``state.json`` holds for ``state`` (its JSON, read back)."""
    return json.loads(state.model_dump_json())


def _answer(d) -> None:
    d.send(TurnEnded, visit_id=d.pending().visit_id, text="done", stop_reason="stop")


@pytest.mark.parametrize("end", ["complete", "abort"])
def test_the_listing_s_read_of_interrupted_agrees_with_the_state_at_every_step(end: str) -> None:
    d = text_cast()
    esc(d)
    assert d.state.interrupted  # the path below really passes through an interrupted state
    if end == "complete":
        d.send(ContinueRequested)
        _answer(d)
        _answer(d)
        assert not d.state.active
    else:
        d.send(AbortRequested)
    seen = set()
    for transition in d.transitions:
        state = transition.state
        assert interrupted_document(_saved(state)) is state.interrupted, state.socket_state
        seen.add(state.interrupted)
    assert seen == {True, False}
