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
| ``AbortRequestFound(refused)`` | CastActor | tell | ``castor abort ID`` asked this runtime to abort the cast (its request in the run directory, judged on the storage's watcher thread); ``refused``: what was found there instead and not applied, to tell the harness |
| ``TurnReplied(outcome)`` | SocketActor | tell | the AgentPort answered |
| ``UsageRead(usage, error)`` | SocketActor | tell | the host's context usage before the turn (None: unknown) |
| ``ProactiveCompacted(outcome)`` | SocketActor | tell | the proactive compaction before the turn ended |
| ``UtilityJob(effect, cast)`` | UtilityExecutorActor | tell | run one ``RunUtility`` and tell ``cast`` the outcome |

The SessionActor's verbs are one typed message each (all ask, all answer a dict with the
fields the verb documents in session_actor.py); :data:`SESSION_VERBS` maps each verb's name
(the CLI's and :func:`castor.actors.materia.api.materia_call`'s) to its message:

| verb | message | fields |
|---|---|---|
| ``start`` | ``StartCast`` | request, loadout?, config_path?, cli_note? |
| ``status`` | ``ShowCast`` | cast_id? |
| ``list`` | ``ListCasts`` | limit?, cursor? |
| ``abort`` | ``AbortCast`` | cast_id? |
| ``continue`` | ``ContinueCast`` | cast_id? |
| ``recast`` | ``RecastCast`` | cast_id? |
| ``revive`` | ``ReviveCast`` | cast_id? |
| ``refine`` | ``BeginRefinement`` | — |
| ``context`` | ``IsolateContext`` | messages |
| ``agent_end`` | ``UserAgentEnded`` | text?, error?, entry_id?, stop_reason?, turn_id? |
| ``settled`` | ``UserRunSettled`` | aborted, turn_id? |
| ``session_end`` | ``SessionEnding`` | reason |
| ``session_start`` | ``SessionStarting`` | — |
| ``loadouts`` | ``ListLoadouts`` | config_path? |
| ``set_loadout`` | ``SetActiveLoadout`` | name, config_path? |
| ``grid`` | ``RenderGrid`` | loadout?, config_path? |
| ``validate`` | ``ValidateConfig`` | path |
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from castor.domain.materia.cast_messages import AbandonReason, CastEvent, RunUtility
from castor.messages.base import LocalMessage
from castor.ports.agent import TurnOutcome
from castor.ports.host_context import CompactionOutcome, ContextUsage


class CastApply(LocalMessage, type_name="materia.cast.apply"):
    event: CastEvent


class CastOutcome(LocalMessage, type_name="materia.cast.outcome"):
    event: CastEvent


class CastProgress(LocalMessage, type_name="materia.cast.progress"):
    event: CastEvent


class WorkLost(LocalMessage, type_name="materia.cast.work_lost"):
    """The work of ``visit_id`` is gone. ``command_started``: it was a utility command that ran and
    was killed before it ended (its slot died under it), so the re-dispatch runs it a second time."""

    visit_id: str
    reason: str
    command_started: bool = False


class CastStatusQuery(LocalMessage, type_name="materia.cast.status"):
    pass


class PerformSavedStart(LocalMessage, type_name="materia.cast.perform_saved_start"):
    """A new cast's first transition is saved and its starter answered: its effects (the files,
    the first visit) are performed now, on the cast's loop thread, before any other message."""


class UserTurnContextQuery(LocalMessage, type_name="materia.cast.user_turn_context"):
    pass


class RunAnswer(BaseModel):
    """What a harness run's end says of its answer: the newest assistant message's text, error,
    stop reason and model fields, and the run's usage (``None``: not reported)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str | None = None
    error: str | None = None
    entry_id: str | None = None
    stop_reason: str | None = None
    usage: dict[str, Any] | None = None
    model: str | None = None
    provider: str | None = None
    api: str | None = None
    thinking_level: str | None = None


def answer_fields(answer: RunAnswer) -> dict[str, Any]:
    """``answer``'s :class:`RunAnswer` fields, to build another message from (no other field)."""
    return {name: getattr(answer, name) for name in RunAnswer.model_fields}


class UserRunEnded(RunAnswer, LocalMessage, type_name="materia.cast.user_run_ended"):
    late: bool = False


class WithdrawUserTurn(LocalMessage, type_name="materia.cast.withdraw_user_turn"):
    reason: AbandonReason


class UserTurnExpired(LocalMessage, type_name="materia.cast.user_turn_expired"):
    visit_id: str


class AbortRequestFound(LocalMessage, type_name="materia.cast.abort_request_found"):
    refused: str | None = None


class TurnReplied(LocalMessage, type_name="materia.socket.turn_replied"):
    outcome: TurnOutcome


class UsageRead(LocalMessage, type_name="materia.socket.usage_read"):
    usage: ContextUsage | None = None
    error: str | None = None


class ProactiveCompacted(LocalMessage, type_name="materia.socket.proactive_compacted"):
    outcome: CompactionOutcome


class UtilityJob(LocalMessage, type_name="materia.utility.job"):
    effect: RunUtility
    cast: Any  # the CastActor's handle (a test may hand a recording stand-in)
    run_dir: str | None = None  # where the running command is recorded (command_records)


class SessionVerb(LocalMessage, type_name="materia.session.verb"):
    """Base of the SessionActor's verb messages. ``verb`` names the verb (errors quote it, and
    :data:`SESSION_VERBS` finds the message by it); it is not a field and never travels."""

    verb: ClassVar[str] = ""

    def arguments(self) -> dict[str, Any]:
        """The fields that are set (not ``None``): what :func:`materia_call` would pass for this verb."""
        return self.model_dump(exclude_none=True)


class StartCast(SessionVerb, type_name="materia.session.start"):
    """Start a cast. ``cli_note`` (in-process callers only: the standalone CLI) is written to
    ``<runDir>/cli.json`` before the cast's first save."""

    verb: ClassVar[str] = "start"
    request: str
    loadout: str | None = None
    config_path: str | None = None
    cli_note: dict[str, Any] | None = None  # free-form JSON the CLI keeps beside the cast


class ShowCast(SessionVerb, type_name="materia.session.status"):
    verb: ClassVar[str] = "status"
    cast_id: str | None = None


class ListCasts(SessionVerb, type_name="materia.session.list"):
    verb: ClassVar[str] = "list"
    limit: int | None = None
    cursor: str | None = None


class AbortCast(SessionVerb, type_name="materia.session.abort"):
    verb: ClassVar[str] = "abort"
    cast_id: str | None = None


class ContinueCast(SessionVerb, type_name="materia.session.continue"):
    verb: ClassVar[str] = "continue"
    cast_id: str | None = None


class RecastCast(SessionVerb, type_name="materia.session.recast"):
    verb: ClassVar[str] = "recast"
    cast_id: str | None = None


class ReviveCast(SessionVerb, type_name="materia.session.revive"):
    verb: ClassVar[str] = "revive"
    cast_id: str | None = None


class BeginRefinement(SessionVerb, type_name="materia.session.refine"):
    verb: ClassVar[str] = "refine"


class IsolateContext(SessionVerb, type_name="materia.session.context"):
    verb: ClassVar[str] = "context"
    messages: list[Any]  # the harness's transcript entries as it sent them; non-dict entries are skipped


class UserAgentEnded(RunAnswer, SessionVerb, type_name="materia.session.agent_end"):
    verb: ClassVar[str] = "agent_end"
    turn_id: str | None = None


class UserRunSettled(SessionVerb, type_name="materia.session.settled"):
    verb: ClassVar[str] = "settled"
    aborted: bool = False
    turn_id: str | None = None


class SessionEnding(SessionVerb, type_name="materia.session.session_end"):
    verb: ClassVar[str] = "session_end"
    reason: AbandonReason


class SessionStarting(SessionVerb, type_name="materia.session.session_start"):
    verb: ClassVar[str] = "session_start"


class ListLoadouts(SessionVerb, type_name="materia.session.loadouts"):
    verb: ClassVar[str] = "loadouts"
    config_path: str | None = None


class SetActiveLoadout(SessionVerb, type_name="materia.session.set_loadout"):
    verb: ClassVar[str] = "set_loadout"
    name: str
    config_path: str | None = None


class RenderGrid(SessionVerb, type_name="materia.session.grid"):
    verb: ClassVar[str] = "grid"
    loadout: str | None = None
    config_path: str | None = None


class ValidateConfig(SessionVerb, type_name="materia.session.validate"):
    verb: ClassVar[str] = "validate"
    path: str


#: verb name -> its message class (every SessionActor verb, one each)
SESSION_VERBS: dict[str, type[SessionVerb]] = {cls.verb: cls for cls in (
    StartCast, ShowCast, ListCasts, AbortCast, ContinueCast, RecastCast, ReviveCast, BeginRefinement,
    IsolateContext, UserAgentEnded, UserRunSettled, SessionEnding, SessionStarting, ListLoadouts, SetActiveLoadout,
    RenderGrid, ValidateConfig)}
