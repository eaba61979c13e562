"""Inputs (:data:`CastEvent`) and outputs (:data:`Effect`) of :func:`castor.domain.materia.engine.step`.

All are frozen pydantic models with a ``kind`` discriminator, so they travel through mailboxes
and msgpack as plain maps (``model_dump(mode="json")`` / ``EVENT_ADAPTER.validate_python``).
Every event carries ``at`` (epoch seconds) — the engine never reads a clock.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from castor.domain.jsontext import well_formed
from castor.domain.materia.compaction import ProactiveDecision
from castor.domain.materia.config import Compaction, ResolvedConfig
from castor.domain.materia.surface import Surface
from castor.messages.built import built as built  # the engine builds its own effects with it


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class _Input(_Frozen):
    """An event: its text comes from outside (a model, a command, a user), so a lone surrogate
    in it is replaced here, before the engine keeps it in a state that must be written as UTF-8."""

    @model_validator(mode="before")
    @classmethod
    def _well_formed_text(cls, values: Any) -> Any:
        return well_formed(values) if isinstance(values, dict) else values


# --------------------------------------------------------------------------- events (inputs)


class CastStarted(_Input):
    kind: Literal["cast_started"] = "cast_started"
    cast_id: str
    request: str
    config: ResolvedConfig
    cwd: str = ""
    run_dir: str = ""
    artifact_root: str = ""
    data: dict[str, Any] = Field(default_factory=dict)  # seed data (e.g. linked context)
    surface: Surface = "harness"
    at: float


class TurnEnded(_Input):
    """The outcome of an agent turn the cast asked for (``RunAgentTurn.visit_id``).

    ``stop_reason`` "aborted" means the turn was interrupted (the user's Esc, a cancel): whatever
    ``text`` it carries is never taken as the socket's output; ``usage`` is still recorded.
    ``agent`` names the agent that ran the turn ("Pi agent", "scripted agent", ...) for failure texts.
    """

    kind: Literal["turn_ended"] = "turn_ended"
    visit_id: str
    text: str | None = None
    stop_reason: str | None = None
    error: str | None = None
    usage: dict[str, Any] | None = None
    entry_id: str | None = None
    model: str | None = None  # the model that answered, and its provider, api and thinking level, if known
    provider: str | None = None
    api: str | None = None
    thinking_level: str | None = None
    agent: str | None = None
    at: float


class UtilityFinished(_Input):
    """The outcome of a ``RunUtility``. The runner does NOT write artifacts; the engine does."""

    kind: Literal["utility_finished"] = "utility_finished"
    visit_id: str
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = 0
    signal: str | None = None
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    spawn_error: str | None = None  # the process never started (missing binary...)
    error: str | None = None  # a built-in utility raised (bad params...)
    at: float


class CompactionFinished(_Input):
    """The outcome of a ``Compact`` (same-socket recovery).

    ``result`` is the host's compaction result (the engine keeps only the spec's summary
    fields); ``skipped`` says why nothing was compacted although ``ok`` is true — a host with no
    accumulated context answers ``skipped="no host context"`` and the marker is recorded in the
    ``same_socket_recovery_action_complete`` event, never silently dropped. ``cancelled``: the user
    stopped the compaction (an Esc in the harness) -- the cast is interrupted, as by an Esc during
    the turn, not failed.
    """

    kind: Literal["compaction_finished"] = "compaction_finished"
    visit_id: str
    ok: bool
    result: dict[str, Any] | None = None
    error: str | None = None
    skipped: str | None = None
    cancelled: bool = False
    at: float


class ProactiveCompactionStarted(_Input):
    """The actor decided to compact the host context before sending the turn ``visit_id``
    (``decide_proactive`` fired on the pre-turn usage). A progress note: the turn is
    still pending, and its ``TurnEnded`` comes later either way."""

    kind: Literal["proactive_compaction_started"] = "proactive_compaction_started"
    visit_id: str
    decision: ProactiveDecision
    at: float


class ProactiveCompactionFinished(_Input):
    """The proactive compaction before turn ``visit_id`` ended: ``ok`` with the host's ``result``,
    or ``error`` (a failure only warns; the turn is sent regardless). ``cancelled``: the user
    stopped the compaction (an Esc in the harness) -- the turn is never sent and the cast is
    interrupted, as by an Esc during the turn; this one is an outcome, not a progress note."""

    kind: Literal["proactive_compaction_finished"] = "proactive_compaction_finished"
    visit_id: str
    decision: ProactiveDecision
    ok: bool
    result: dict[str, Any] | None = None
    error: str | None = None
    cancelled: bool = False
    at: float


class DispatchFailed(_Input):
    """The actor could not start the work of an effect (host gone, model API missing...), or could
    not keep its outcome (``error_is_the_reason``: the cast's storage refused the transition, so
    ``error`` -- "storage unavailable: ..." -- is the whole failure reason, never "Could not start")."""

    kind: Literal["dispatch_failed"] = "dispatch_failed"
    visit_id: str
    error: str
    at: float
    error_is_the_reason: bool = False


class RefinementTurnStarted(_Input):
    """A user message starts a turn while the cast is paused for refinement (``before_agent_start``)."""

    kind: Literal["refinement_turn_started"] = "refinement_turn_started"
    at: float


#: Why a pending user-driven refinement turn was withdrawn (``refinement_turn_abandoned.reason``).
#: Sent by the host: ``settled_without_end`` (the harness's run settled, ``agent_settled``, but its
#: ``agent_end`` never reached the cast: mistyped, lost), ``aborted`` (the user's run was aborted,
#: e.g. Esc), ``session_shutdown`` / ``session_closed`` (the harness session ended: shutdown event,
#: ``session.close``, connection closed, runtime shutdown), ``timed_out`` (the host's opt-in bound).
#: Decided by the engine itself: ``aborted`` (a ``TurnEnded`` with ``stop_reason`` "aborted"),
#: ``superseded`` (a new user message while the turn is pending), ``restart`` (a resume after the
#: runtime or the cast's actor restarted).
AbandonReason = Literal["settled_without_end", "aborted", "session_shutdown", "session_closed", "timed_out",
                        "superseded", "restart"]


class RefinementTurnAbandoned(_Input):
    """The harness will never report the end of the pending user-driven refinement turn ``visit_id``.

    The turn is withdrawn: the cast goes back to ``awaiting_refinement`` (paused) with its drafts
    intact. Like every outcome it must quote the pending ``visit_id``; any other id (the turn already
    ended, or castor's own turn is pending) is ignored and reported as ``outcome_ignored``.
    """

    kind: Literal["refinement_turn_abandoned"] = "refinement_turn_abandoned"
    visit_id: str
    reason: AbandonReason
    at: float


class ProjectMoved(_Input):
    """The cast was found, at its resume, in another run directory than its state names: its project
    was moved or copied. ``cwd`` / ``run_dir`` / ``artifact_root``: where it is now (its commands run
    there from now on, never in the project it was started in)."""

    kind: Literal["project_moved"] = "project_moved"
    cwd: str
    run_dir: str
    artifact_root: str
    at: float


class _Command(_Input):
    """A user's command. ``surface``: where it came from (None: keep the cast's); the engine's texts
    name that surface's commands from then on."""

    surface: Surface | None = None


class ContinueRequested(_Command):
    kind: Literal["continue_requested"] = "continue_requested"
    at: float


class AbortRequested(_Command):
    """``from_elsewhere``: ``castor abort`` asked for it from outside the session or command that
    runs the cast (its request left in the run directory), so the cast's own user did not: the
    engine's note says where it came from and how to go on there."""

    kind: Literal["abort_requested"] = "abort_requested"
    reason: str = "aborted by user"
    from_elsewhere: bool = False
    at: float


class RecastRequested(_Command):
    """``after_restart=True``: the runtime lost the in-flight work of an *active* cast (its actor
    or the whole process died); resume it as if it had failed there. ``cause``: what was lost,
    in words (the ``previousFailure`` of its ``cast_recast`` event); without it, the runtime
    restarted. ``command_interrupted`` (with ``after_restart``): the utility command the cast
    waits for had started and never ended (its record has no outcome), so the re-dispatch runs it
    a second time from the start -- the engine says so (``utility_interrupted``, a warning)."""

    kind: Literal["recast_requested"] = "recast_requested"
    after_restart: bool = False
    cause: str | None = None
    command_interrupted: bool = False
    at: float


class ReviveRequested(_Command):
    kind: Literal["revive_requested"] = "revive_requested"
    at: float


CastEvent = Annotated[
    CastStarted | TurnEnded | UtilityFinished | CompactionFinished | ProactiveCompactionStarted
    | ProactiveCompactionFinished | DispatchFailed | RefinementTurnStarted
    | RefinementTurnAbandoned | ProjectMoved | ContinueRequested | AbortRequested | RecastRequested
    | ReviveRequested,
    Field(discriminator="kind"),
]
EVENT_ADAPTER: TypeAdapter[CastEvent] = TypeAdapter(CastEvent)


# --------------------------------------------------------------------------- effects (outputs)

READ_ONLY_TOOLS = ("read", "grep", "find", "ls")


class RunAgentTurn(_Frozen):
    """Run one agent turn and answer with ``TurnEnded(visit_id=...)``.

    ``user_driven``: a refinement turn the user's own message drives — apply model/thinking/tools
    and the system prompt, but send no hidden prompt; ``isolated_context`` is the synthetic cast
    context that replaces the transcript before the socket's prompt while that turn runs.
    ``proactive_compaction``: call :func:`castor.domain.materia.compaction.decide_proactive`
    with the host's context usage before sending; if it fires, report
    ``ProactiveCompactionStarted`` / ``ProactiveCompactionFinished`` around a host compaction,
    then send the turn either way (a user-driven turn sends no prompt and is never compacted).
    """

    kind: Literal["run_agent_turn"] = "run_agent_turn"
    visit_id: str
    socket_id: str
    visit: int
    materia: str
    mode: Literal["normal", "refinement", "finalization"]
    prompt: str
    system_prompt: str
    visible_summary: str
    model: str | None = None
    thinking: str | None = None
    tools: Literal["none", "readOnly", "coding"]
    read_only_tools: tuple[str, ...] = READ_ONLY_TOOLS
    multi_turn: bool = False
    item_key: str | None = None
    item_label: str | None = None
    materia_model: dict[str, Any] | None = None  # the socket's ``materiaModel`` record (its messages' details)
    recovery: bool = False
    user_driven: bool = False
    isolated_context: str | None = None  # user-driven only: the synthetic isolated-context message
    proactive_compaction: bool = True
    compaction: Compaction | None = None
    #: The first turn of its visit (the cast entered the socket): ``castor_socket_visits_total``
    #: counts it, and no other turn of the visit (a retry, a rerun, a recast after a restart).
    opens_visit: bool = False
    #: The visit's turn sent again, its prompt reused (a same-socket retry, a rerun after an
    #: interruption, a recast after its cast or castor restarted): ``castor_socket_visit_restarts_total``.
    sent_again: bool = False


class RunUtility(_Frozen):
    """Run a command (no shell) or an IO built-in; answer with ``UtilityFinished(visit_id=...)``.
    Exactly one of ``command`` / ``builtin`` is set. ``stdin_json`` goes to stdin as one JSON line."""

    kind: Literal["run_utility"] = "run_utility"
    visit_id: str
    socket_id: str
    visit: int
    command: tuple[str, ...] | None = None
    builtin: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    stdin_json: dict[str, Any]
    timeout_ms: float | int
    max_output_bytes: int
    cwd: str = ""
    resources: dict[str, float] = Field(default_factory=dict)  # the socket's ``resources`` (e.g. cpus)


class Compact(_Frozen):
    """Compact the host context with ``instructions``, then answer ``CompactionFinished(visit_id=...)``
    — under a deadline: no answer in time is ``ok=False`` (the recovery fails)."""

    kind: Literal["compact"] = "compact"
    visit_id: str
    reason: str
    instructions: str
    key: str | None = None
    attempt: int = 0


class EmitEvent(_Frozen):
    """Append ``{"ts": ts_ms, "type": type, "data": data}`` to ``events.jsonl``."""

    kind: Literal["emit_event"] = "emit_event"
    type: str
    data: dict[str, Any]
    ts_ms: int


# json's C encoder made once: ``json.dumps(value, ensure_ascii=False, allow_nan=False,
# separators=(",", ":"))``, what the artifacts adapter writes an event's data with (its
# ``compact_json``), so the data's text made for the outbox is the event line's too.
_C_MAKE_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)
_DATA_FALLBACK = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_DATA_ENCODE: Any = None if _C_MAKE_ENCODER is None else _C_MAKE_ENCODER(
    None, _DATA_FALLBACK.default, encode_basestring, None, ":", ",", False, False, False)
_EVENT_FIELDS = ("kind", "type", "data", "ts_ms")
assert tuple(EmitEvent.model_fields) == _EVENT_FIELDS, "emit_event_json writes EmitEvent's fields in order"


def event_data_json(data: dict[str, Any]) -> str:
    """An event's data as ``events.jsonl`` writes it: json's compact, strict text (UTF-8 kept,
    no NaN); ValueError or TypeError for data JSON cannot hold."""
    if _DATA_ENCODE is None:  # no C accelerator (another interpreter): json's own path
        text: str = _DATA_FALLBACK.encode(data)
        return text
    return "".join(_DATA_ENCODE(data, 0))


def emit_event_json(effect: EmitEvent, data_json: str) -> bytes:
    """``effect``'s JSON (its fields in order, as its serialiser lays them out) with ``data_json``
    (:func:`event_data_json` of its data) as its data: the outbox entry of an event whose data's
    text is made once for both the outbox and the event's line. It loads as the same effect: the
    text is json's, which writes a float as ``repr`` does (pydantic's serialiser writes some
    without an exponent), and either parses back to the same float."""
    return f'{{"kind":"emit_event","type":{encode_basestring(effect.type)},"data":{data_json},' \
           f'"ts_ms":{int(effect.ts_ms)}}}'.encode()


class WriteArtifact(_Frozen):
    """Write ``content`` at ``<runDir>/<path...>`` (atomic). ``manifest``: also append this entry."""

    kind: Literal["write_artifact"] = "write_artifact"
    path: tuple[str, ...]
    content: str
    manifest: dict[str, Any] | None = None


class AddManifestEntry(_Frozen):
    kind: Literal["add_manifest_entry"] = "add_manifest_entry"
    entry: dict[str, Any]


class Notify(_Frozen):
    kind: Literal["notify"] = "notify"
    level: Literal["info", "warning", "error"]
    message: str


#: Why castor stops a turn in flight (``CancelWork.reason``; the harness hears it in ``agent.abort_turn``).
CancelReason = Literal["cast_aborted", "cast_restarted", "cast_stopped"]


class CancelWork(_Frozen):
    """Stop the outside work of ``visit_id`` if it still runs; its outcome will be ignored.

    ``reason``: ``cast_aborted`` (the user aborted the cast), ``cast_restarted`` (the work is redone
    under a new visit id after a restart)."""

    kind: Literal["cancel_work"] = "cancel_work"
    visit_id: str
    reason: CancelReason = "cast_aborted"


class Finished(_Frozen):
    kind: Literal["finished"] = "finished"
    cast_id: str
    entry_id: str | None = None


class Failed(_Frozen):
    kind: Literal["failed"] = "failed"
    cast_id: str
    reason: str
    revivable: bool = False
    aborted: bool = False
    entry_id: str | None = None


Effect = Annotated[
    RunAgentTurn | RunUtility | Compact | EmitEvent | WriteArtifact | AddManifestEntry | Notify | CancelWork
    | Finished | Failed,
    Field(discriminator="kind"),
]
EFFECT_ADAPTER: TypeAdapter[Effect] = TypeAdapter(Effect)
