"""SocketActor: one agent-socket visit (one ``RunAgentTurn``), TEMPORARY.

Who sends the turn: a visit without a proactive compaction check has its turn sent by its cast
(:class:`VisitTurn`, on the cast's thread). Answered before ``run_turn`` returns (a zero-latency
agent), its outcome is handed on there and the visit never becomes an actor: there is nothing left
of it to show in a snapshot, stop or contain (the visit is counted all the same: the cast counts
visits, :data:`SOCKET_VISITS`, not SocketActor starts). Not answered yet, it is taken over at once by a SocketActor
(``socket_spec(..., turn=...)``) that shows it (``awaiting_turn``), cancels it when stopped and
reports ``WorkLost`` when it dies, as below; an error raised by the send becomes that actor's crash
in its ``on_start``, so ``WorkLost`` too. An answer between the send and the takeover is handed on
by its own thread and the actor, seeing it answered, stops at once.

Path ``/root/session/<sid>/socket/<castId>.<dispatchSeq>``. ``on_start`` runs on the thread of
the CastActor that starts the visit, inside ``spawn`` (``start_on_caller``: it never blocks);
the rest of the visit, if there is any, on a loop thread of its own. Lifecycle::

    on_start: proactive check wanted?  (effect.proactive_compaction and host.has_context)
        no  -> send the turn
        yes -> read host.context_usage() on a helper thread -> UsageRead
    UsageRead -> decide_proactive(usage, config=effect.compaction)
        None -> send the turn
        a decision -> cast.tell(CastProgress(ProactiveCompactionStarted)); host compaction under
                      a deadline (CompactionCall) -> ProactiveCompacted
    ProactiveCompacted -> cast.tell(CastProgress(ProactiveCompactionFinished(ok | error))); send the turn
                          cancelled (the user's Esc) -> cast.tell(CastOutcome(ProactiveCompactionFinished(
                          cancelled))); stop, the turn never sent
    send the turn: agent.run_turn(TurnRequest(turn_id=visit_id, ...), reply=tell-myself)
    reply(outcome) -> cast.tell(CastOutcome(TurnEnded(visit_id, ...))) on the answering thread; stop

Proactive compaction never stops the turn, except the user's: an unknown usage (None, a harness
without ``session.context_usage``, a failed read) skips it with no events; a failed or timed-out
compaction is reported (the engine emits ``proactive_compaction_failed{warning}`` and warns) and
the turn is sent anyway; a compaction the user cancelled (an Esc in the harness) is the visit's
outcome: the turn is not sent and the cast is interrupted at its socket. The usage read and the compaction never run on this actor's thread, so
a stop (abort, shutdown) is never held up by a harness round trip. The usage snapshot is taken
before the turn's prompt is sent, so it excludes that prompt (the spec's known gap); the active
model's window is the one the harness reports in its usage (Pi's ``getContextUsage``).

| exit | what the cast hears |
|---|---|
| outcome delivered, stop | the ``TurnEnded`` (or, for a proactive compaction the user cancelled, that ``ProactiveCompactionFinished``) |
| stopped by the cast / session (abort, shutdown) | nothing; the agent turn is cancelled, a proactive compaction is no longer waited for (the turn is then never sent) |
| crashed or killed (fault injection) before answering | ``WorkLost(visit_id)``; the turn is cancelled; the cast re-dispatches under a new visit id |

Guarantees: the outcome is handed on at most once; an answer that arrives after this actor
died is dropped by the closed mailbox (and would be ignored by the engine anyway: its
visit id is no longer pending). The AgentPort's reply is marked ``enqueues_only``: an answer
from another thread is told to the cast from that thread before the reply returns (so whatever
the answering harness sends next reaches the cast after the turn's end), then this actor is
told to stop (``TurnReplied``); one a port gives at once, on the
thread running ``run_turn``, is only kept and handed on after ``run_turn`` has returned (so
nothing runs re-entrantly, and no message is queued to itself). The visit then ends inside
``spawn``: the cast finds its ``CastOutcome`` queued once the handler that started it returns.
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import threading
import time
from typing import Any, get_args

from castor import tree
from castor.actors.materia import activity as _activity
from castor.actors.materia.compaction_call import CompactionCall
from castor.actors.materia.messages import (
    CastOutcome,
    CastProgress,
    ProactiveCompacted,
    TurnReplied,
    UsageRead,
    WorkLost,
)
from castor.domain.materia.cast_messages import (
    ProactiveCompactionFinished,
    ProactiveCompactionStarted,
    RunAgentTurn,
    TurnEnded,
)
from castor.domain.materia.compaction import PROACTIVE_COMPACTION_INSTRUCTIONS, ProactiveDecision, decide_proactive
from castor.messages.built import built
from castor.messages.errors import CastorError
from castor.ports.agent import AgentPort, ThinkingLevel, TurnOutcome, TurnRequest, enqueues_only
from castor.ports.host_context import CompactionOutcome, CompactionRequest, HostContextPort
from castor.supervision import Actor, ChildSpec, handles
from castor.supervision.threads import start_thread

#: The meter of agent socket visits, each counted once when its cast enters the socket
#: (``castor_socket_visits_total``): a turn sent again -- a retry, a rerun, a recast after its cast or
#: castor restarted, each a new SocketActor -- is no new visit, but :data:`SOCKET_VISIT_RESTARTS`.
SOCKET_VISITS = "socket_visits"
#: The meter of a visit's turn sent again (``castor_socket_visit_restarts_total``).
SOCKET_VISIT_RESTARTS = "socket_visit_restarts"
#: Deadline of the pre-turn usage read (a harness that does not answer delays the turn this long).
USAGE_TIMEOUT_S = 5.0
#: Deadline of a host compaction (Pi's compaction asks the model for a summary).
COMPACTION_TIMEOUT_S = 300.0

_THINKING: dict[str, ThinkingLevel] = {level: level for level in get_args(ThinkingLevel)}


def turn_request(effect: RunAgentTurn, cast_id: str) -> TurnRequest:
    """The agent port's request for ``effect``'s turn: the instance validation would give.

    Every value is castor's own (the engine's effect, built from the validated config; a thinking
    level outside ``ThinkingLevel`` is already None), of the field types ``TurnRequest`` declares,
    so it is :func:`built` without validation -- unless one of the request's own constraints (a
    non-empty id, a visit >= 0) does not hold, which validation then reports as it always did.
    """
    values: dict[str, Any] = {"turn_id": effect.visit_id, "cast_id": cast_id, "socket_id": effect.socket_id,
                              "visit": effect.visit,
                              "prompt": effect.prompt, "summary": effect.visible_summary, "model": effect.model,
                              "thinking": _THINKING.get(effect.thinking or ""), "tools": effect.tools,
                              "item_key": effect.item_key, "mode": effect.mode, "materia": effect.materia,
                              "item_label": effect.item_label, "materia_model": effect.materia_model}
    if effect.visit_id and cast_id and effect.socket_id and effect.visit >= 0:
        return built(TurnRequest, **values)
    return TurnRequest(**values)


def usage_map(outcome: TurnOutcome) -> dict[str, Any] | None:
    """The turn's usage in the alias vocabulary the engine's usage extraction reads."""
    usage = outcome.usage
    if usage is None:
        return None
    if usage.raw:
        return dict(usage.raw)
    fields = {"input": usage.input_tokens, "output": usage.output_tokens, "cacheRead": usage.cache_read_tokens,
              "cacheWrite": usage.cache_write_tokens, "totalTokens": usage.total_tokens}
    out: dict[str, Any] = {k: v for k, v in fields.items() if v is not None}
    if usage.cost_usd is not None:
        out["cost"] = {"total": usage.cost_usd}
    return out


def agent_label(agent: Any) -> str | None:
    """What failure texts call ``agent`` (its ``agent_label``: "Pi agent", "scripted agent (...)")."""
    label = getattr(agent, "agent_label", None)
    return label if isinstance(label, str) and label.strip() else None


def turn_ended(visit_id: str, outcome: TurnOutcome, at: float, *, agent: str | None = None) -> TurnEnded:
    error = outcome.error.message if outcome.error is not None else None
    return TurnEnded(visit_id=visit_id, text=outcome.text, stop_reason=outcome.stop_reason, error=error,
                     usage=usage_map(outcome), model=outcome.model, provider=outcome.provider, api=outcome.api,
                     thinking_level=outcome.thinking_level, entry_id=outcome.entry_id, agent=agent, at=at)


class VisitTurn:
    """One agent-socket visit's turn: sent once, its outcome handed to the cast at most once.

    Shared by whoever sends the turn and the :class:`SocketActor` that owns the visit. The cast
    sends a turn itself when no proactive compaction has to come first (:meth:`send`): a turn
    answered at once (on the sending thread, inside ``run_turn``: a zero-latency agent) is handed
    on right there and the visit needs no actor; one still unanswered when ``run_turn`` returns
    is taken over by a SocketActor (``socket_spec(..., turn=...)``) at once, which shows the visit
    in snapshots, cancels the turn if it is stopped and reports ``WorkLost`` if it dies.
    """

    __slots__ = ("effect", "cast", "cast_id", "agent", "once", "_lock", "_owner", "_answered")

    def __init__(self, effect: RunAgentTurn, *, cast: Any, cast_id: str, agent: AgentPort) -> None:
        self.effect = effect
        self.cast = cast
        self.cast_id = cast_id
        self.agent = agent
        #: Held by whoever ends the visit first: the outcome handed on (:meth:`end`), or the owning
        #: actor's end (which then cancels the turn, and drops a later answer).
        self.once = threading.Lock()
        self._lock = threading.Lock()  # orders an answer from another thread against adopt
        self._owner: Any = None  # the handle of the SocketActor that owns the visit, once there is one
        self._answered = False

    def send(self) -> TurnOutcome | None:
        """Send the turn through the agent port; the outcome if the port gave it at once (on this
        thread, while ``run_turn`` ran: handed on by the caller, once ``run_turn`` has returned),
        else None (an answer from another thread is handed on by that thread, see ``reply``)."""
        me = threading.get_ident()
        ready: list[TurnOutcome] = []  # an answer given on this thread while run_turn is running
        sending = True

        @enqueues_only  # an answer ready at once may be given on this very thread
        def reply(outcome: TurnOutcome) -> None:
            if sending and threading.get_ident() == me:
                ready.append(outcome)  # handed on once run_turn has returned: nothing re-entrant
                return
            # Handed to the cast from the answering thread, before the answer's call returns: a
            # command the harness sends once its turn end is answered (an Esc's ``cast.continue``)
            # queues behind the outcome in the cast's mailbox, so the cast has applied the turn's
            # end before it sees the command (test_socket_actor.py's continue-after-abort race).
            self.hand_on(outcome)
            with self._lock:
                self._answered = True
                owner = self._owner
            if owner is not None:
                try:
                    owner.tell(TurnReplied(outcome=outcome))  # this visit is over: its actor stops
                except CastorError:
                    pass  # that actor is over (stopped, killed): nothing left to stop

        try:
            self.agent.run_turn(turn_request(self.effect, self.cast_id), reply)
        finally:
            sending = False
        return ready[0] if ready else None

    @property
    def answered(self) -> bool:
        """Whether an answer from another thread has been handed on already."""
        with self._lock:
            return self._answered

    def adopt(self, owner: Any) -> bool:
        """Make the actor at ``owner`` the visit's owner (a later answer tells it to stop); True if
        the answer has been handed on already (the owner then has nothing left to wait for)."""
        with self._lock:
            self._owner = owner
            return self._answered

    def hand_on(self, outcome: TurnOutcome) -> None:
        """Tell the cast the turn's end, from whichever thread has it."""
        self.end(turn_ended(self.effect.visit_id, outcome, time.time(), agent=agent_label(self.agent)))

    def end(self, event: TurnEnded | ProactiveCompactionFinished) -> None:
        """Tell the cast the visit's outcome, at most once per visit; nothing once the owning
        actor's end has claimed the visit (:meth:`SocketActor.on_terminate`)."""
        if not self.once.acquire(blocking=False):
            return
        try:
            self.cast.tell(CastOutcome(event=event))
        except CastorError:
            pass  # the cast is gone; its restart re-dispatches from the saved state


class SocketActor(Actor):
    # on_start only sends the turn (AgentPort.run_turn returns at once), so it runs on the cast's
    # thread: a turn answered at once ends the visit there, with no thread hand-off.
    start_on_caller = True

    def __init__(self, effect: RunAgentTurn, *, cast: Any, cast_id: str, agent: AgentPort,
                 host: HostContextPort | None = None, usage_timeout_s: float = USAGE_TIMEOUT_S,
                 compaction_timeout_s: float = COMPACTION_TIMEOUT_S, turn: VisitTurn | None = None,
                 raise_on_start: BaseException | None = None) -> None:
        super().__init__()
        self.effect = effect
        self.cast = cast
        self.cast_id = cast_id
        self.agent = agent
        self.host = host
        self.usage_timeout_s = usage_timeout_s
        self.compaction_timeout_s = compaction_timeout_s
        #: The visit's turn: its ``once`` lock is held by whoever ends the visit first (the answer
        #: handed on, or this actor's end, which then cancels the turn and drops a later answer).
        #: Given when the cast has sent the turn already and this actor takes it over (``adopt``).
        self.turn = turn if turn is not None else VisitTurn(effect, cast=cast, cast_id=cast_id, agent=agent)
        self._sent = turn is not None
        self._raise_on_start = raise_on_start
        self._decision: ProactiveDecision | None = None
        self._compaction: CompactionCall | None = None

    def on_start(self) -> None:
        if self._sent:  # adopted: the cast sent the turn; this actor owns what is left of the visit
            if self._raise_on_start is not None:
                raise self._raise_on_start  # sending it failed: a crash of this visit, contained here
            self.report_activity(*_activity.awaiting_turn(self.effect, self.cast_id), lasting=True)
            if self.turn.adopt(self.handle):
                self.stop_self()  # answered (and handed on) before this actor existed
        elif self._wants_proactive_check():
            self._read_usage()
        else:
            self._send_turn()

    # ------------------------------------------------------------------ proactive compaction
    def _wants_proactive_check(self) -> bool:
        return wants_proactive_check(self.effect, self.host)

    def _read_usage(self) -> None:
        """Ask the host for its usage on a helper thread; the answer comes back as ``UsageRead``."""
        self.report_activity("reading_usage", f"reading the host's context usage before {self.effect.socket_id}",
                             deadline=time.monotonic() + self.usage_timeout_s)
        handle, host, timeout = self.handle, self.host, self.usage_timeout_s
        assert host is not None

        def read() -> None:
            try:
                message = UsageRead(usage=host.context_usage(timeout))
            except Exception as exc:  # noqa: BLE001 - an unknown usage only skips the check
                message = UsageRead(error=getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}")
            try:
                handle.tell(message)
            except CastorError:
                pass  # the visit is over (stopped): nothing to do

        start_thread(read, name=f"context-usage-{self.effect.visit_id}", owner=self.path,
                     purpose="reads the context usage after the turn")

    @handles(UsageRead)
    def _on_usage(self, message: UsageRead) -> None:
        if message.error is not None:
            self.log.warning("host context usage unknown ({error}); no proactive compaction", error=message.error)
        usage = message.usage.usage_map() if message.usage is not None else None
        decision = decide_proactive(usage, model_context_window=None, config=self.effect.compaction)
        if decision is None:
            self._send_turn()
            return
        self._decision = decision
        self.report_activity(*_activity.compacting(self.effect, self.cast_id, decision.percent), lasting=True,
                             deadline=time.monotonic() + self.compaction_timeout_s)
        self._progress(ProactiveCompactionStarted(visit_id=self.effect.visit_id, decision=decision, at=time.time()))
        handle = self.handle

        def deliver(outcome: CompactionOutcome) -> None:
            handle.tell(ProactiveCompacted(outcome=outcome))

        assert self.host is not None
        request = CompactionRequest(cast_id=self.cast_id, instructions=PROACTIVE_COMPACTION_INSTRUCTIONS,
                                    reason="context_pressure")
        self._compaction = CompactionCall(self.host, request, timeout_s=self.compaction_timeout_s,
                                          deliver=deliver).start()

    @handles(ProactiveCompacted)
    def _on_compacted(self, message: ProactiveCompacted) -> None:
        self._compaction = None
        outcome: CompactionOutcome = message.outcome
        assert self._decision is not None
        finished = ProactiveCompactionFinished(visit_id=self.effect.visit_id, decision=self._decision,
                                               ok=outcome.ok, result=outcome.result, error=outcome.error,
                                               cancelled=outcome.cancelled and not outcome.ok, at=time.time())
        if finished.cancelled:
            # The user's Esc stopped the compaction: the turn is not sent. This is the visit's
            # outcome (the cast is interrupted at the socket), handed on once, and the visit ends.
            self._end_visit(finished)
            self.stop_self()
            return
        self._progress(finished)
        self._send_turn()  # the turn is sent either way

    def _progress(self, event: Any) -> None:
        try:
            self.cast.tell(CastProgress(event=event))
        except CastorError:
            pass  # the cast is gone; its restart re-dispatches from the saved state

    # ------------------------------------------------------------------ the turn
    def _send_turn(self) -> None:
        if self._sent:
            return
        self._sent = True
        self.turn.adopt(self.handle)  # sent by this actor: a later answer tells it to stop
        self.report_activity(*_activity.awaiting_turn(self.effect, self.cast_id), lasting=True)
        ready = self.turn.send()
        if ready is not None:
            self._deliver(ready)

    @handles(TurnReplied)
    def _on_reply(self, message: TurnReplied) -> None:
        self._deliver(message.outcome)

    def _deliver(self, outcome: TurnOutcome) -> None:
        self.turn.hand_on(outcome)
        self.stop_self()

    def _end_visit(self, event: TurnEnded | ProactiveCompactionFinished) -> None:
        """Tell the cast the visit's outcome, at most once per visit (see :meth:`VisitTurn.end`)."""
        self.turn.end(event)

    def on_terminate(self, cause: str) -> None:
        if self._compaction is not None:
            self._compaction.cancel()  # its late answer is dropped; the host may still compact
            self._compaction = None
        if not self.turn.once.acquire(blocking=False):
            return  # the outcome was handed on
        try:
            self.agent.cancel(self.effect.visit_id)
        except Exception:  # noqa: BLE001 - best effort; the engine ignores late answers anyway
            pass
        if cause != "stopped":
            try:
                self.cast.tell(WorkLost(visit_id=self.effect.visit_id, reason=f"socket actor {cause}"))
            except CastorError:
                pass  # the cast is gone too; its restart re-dispatches from the saved state


def socket_spec(effect: RunAgentTurn, *, cast: Any, cast_id: str, agent: AgentPort,
                host: HostContextPort | None = None, usage_timeout_s: float = USAGE_TIMEOUT_S,
                compaction_timeout_s: float = COMPACTION_TIMEOUT_S, turn: VisitTurn | None = None,
                raise_on_start: BaseException | None = None) -> ChildSpec:
    """The visit's SocketActor; with ``turn``, one that takes over a turn the cast has sent
    already (``raise_on_start``: the error sending it raised, which this actor then crashes with)."""
    seq = effect.visit_id.rsplit(":", 1)[-1]
    return tree.SOCKET.child_spec(lambda: SocketActor(effect, cast=cast, cast_id=cast_id, agent=agent, host=host,
                                                      usage_timeout_s=usage_timeout_s,
                                                      compaction_timeout_s=compaction_timeout_s, turn=turn,
                                                      raise_on_start=raise_on_start),
                                  id=f"{cast_id}.{seq}", direct_start=True)


def wants_proactive_check(effect: RunAgentTurn, host: HostContextPort | None) -> bool:
    """Whether the visit reads the host's usage before its turn (a proactive compaction may come
    first): such a visit is a SocketActor from its start."""
    return effect.proactive_compaction and not effect.user_driven and host is not None and bool(host.has_context)
