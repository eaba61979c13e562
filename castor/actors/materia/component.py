"""The materia session component: what every harness session gets (the contract is castor.ports.session_component).

Children of ``/root/session/<sid>`` (started in this order, stopped in reverse)::

    cast      supervisor (one_for_one, 100 restarts / 10 s): one TRANSIENT CastActor per cast
    socket    supervisor (one_for_one): one TEMPORARY SocketActor per agent-socket visit
    materia   SessionActor (PERMANENT)

Harness events:

| event | reaction |
|---|---|
| ``before_agent_start`` (``message_type`` ``user``) | a cast paused for refinement gets ``RefinementTurnStarted`` (the user's own message drives the turn); the result carries ``system_prompt_append`` (the materia's instructions, cast context and refinement guidance) and ``turn_settings`` (the materia's ``model`` / ``thinking`` / ``tools``, encoded as in ``agent.run_turn``) for that turn; ``{}`` when no cast is paused |
| ``before_agent_start`` (``custom``) | nothing: castor's own hidden prompts are not refinement messages |
| ``context`` (a user run: ``turn_id`` null) | while a user-driven refinement turn is pending, ``messages`` = the transcript cut to the isolated context (everything before the socket's prompt becomes one synthetic message); otherwise nothing |
| ``before_agent_start`` (``user``) while a user-driven turn is still pending | the earlier turn's end was never reported (a new run means it is over): it is withdrawn (``superseded``) and this message starts the turn again |
| ``agent_end`` (a user run: ``turn_id`` null) | the last assistant message (text, error, stop reason) answers the pending user-driven refinement turn; stop reason ``aborted`` withdraws it instead; with none pending, the last withdrawn turn's id is quoted (``outcome_ignored``); castor's own turns (``turn_id`` set) are answered by ``agent.turn_ended``, never here |
| ``agent_settled`` (a user run) | a user-driven turn still pending lost its ``agent_end``: withdrawn, reason ``settled_without_end`` (``aborted: true``: ``aborted``); after a normal end nothing is pending and nothing changes |
| ``session_shutdown`` | every pending user-driven turn is withdrawn (``session_shutdown``) |
| ``session_start`` | the cast an id-less status would show, still going and run by no other session (a Pi restarted or resumed with a cast in flight): ``notify`` "pi-materia cast <id> restored in <phase>. Use /materia status for details." and a footer ``status``; nothing is resumed |

A failure here is logged and the event answered with nothing: harness events are ambient.

On close (``session.close``, the connection closing, runtime shutdown) a pending user-driven turn is
withdrawn first (``session_closed``: nobody can report it any more); nothing else needs persisting
(every transition already is). Then the session supervisor stops the SessionActor, the SocketActors
(their turns are cancelled), then the casts — which stay *active* on disk (paused, or awaiting
castor's own turn) and are resumed by ``recast`` (the lease is released).
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

from typing import Any

from castor import tree
from castor._log import logger
from castor.actors.materia.api import session_actor
from castor.actors.materia.messages import (
    BeginRefinement,
    IsolateContext,
    SessionEnding,
    SessionStarting,
    UserAgentEnded,
    UserRunSettled,
)
from castor.actors.materia.session_actor import SessionActor
from castor.domain.materia.budget import answering_model, stopped_run_usage, text_or_none
from castor.messages.errors import CastorError
from castor.ports.cast_storage import CastStorage
from castor.ports.session_component import SessionComponent, SessionContext
from castor.supervision import ChildSpec

EVENT_TIMEOUT_S = 5.0


def run_answer(data: dict[str, Any]) -> dict[str, Any]:
    """text, error and stop_reason of the newest assistant message (Pi's ``summarizeMessage`` shape),
    with the run's usage (every assistant message's ``usage`` map, summed as each is read by
    :func:`~castor.domain.materia.budget.extract_usage`; a stopped newest message that reported
    nothing is unknown, :func:`~castor.domain.materia.budget.stopped_run_usage`) and the newest
    one's model fields."""
    messages = data.get("messages")
    answers = [m for m in (messages if isinstance(messages, list) else [])
               if isinstance(m, dict) and m.get("role") == "assistant"]
    if not answers:
        return {"text": None, "error": None, "stop_reason": None}
    last = answers[-1]
    error = last.get("error")
    stop = last.get("stop_reason")
    model, provider, api = answering_model(last)
    return {"text": last.get("text") if isinstance(last.get("text"), str) else None,
            "error": str(error) if error else None, "stop_reason": stop if isinstance(stop, str) else None,
            "usage": stopped_run_usage(answers), "model": model, "provider": provider, "api": api,
            "thinking_level": text_or_none(last.get("thinking_level"))}


def _castor_turn_id(data: dict[str, Any]) -> str | None:
    """The castor turn a harness run belongs to (``turn_id``); ``None`` for the user's own run."""
    turn_id = data.get("turn_id")
    return turn_id if isinstance(turn_id, str) and turn_id else None


def _on_event(ctx: SessionContext, event: str, data: dict[str, Any]) -> dict[str, Any] | None:
    if event not in ("before_agent_start", "agent_end", "agent_settled", "session_start", "session_shutdown",
                     "context"):
        return None
    try:
        actor = session_actor(ctx.runtime, ctx.info.session_id)
        if event == "context":
            if data.get("turn_id") is not None or not isinstance(data.get("messages"), list):
                return None  # castor's own turns are isolated by the harness from their hidden prompt on
            cut = actor.ask(IsolateContext(messages=data["messages"]), timeout=EVENT_TIMEOUT_S)
            return {"messages": cut["messages"]} if "messages" in cut else None
        if event == "before_agent_start":
            if data.get("message_type") == "custom":
                return None  # castor's own hidden prompts are not user refinement messages
            refined = actor.ask(BeginRefinement(), timeout=EVENT_TIMEOUT_S)
            answer = {key: refined[key] for key in ("system_prompt_append", "turn_settings") if refined.get(key)}
            return answer or None
        if event == "agent_settled":
            actor.ask(UserRunSettled(aborted=data.get("aborted") is True, turn_id=_castor_turn_id(data)),
                      timeout=EVENT_TIMEOUT_S)
            return None
        if event == "session_start":
            restored: dict[str, Any] = actor.ask(SessionStarting(), timeout=EVENT_TIMEOUT_S)
            return {key: restored[key] for key in ("notify", "status") if restored.get(key)} or None
        if event == "session_shutdown":
            actor.ask(SessionEnding(reason="session_shutdown"), timeout=EVENT_TIMEOUT_S)
            return None
        entry_id = data.get("entry_id") if isinstance(data.get("entry_id"), str) else None
        actor.ask(UserAgentEnded(**run_answer(data), entry_id=entry_id, turn_id=_castor_turn_id(data)),
                  timeout=EVENT_TIMEOUT_S)
    except CastorError as exc:
        logger.bind(actor=ctx.path).warning("materia {event} handling failed: {exc}", event=event, exc=exc)
    return None


def _on_close(ctx: SessionContext) -> None:
    """Before the session's actors stop: withdraw a pending user-driven turn (nobody can report it
    now), so the cast is saved paused. Best effort: a failure leaves the turn pending on disk, and
    the recast that resumes the cast withdraws it then (reason ``restart``)."""
    try:
        actor = session_actor(ctx.runtime, ctx.info.session_id)
        actor.ask(SessionEnding(reason="session_closed"), timeout=EVENT_TIMEOUT_S)
    except CastorError as exc:
        logger.bind(actor=ctx.path).warning("materia close handling failed: {exc}", exc=exc)


def materia_component(storage: CastStorage) -> SessionComponent:
    """The materia session component (see the module docstring) over ``storage``, the casts' files
    (:func:`castor.composition.materia_component` gives it the file-system one)."""

    def children(ctx: SessionContext) -> list[ChildSpec]:
        return [
            tree.CASTS.supervisor_spec(),
            tree.SOCKETS.supervisor_spec(),
            tree.MATERIA.child_spec(lambda: SessionActor(ctx, storage)),
        ]

    return SessionComponent(name="materia", children=children, on_event=_on_event, on_close=_on_close)


on_materia_event = _on_event
"""The materia component's harness-event listener, shared by the Ray backend's component."""
on_materia_close = _on_close
"""The materia component's close hook, shared by the Ray backend's component."""
