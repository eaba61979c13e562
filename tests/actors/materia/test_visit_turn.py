"""A visit's turn sent by its cast: a turn answered at once needs no SocketActor; any other turn is
owned by one (shown, stoppable, its crash contained) exactly as when the actor sent it."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from castor.actors.materia.api import materia_call
from castor.actors.materia.messages import CastOutcome, TurnReplied
from castor.actors.materia.socket_actor import VisitTurn
from castor.adapters.stderr_ui import StderrUi
from castor.domain.materia.cast_messages import RunAgentTurn
from castor.ports.agent import TurnOutcome, TurnReply, TurnRequest
from castor.runtime import HarnessLink, SessionInfo

from .helpers import event_types, wait_for, wait_status

pytestmark = pytest.mark.timeout(30)


def _socket_handles(rt: Any, sid: str) -> list[Any]:
    prefix = f"/root/session/{sid}/socket/"
    return [h for h in rt.system.registry.handles(f"/root/session/{sid}/socket") if h.path.startswith(prefix)]


class _Agent:
    """An AgentPort that answers each turn as ``how`` says: "inline" (inside run_turn, on its thread),
    "thread" (from another thread, before run_turn returns), "raise" (run_turn raises; once), or
    "held" (later, when the test releases it). It notes the socket actors registered at each send."""

    agent_label = "test agent"

    def __init__(self, rt: Any, sid: str, how: list[str]) -> None:
        self.rt, self.sid, self.how = rt, sid, list(how)
        self.requests: list[TurnRequest] = []
        self.actors_at_send: list[list[str]] = []
        self.cancelled: list[str] = []
        self.held: dict[str, TurnReply] = {}
        self.sent = threading.Event()

    def run_turn(self, request: TurnRequest, reply: TurnReply) -> None:
        self.requests.append(request)
        self.actors_at_send.append([h.path for h in _socket_handles(self.rt, self.sid)])
        how = self.how.pop(0) if self.how else "inline"
        outcome = TurnOutcome(turn_id=request.turn_id, text=f"answer {len(self.requests)}", stop_reason="stop")
        if how == "raise":
            raise RuntimeError("the port broke while sending the turn")
        if how == "inline":
            reply(outcome)
        elif how == "thread":
            answering = threading.Thread(target=reply, args=(outcome,))
            answering.start()
            answering.join(10)
        else:
            self.held[request.turn_id] = reply
            self.sent.set()

    def cancel(self, turn_id: str) -> None:
        self.cancelled.append(turn_id)
        self.held.pop(turn_id, None)


def _start(rt: Any, project: Any, how: list[str]) -> tuple[_Agent, str]:
    agent = _Agent(rt, "s1", how)
    rt.open_session(SessionInfo(session_id="s1", cwd=str(project), trusted=True),
                    HarnessLink(agent=agent, session_log=None, ui=StderrUi(printer=lambda _line: None)))
    started = materia_call(rt, "s1", "start", {"request": "x", "loadout": "hello"})
    return agent, started["cast_id"]


@pytest.mark.parametrize("how", ["inline", "thread"])
def test_a_turn_answered_before_run_turn_returns_needs_no_socket_actor(runtime_factory, project, how):
    rt = runtime_factory()
    agent, cast_id = _start(rt, project, [how])
    view = wait_status(rt, "s1", cast_id)
    assert view["status"] == "complete"
    # Sent by the cast itself: no SocketActor was registered while the turn ran, nor after.
    assert agent.actors_at_send == [[]] and _socket_handles(rt, "s1") == []
    assert event_types(view["run_dir"]).count("socket_complete") == 1  # handed on once
    counters, _ = rt.system.registry.meters.collect()
    assert _metric(rt, "castor_socket_visits_total") == 1  # counted as a visit all the same
    assert counters.get(("starts", "SocketActor"), 0) == 0  # and no SocketActor was started


def test_a_turn_not_answered_yet_is_owned_by_a_socket_actor_that_shows_and_cancels_it(runtime_factory, project):
    rt = runtime_factory()
    agent, cast_id = _start(rt, project, ["held"])
    assert agent.sent.wait(10)
    [visit] = wait_for(lambda: [h for h in _socket_handles(rt, "s1") if h.activity is not None] or None,
                       what="the visit's SocketActor awaiting its turn")
    assert visit.path == f"/root/session/s1/socket/{cast_id}.{agent.requests[0].turn_id.rsplit(':', 1)[-1]}"
    assert visit.activity[0] == "awaiting_turn"
    materia_call(rt, "s1", "abort", {"cast_id": cast_id})
    assert visit.wait_exited(10)
    assert agent.cancelled == [agent.requests[0].turn_id]  # stopping its owner called the turn off
    assert wait_status(rt, "s1", cast_id)["status"] == "aborted"


def test_a_turn_whose_send_raises_is_a_contained_crash_of_its_visit(runtime_factory, project):
    rt = runtime_factory()
    agent, cast_id = _start(rt, project, ["raise", "inline"])
    view = wait_status(rt, "s1", cast_id)
    assert view["status"] == "complete"
    first, second = agent.requests
    assert first.turn_id != second.turn_id  # the lost visit was re-dispatched under a new id
    assert "cast_recast" in event_types(view["run_dir"])
    counters, _ = rt.system.registry.meters.collect()
    assert counters.get(("crashes", "SocketActor"), 0) == 1  # the visit crashed, not its cast
    assert counters.get(("crashes", "CastActor"), 0) == 0
    assert agent.cancelled == [first.turn_id]


class _Recorder:
    def __init__(self) -> None:
        self.told: list[Any] = []

    def tell(self, message: Any) -> None:
        self.told.append(message)


def _turn(agent: Any) -> tuple[VisitTurn, _Recorder]:
    cast = _Recorder()
    effect = RunAgentTurn(visit_id="c:Socket-1:1:1", socket_id="Socket-1", visit=1, materia="step", mode="normal",
                          prompt="p", system_prompt="", visible_summary="", tools="none")
    return VisitTurn(effect, cast=cast, cast_id="c", agent=agent), cast


class _Keeper:
    def __init__(self) -> None:
        self.reply: TurnReply | None = None

    def run_turn(self, request: TurnRequest, reply: TurnReply) -> None:
        self.reply = reply

    def cancel(self, turn_id: str) -> None:
        pass


def _answer_from_another_thread(reply: TurnReply, text: str) -> None:
    answering = threading.Thread(target=reply, args=(TurnOutcome(turn_id="c:Socket-1:1:1", text=text),))
    answering.start()
    answering.join(10)


def test_an_answer_between_the_send_and_the_takeover_is_handed_on_once_and_the_owner_told_nothing():
    keeper = _Keeper()
    turn, cast = _turn(keeper)
    assert turn.send() is None and keeper.reply is not None
    _answer_from_another_thread(keeper.reply, "early")
    owner = _Recorder()
    assert turn.adopt(owner) is True  # the owner learns it has nothing left to wait for
    _answer_from_another_thread(keeper.reply, "again")
    assert [type(m) for m in cast.told] == [CastOutcome] and cast.told[0].event.text == "early"


def test_an_answer_after_the_takeover_tells_the_owner_to_stop():
    keeper = _Keeper()
    turn, cast = _turn(keeper)
    assert turn.send() is None and keeper.reply is not None
    owner = _Recorder()
    assert turn.adopt(owner) is False
    _answer_from_another_thread(keeper.reply, "late")
    assert [m.event.text for m in cast.told] == ["late"]
    assert [type(m) for m in owner.told] == [TurnReplied]


def test_a_sent_turn_no_socket_actor_can_take_over_is_called_off_and_the_dispatch_fails(runtime_factory, project,
                                                                                        monkeypatch):
    from castor.messages.errors import ActorStopped

    rt = runtime_factory()
    spawn = rt.system.spawn

    def refusing(spec, *, under="/root", timeout=10.0):
        if under.endswith("/socket"):  # the session's socket supervisor is going away
            raise ActorStopped(f"{under} is stopping", may_have_started=False)
        return spawn(spec, under=under, timeout=timeout)

    monkeypatch.setattr(rt.system, "spawn", refusing)
    agent, cast_id = _start(rt, project, ["held"])
    view = wait_status(rt, "s1", cast_id)
    assert view["status"] == "failed" and "cannot start the socket actor" in (view["failed_reason"] or "")
    assert agent.cancelled == [agent.requests[0].turn_id]  # sent, but nobody could own it: called off


def _metric(rt: Any, name: str) -> float:
    """One unlabelled sample of ``/metrics`` as the console serves it."""
    from castor.console.metrics import metrics_text

    for line in metrics_text(rt).decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not served")


def test_a_visit_counts_once_however_often_its_socket_actor_or_its_cast_restarts(runtime_factory, project):
    """``castor_socket_visits_total`` counted SocketActor starts: a visit whose cast was killed and
    restarted (its turn sent again by a new SocketActor), and whose SocketActor was then killed (sent
    again by a third), counted three visits. The engine counts one (its ``visits``), and so does the
    metric now; each send after the first is a restart of the visit."""
    from castor.supervision import faults

    rt = runtime_factory()
    agent, cast_id = _start(rt, project, ["held", "held", "held"])
    assert agent.sent.wait(10)
    faults.kill(rt.system.find(f"/root/session/s1/cast/{cast_id}"))
    wait_for(lambda: len(agent.requests) == 2, what="the turn sent again by the restarted cast")
    visit = wait_for(lambda: next((h for h in _socket_handles(rt, "s1") if h.alive
                                   and h.path.endswith(agent.requests[1].turn_id.rsplit(":", 1)[-1])), None),
                     what="the second SocketActor")
    faults.kill(visit)
    wait_for(lambda: len(agent.requests) == 3, what="the turn sent again after its SocketActor died")
    assert materia_call(rt, "s1", "status", {"cast_id": cast_id})["visits"] == {"Socket-1": 1}
    counters, _ = rt.system.registry.meters.collect()
    assert counters.get(("starts", "SocketActor"), 0) == 3  # three SocketActors ...
    assert _metric(rt, "castor_socket_visits_total") == 1  # ... of one visit
    assert _metric(rt, "castor_socket_visit_restarts_total") == 2
