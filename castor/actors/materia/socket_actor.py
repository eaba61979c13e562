"""SocketActor: one agent-socket visit (one ``RunAgentTurn``), TEMPORARY.

Path ``/root/session/<sid>/socket/<castId>.<dispatchSeq>``. Lifecycle::

    on_start: agent.run_turn(TurnRequest(turn_id=visit_id, ...), reply=tell-myself)
    TurnReplied(outcome) -> cast.tell(CastOutcome(TurnEnded(visit_id, ...))); stop

| exit | what the cast hears |
|---|---|
| outcome delivered, stop | the ``TurnEnded`` |
| stopped by the cast / session (abort, shutdown) | nothing; the agent turn is cancelled |
| crashed or killed (fault injection) before answering | ``WorkLost(visit_id)``; the turn is cancelled; the cast re-dispatches under a new visit id |

Guarantees: the outcome is handed on at most once; an answer that arrives after this actor
died is dropped by the closed mailbox (and would be ignored by the engine anyway: its
visit id is no longer pending). The AgentPort's reply never runs on this actor's stack.
"""

from __future__ import annotations

from typing import Any

from castor.actors.materia.messages import CastOutcome, TurnReplied, WorkLost
from castor.actors.ports.agent import AgentPort, TurnOutcome, TurnRequest
from castor.domain.materia.cast_messages import RunAgentTurn, TurnEnded
from castor.messages.errors import CastorError
from castor.supervision import Actor, ChildSpec, Restart, handles

_THINKING = {"off", "minimal", "low", "medium", "high", "xhigh"}


def turn_request(effect: RunAgentTurn, cast_id: str) -> TurnRequest:
    return TurnRequest(turn_id=effect.visit_id, cast_id=cast_id, socket_id=effect.socket_id, visit=effect.visit,
                       prompt=effect.prompt, summary=effect.visible_summary, model=effect.model,
                       thinking=effect.thinking if effect.thinking in _THINKING else None, tools=effect.tools)


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


def turn_ended(visit_id: str, outcome: TurnOutcome, at: float) -> TurnEnded:
    error = outcome.error.message if outcome.error is not None else None
    return TurnEnded(visit_id=visit_id, text=outcome.text, stop_reason=outcome.stop_reason, error=error,
                     usage=usage_map(outcome), model=outcome.model, entry_id=outcome.entry_id, at=at)


class SocketActor(Actor):
    def __init__(self, effect: RunAgentTurn, *, cast: Any, cast_id: str, agent: AgentPort) -> None:
        super().__init__()
        self.effect = effect
        self.cast = cast
        self.cast_id = cast_id
        self.agent = agent
        self._delivered = False

    def on_start(self) -> None:
        handle = self.handle

        def reply(outcome: TurnOutcome) -> None:
            try:
                handle.tell(TurnReplied(outcome=outcome))
            except CastorError:
                pass  # this visit is over (stopped, killed): the answer has nowhere to go

        self.agent.run_turn(turn_request(self.effect, self.cast_id), reply)

    @handles(TurnReplied)
    def _on_reply(self, message: TurnReplied) -> None:
        import time

        if self._delivered:
            return
        self._delivered = True
        self.cast.tell(CastOutcome(event=turn_ended(self.effect.visit_id, message.outcome, time.time())))
        self.stop_self()

    def on_terminate(self, cause: str) -> None:
        if self._delivered:
            return
        try:
            self.agent.cancel(self.effect.visit_id)
        except Exception:  # noqa: BLE001 - best effort; the engine ignores late answers anyway
            pass
        if cause != "stopped":
            try:
                self.cast.tell(WorkLost(visit_id=self.effect.visit_id, reason=f"socket actor {cause}"))
            except CastorError:
                pass  # the cast is gone too; its restart re-dispatches from the saved state


def socket_spec(effect: RunAgentTurn, *, cast: Any, cast_id: str, agent: AgentPort) -> ChildSpec:
    seq = effect.visit_id.rsplit(":", 1)[-1]
    return ChildSpec(id=f"{cast_id}.{seq}", factory=lambda: SocketActor(effect, cast=cast, cast_id=cast_id, agent=agent),
                     restart=Restart.TEMPORARY, shutdown_timeout=2.0, direct_start=True)
