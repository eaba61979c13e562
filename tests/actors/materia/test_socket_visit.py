"""SocketActor: an answer is handed on exactly once, whether the port gives it at once or later."""

from __future__ import annotations

import threading

import pytest

from castor.actors.materia.messages import CastOutcome
from castor.actors.materia.socket_actor import socket_spec
from castor.domain.materia.cast_messages import RunAgentTurn
from castor.ports.agent import TurnOutcome, TurnReply, TurnRequest, may_reply_inline
from castor.supervision import Actor, ChildSpec, Restart, handles

from .helpers import make_runtime, open_session

pytestmark = pytest.mark.timeout(30)


class _Collector(Actor):
    """Stands in for the CastActor: records every outcome a visit hands on."""

    def __init__(self, got: list[CastOutcome], arrived: threading.Event) -> None:
        super().__init__()
        self.got, self.arrived = got, arrived

    @handles(CastOutcome)
    def _on_outcome(self, message: CastOutcome) -> None:
        self.got.append(message)
        self.arrived.set()


class _Port:
    """An AgentPort that answers twice (the second one must be dropped), inline or from a thread."""

    def __init__(self, *, inline: bool) -> None:
        self.inline = inline
        self.reply_threads: list[int] = []
        self.turn_threads: list[int] = []
        self.release = threading.Event()  # a later answer waits for it

    def run_turn(self, request: TurnRequest, reply: TurnReply) -> None:
        self.turn_threads.append(threading.get_ident())
        def answer() -> None:
            self.reply_threads.append(threading.get_ident())
            for text in ("first", "second"):
                reply(TurnOutcome(turn_id=request.turn_id, text=text, stop_reason="stop"))

        if self.inline:
            assert may_reply_inline(reply)
            answer()
        else:
            threading.Thread(target=lambda: self.release.wait(10) and answer(), daemon=True).start()

    def cancel(self, turn_id: str) -> None:
        pass


def _effect() -> RunAgentTurn:
    return RunAgentTurn(visit_id="c:Socket-1:1:1", socket_id="Socket-1", visit=1, materia="step", mode="normal",
                        prompt="p", system_prompt="", visible_summary="", tools="none")


@pytest.mark.parametrize("inline", [True, False], ids=["answered-inline", "answered-later"])
def test_a_visit_hands_on_the_first_answer_once_and_exits(tmp_path, inline):
    rt = make_runtime()
    try:
        open_session(rt, "s", tmp_path, {"*": []})
        got: list[CastOutcome] = []
        arrived = threading.Event()
        cast = rt.system.spawn(ChildSpec(id="collector", factory=lambda: _Collector(got, arrived),
                                         restart=Restart.TEMPORARY))
        port = _Port(inline=inline)
        visit = rt.system.spawn(socket_spec(_effect(), cast=cast, cast_id="c", agent=port),
                                under=rt.session("s").child("socket"))
        # on_start (which sends the turn) ran on the spawner's thread, inside spawn; a visit
        # answered there had ended by the time spawn returned, without a loop thread.
        assert port.turn_threads == [threading.get_ident()]
        assert visit.wait_exited(0) is inline
        port.release.set()
        assert arrived.wait(10)
        assert visit.wait_exited(10)
        assert [m.event.text for m in got] == ["first"] and got[0].event.visit_id == "c:Socket-1:1:1"
        # Answered inline, inside run_turn on the visit's thread: handed on after run_turn
        # returned, with no message to itself; answered later: one TurnReplied was processed.
        assert visit.processed == (0 if inline else 1)
    finally:
        rt.shutdown(10)


@pytest.mark.parametrize("changes", [
    {},
    {"model": "prov/m", "thinking": "high", "tools": "coding", "item_key": "k1", "mode": "refinement",
     "item_label": "Item one", "materia_model": {"model": "m", "provider": "prov", "source": "configured"}},
    {"thinking": "not-a-level", "tools": "readOnly", "mode": "finalization", "visit": 0},
])
def test_the_turn_request_built_without_validation_is_the_validated_one(changes: dict) -> None:
    from castor.actors.materia.socket_actor import _THINKING, turn_request

    effect = RunAgentTurn(**{"visit_id": "c:A:1:1", "socket_id": "A", "visit": 1, "materia": "m", "mode": "normal",
                             "prompt": "p", "system_prompt": "", "visible_summary": "s", "tools": "none", **changes})
    fast = turn_request(effect, "c")
    validated = TurnRequest(turn_id=effect.visit_id, cast_id="c", socket_id=effect.socket_id, visit=effect.visit,
                            prompt=effect.prompt, summary=effect.visible_summary, model=effect.model,
                            thinking=_THINKING.get(effect.thinking or ""), tools=effect.tools,
                            item_key=effect.item_key, mode=effect.mode, materia=effect.materia,
                            item_label=effect.item_label, materia_model=effect.materia_model)
    assert fast == validated
    assert fast.__dict__ == validated.__dict__ and list(fast.__dict__) == list(validated.__dict__)
    assert fast.__pydantic_fields_set__ == validated.__pydantic_fields_set__
    assert TurnRequest.__pydantic_serializer__.to_json(fast) == TurnRequest.__pydantic_serializer__.to_json(validated)


def test_a_turn_request_that_breaks_its_constraints_is_still_refused() -> None:
    from pydantic import ValidationError

    from castor.actors.materia.socket_actor import turn_request

    effect = RunAgentTurn(visit_id="", socket_id="A", visit=1, materia="m", mode="normal", prompt="p",
                          system_prompt="", visible_summary="s", tools="none")
    with pytest.raises(ValidationError):
        turn_request(effect, "c")
