"""Process-local messages of the materia actors (they carry handles and engine objects).

| message | to | kind | meaning |
|---|---|---|---|
| ``CastApply(event)`` | CastActor | ask | apply a command event (continue/abort/recast/revive/refinement); answers the status |
| ``CastOutcome(event)`` | CastActor | tell | the outcome of work the cast asked for (quotes a ``visit_id``) |
| ``CastProgress(event)`` | CastActor | tell | a progress note about pending work (proactive compaction around a turn); applied like an outcome, but the work is still pending |
| ``WorkLost(visit_id, reason)`` | CastActor | tell | the actor doing that work died before answering |
| ``CastStatusQuery()`` | CastActor | ask | the current status dict |
| ``UserTurnContextQuery()`` | CastActor | ask | the isolated-context text of a pending user-driven refinement turn, else ``None`` |
| ``UserRunEnded(text, error, entry_id, stop_reason, late)`` | CastActor | ask | the harness's user run ended (``agent_end``): answers the pending user-driven turn (``late``: the last *withdrawn* one, which the engine reports as ``outcome_ignored``); the visit id it quoted, else ``None`` |
| ``WithdrawUserTurn(reason)`` | CastActor | ask | the pending user-driven turn will never be reported: apply ``RefinementTurnAbandoned``; the withdrawn visit id, else ``None`` |
| ``UserTurnExpired(visit_id)`` | CastActor | tell | the opt-in bound on a user-driven turn (``RuntimeSettings.user_turn_timeout_s``) passed |
| ``TurnReplied(outcome)`` | SocketActor | tell | the AgentPort answered |
| ``UsageRead(usage, error)`` | SocketActor | tell | the host's context usage before the turn (None: unknown) |
| ``ProactiveCompacted(outcome)`` | SocketActor | tell | the proactive compaction before the turn ended |
| ``UtilityJob(effect, cast)`` | UtilityExecutorActor | tell | run one ``RunUtility`` and tell ``cast`` the outcome |
| ``SessionCall(verb, params)`` | SessionActor | ask | one ``/materia`` verb (see session_actor.py) |
"""

from __future__ import annotations

from typing import Any

from castor.domain.materia.cast_messages import AbandonReason
from castor.messages.base import LocalMessage


class CastApply(LocalMessage, type_name="materia.cast.apply"):
    event: Any


class CastOutcome(LocalMessage, type_name="materia.cast.outcome"):
    event: Any


class CastProgress(LocalMessage, type_name="materia.cast.progress"):
    event: Any


class WorkLost(LocalMessage, type_name="materia.cast.work_lost"):
    visit_id: str
    reason: str


class CastStatusQuery(LocalMessage, type_name="materia.cast.status"):
    pass


class UserTurnContextQuery(LocalMessage, type_name="materia.cast.user_turn_context"):
    pass


class UserRunEnded(LocalMessage, type_name="materia.cast.user_run_ended"):
    text: str | None = None
    error: str | None = None
    entry_id: str | None = None
    stop_reason: str | None = None
    late: bool = False


class WithdrawUserTurn(LocalMessage, type_name="materia.cast.withdraw_user_turn"):
    reason: AbandonReason


class UserTurnExpired(LocalMessage, type_name="materia.cast.user_turn_expired"):
    visit_id: str


class TurnReplied(LocalMessage, type_name="materia.socket.turn_replied"):
    outcome: Any


class UsageRead(LocalMessage, type_name="materia.socket.usage_read"):
    usage: Any = None  # ContextUsage | None
    error: str | None = None


class ProactiveCompacted(LocalMessage, type_name="materia.socket.proactive_compacted"):
    outcome: Any  # CompactionOutcome


class UtilityJob(LocalMessage, type_name="materia.utility.job"):
    effect: Any  # RunUtility
    cast: Any  # ActorHandle of the CastActor
    run_dir: str | None = None  # where the running command is recorded (command_records)


class SessionCall(LocalMessage, type_name="materia.session.call"):
    verb: str
    params: dict[str, Any] = {}
