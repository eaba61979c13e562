"""The whole materia cast state machine as one pure function.

API (everything a host actor needs)::

    from castor.domain.materia.engine import step, Transition, CastRejected
    from castor.domain.materia.cast_messages import (CastStarted, TurnEnded, UtilityFinished,
        CompactionFinished, ProactiveCompactionStarted, ProactiveCompactionFinished,
        DispatchFailed, RefinementTurnStarted, RefinementTurnAbandoned, ContinueRequested,
        AbortRequested, RecastRequested, ReviveRequested,            # events (inputs)
        RunAgentTurn, RunUtility, Compact, EmitEvent, WriteArtifact, AddManifestEntry,
        Notify, CancelWork, Finished, Failed)                          # effects (outputs)
    from castor.domain.materia.state import CastState

    transition = step(state_or_None, event)      # never mutates its input
    persist(transition.state)                    # CastState.to_json() / CastState.from_json()
    for effect in transition.effects: perform(effect)   # in order

Contract:

- ``step(None, CastStarted(...))`` creates the cast. Every other event needs the current state.
- Commands that are not allowed now (continue while awaiting, recast of a complete cast, revive
  of a non-revivable cast, abort of an inactive cast...) raise :class:`CastRejected` (a
  ``Conflict``; revive raises its subclass-compatible ``NotRevivable``); the state is unchanged.
- Work outside the engine is requested by ``RunAgentTurn`` / ``RunUtility`` / ``Compact``, each
  with a ``visit_id``. Its outcome event must quote that id. An outcome whose ``visit_id`` is not
  the one the cast waits for (a duplicate, a late answer after abort/recovery) is **ignored** and
  reported as an ``outcome_ignored`` event; it is never applied twice.
- Failures inside the cast (invalid JSON, limits, budget, utility errors, terminal turn
  failures) never raise: they produce a failed state, ``cast_end{ok:false}`` and a ``Failed`` effect.
- Effects are ordered; perform them in order (artifact writes before the events that name them).
- A *user-driven* refinement turn (``RunAgentTurn.user_driven``, ``Pending.user_driven``) is run by
  the harness, never by castor, so castor can neither cancel nor redo it. It ends exactly once: by its
  ``TurnEnded`` (the harness's ``agent_end``), by ``AbortRequested``, or by being *withdrawn* back to
  paused — ``RefinementTurnAbandoned`` from the host (settled without an end, aborted, session
  ended, timed out), a ``TurnEnded`` whose ``stop_reason`` is "aborted", a new
  ``RefinementTurnStarted`` (superseded) or a ``RecastRequested(after_restart)`` (restart). A
  withdrawal emits ``refinement_turn_abandoned`` and keeps every draft and counter; anything
  quoting the withdrawn visit id afterwards is ``outcome_ignored``.

Every command event may carry ``surface`` (``harness`` | ``cli``): the cast keeps it and its texts
name that surface's commands (``/materia continue`` / ``castor continue <id>``). A failure text names
the agent of the turn (``TurnEnded.agent``: "Pi agent", "scripted agent (...)", ...).

Decision table (trigger → state → effects/events → next state):

| trigger | state | effects / events | next |
|---|---|---|---|
| CastStarted | — | write config.resolved.json, manifest.json; ``cast_start``; ``config_warning`` per config warning; start entry | awaiting entry socket |
| start socket | loop socket, no item | (no visit, no ``socket_start``) route to empty-loop target | next socket / complete |
| start socket | visits+1 > limit | ``cast_end{ok:false}`` | failed |
| start socket | agent | ``socket_start``, ``materia_model_settings``, context artifact, RunAgentTurn | awaiting_agent_response |
| start socket | utility | ``socket_start``, input artifact, ``utility_input``, RunUtility (or inline output for ``params.output``/``noop``/``echo``) | running_utility |
| TurnEnded ok | single-turn / finalization | output artifact, parse+validate, envelope, assign, advance, ``socket_complete``, budget, route | next socket / complete / failed |
| TurnEnded ok | multi-turn, not finalizing | refinement artifact, ``socket_refinement``, Notify | awaiting_user_refinement (paused) |
| TurnEnded error | transient_transport | ``transient_transport_turn_failure{warning}``, Notify warning; nothing resent | unchanged: active, awaiting, same visit_id |
| TurnEnded error | context_window, attempts < max | ``same_socket_recovery_start``, ``…_action_start``, Compact | awaiting compaction |
| CompactionFinished ok | awaiting compaction | ``…_action_complete{result[, skipped]}``, RunAgentTurn(same prompt, recovery), ``…_retry`` | awaiting_agent_response (no new visit) |
| CompactionFinished error | awaiting compaction | ``…_action_failed``, ``…_retry_failed``, ``cast_end{ok:false}`` | failed (not revivable) |
| CompactionFinished cancelled (the user's Esc) | awaiting compaction | ``…_action_cancelled``, ``turn_interrupted{reason:"compaction_cancelled"}``, Notify warning naming continue/abort | interrupted (continue re-runs the turn) |
| ProactiveCompactionStarted | awaiting that agent turn | ``proactive_compaction_start{decision, socket, item fields, visit, mode}`` | unchanged (the turn is still pending) |
| ProactiveCompactionFinished ok | awaiting that agent turn | ``proactive_compaction_complete{…, result}`` | unchanged |
| ProactiveCompactionFinished error | awaiting that agent turn | ``proactive_compaction_failed{…, error, warning:true}``, Notify warning | unchanged: active, the turn is sent anyway |
| ProactiveCompactionFinished cancelled (the user's Esc) | awaiting that agent turn (never sent) | ``proactive_compaction_cancelled{…, error}``, ``turn_interrupted{reason:"compaction_cancelled"}``, Notify warning naming continue/abort | interrupted (continue sends the turn) |
| TurnEnded error | tool_timeout / turn_failure, attempts < max | ``same_socket_recovery_start``, RunAgentTurn(same prompt), ``…_retry`` | awaiting_agent_response |
| TurnEnded error | recoverable, attempts ≥ max | ``same_socket_recovery_exhausted``, ``cast_end{ok:false}`` | failed, revivable |
| TurnEnded error | anything else | ``cast_end{ok:false}`` "Non-recoverable turn failure" | failed |
| UtilityFinished | ok | command artifacts + ``utility_command``; then as TurnEnded ok | next |
| UtilityFinished | timeout / exit≠0 / spawn or built-in error | artifacts, ``cast_end{ok:false}`` | failed |
| RefinementTurnStarted | paused | refinement context artifact, ``context_refinement``, RunAgentTurn(user_driven) | awaiting_agent_response (a user turn) |
| RefinementTurnStarted | user turn pending (its end and settle were never reported) | ``refinement_turn_abandoned{superseded}``, Notify warning, then as paused | awaiting_agent_response (the new user turn) |
| RefinementTurnStarted | anything else | CastRejected(``not-paused``) | unchanged |
| TurnEnded ``stop_reason`` "aborted" | user turn pending | usage; ``refinement_turn_abandoned{aborted}``, Notify warning; no draft, no retry | awaiting_user_refinement (paused) |
| TurnEnded ``stop_reason`` "aborted" (Esc, a cancel; with or without text or error) | castor's own turn pending, any mode (normal, first draft, finalization, retry) | usage; ``turn_interrupted{socket, materia, visitId, visit, mode, reason, textDiscarded, item fields}``, Notify warning naming continue/abort; no output artifact, no parse, no draft, no retry; the budget check | interrupted (active, nothing pending); failed if a stopping budget limit was crossed |
| ContinueRequested | interrupted | ``turn_resumed{socket, materia, visit, mode, by:"continue"}``, RunAgentTurn(same prompt and mode, same visit, new visit id) | awaiting_agent_response |
| RecastRequested | interrupted | as ContinueRequested, ``by:"recast"`` | awaiting_agent_response |
| RecastRequested(after_restart) | interrupted | ``cast_recast{interrupted:true, reusedActivePrompt:false}``, Notify; nothing sent (nothing was lost) | interrupted |
| RefinementTurnStarted / ReviveRequested | interrupted | CastRejected(``not-paused``) / NotRevivable(``active``) | unchanged |
| RefinementTurnAbandoned | user turn pending, visit_id matches | ``refinement_turn_abandoned{visitId, reason, refinementTurn}``, Notify warning; drafts and counters untouched | awaiting_user_refinement (paused) |
| RefinementTurnAbandoned | castor's own turn pending, other visit_id, or inactive | ``outcome_ignored`` | unchanged |
| ContinueRequested | paused | ``materia_model_settings{finalization}``, RunAgentTurn(finalization prompt) | awaiting finalization |
| ContinueRequested | awaiting / inactive | CastRejected | unchanged |
| AbortRequested | active (a turn pending, interrupted, paused...) | CancelWork(pending visit, ``cast_aborted``) if any, ``cast_end{ok:false, aborted}``, Notify warning (``from_elsewhere``: it says the abort came from outside, ``castor abort``, and names the recast), Failed(aborted) | failed (recastable) |
| AbortRequested | inactive (a second abort) | CastRejected(``not-active``) | unchanged |
| RecastRequested | failed/aborted | ``cast_recast``; RunAgentTurn(stored prompt, same visit) or start socket again (new visit) | awaiting |
| RecastRequested(after_restart) | active, castor's work pending | CancelWork(the pending visit id, ``cast_restarted``); a utility command that started and never ended (``command_interrupted``): ``utility_interrupted{socket, visitId, visit, command or utility, cause}`` and a warning that it runs again; an agent turn: a Notify warning that it runs again, naming the cause and abort; then as recast | awaiting |
| RecastRequested(after_restart) | active, user turn pending | ``refinement_turn_abandoned{restart}``, then as paused (castor can never redo the user's own turn) | paused |
| RecastRequested(after_restart) | active, paused | ``cast_recast{paused:true, reusedActivePrompt:false}``, Notify; no turn (nothing was lost) | paused |
| ReviveRequested | exhausted + eligible | allowance += original; ``cast_revive`` then ``cast_recast`` | awaiting |
| DispatchFailed | pending matches | ``cast_end{ok:false}`` | failed |
| any outcome | visit_id ≠ pending | ``outcome_ignored`` | unchanged |
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass
from typing import Any, Literal

from castor.domain.jsontext import js_collapse_whitespace, js_slice, js_string, js_stringify
from castor.domain.materia import prompts
from castor.domain.materia.budget import (
    CAPPED_NOTE,
    SELECTION_FIELDS,
    BudgetCheck,
    TurnUsage,
    UsageReport,
    check_budget,
    cost_from_provider,
    extract_usage,
    model_selection,
    stopped_unreported,
    turn_cost_kind,
    turn_record,
    unreadable_figures,
    usage_caveats,
    usage_file_text,
)
from castor.domain.materia.cast_messages import (
    AbortRequested,
    AddManifestEntry,
    CancelWork,
    CastStarted,
    Compact,
    CompactionFinished,
    ContinueRequested,
    DispatchFailed,
    Effect,
    EmitEvent,
    Failed,
    Finished,
    Notify,
    ProactiveCompactionFinished,
    ProactiveCompactionStarted,
    ProjectMoved,
    RecastRequested,
    RefinementTurnAbandoned,
    RefinementTurnStarted,
    ReviveRequested,
    RunAgentTurn,
    RunUtility,
    TurnEnded,
    UtilityFinished,
    WriteArtifact,
    built,
)
from castor.domain.materia.compaction import compaction_summary
from castor.domain.materia.config import (
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_UTILITY_TIMEOUT_MS,
    END,
    Budget,
    ResolvedConfig,
    ResolvedSocket,
)
from castor.domain.materia.expressions import (
    MISSING,
    AssignError,
    ConditionError,
    Scope,
    as_list,
    evaluate_condition,
    path_segments,
    resolve_value,
)
from castor.domain.materia.failures import (
    RECOVERABLE,
    allowance_for,
    classify_turn_failure,
    decide_recovery,
    recovery_key,
)
from castor.domain.materia.graph import socket_ordinal_text
from castor.domain.materia.handoff import (
    HandoffError,
    apply_assign,
    apply_envelope,
    extract_json,
    requires_satisfied,
    validate_handoff,
)
from castor.domain.materia.loops import (
    empty_loop_target,
    exhaustion_target,
    item_data_updates,
    iteration_for,
    loop_aliases,
    select_item,
)
from castor.domain.materia.memo import derived
from castor.domain.materia.revive import RecoveryExhaustion, grant_revive
from castor.domain.materia.routing import LimitExceeded, count_visit, next_target
from castor.domain.materia.socket_facts import facts_of
from castor.domain.materia.state import (
    CastState,
    Pending,
    TurnMode,
    config_hash,
    refinement_counter_key,
    seg,
    task_attempt_key,
)
from castor.domain.materia.surface import command
from castor.domain.timestamps import iso_utc_ms
from castor.messages.errors import Conflict, NotFound

#: Built-in utilities that need IO and therefore run outside the engine.
IO_BUILTINS = ("project.ensureIgnored", "vcs.detect")


def echo_output(params: dict[str, Any]) -> str:
    """What ``params.output`` or the ``echo`` utility outputs: ``output``, else ``text ?? message ??
    ""`` (a null is as absent), a value that is not text as ``JSON.stringify`` writes it."""
    if "output" in params:
        value = params["output"]
    else:
        value = next((params[k] for k in ("text", "message") if params.get(k) is not None), "")
    return value if isinstance(value, str) else js_stringify(value)


#: Built-ins the engine evaluates itself (pure).
PURE_BUILTINS = ("noop", "echo")
MAX_ROUTING_HOPS = 10_000
COMPACTION_INSTRUCTIONS = (
    "Compact the conversation for a same-socket retry of an active materia cast. Preserve the active cast "
    "state, the requirements of the current task and every durable artifact and event reference needed to "
    "redo the same turn."
)


class CastRejected(Conflict):
    """A command that is not allowed in the cast's current state. ``data["reason"]`` is stable."""


@dataclass(frozen=True)
class Transition:
    state: CastState
    effects: tuple[Effect, ...]

    def of_type(self, cls: type) -> list[Any]:
        return [e for e in self.effects if isinstance(e, cls)]

    def events(self, type_: str | None = None) -> list[EmitEvent]:
        return [e for e in self.effects if isinstance(e, EmitEvent) and (type_ is None or e.type == type_)]


class _Fail(Exception):
    def __init__(self, message: str, entry_id: str | None = None, *, preserve: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.entry_id = entry_id
        self.preserve = preserve


def _reject(message: str, reason: str) -> CastRejected:
    return CastRejected(message, data={"reason": reason})


#: pi-materia's event types: their data is written as its ``JSON.stringify`` writes it, an unset
#: field (``None``: a utility socket's ``materia``, a failure's missing ``entryId``) left out.
PI_MATERIA_EVENTS = frozenset({
    "cast_start", "socket_start", "materia_model_settings", "context_refinement", "socket_refinement",
    "socket_complete", "utility_input", "utility_command", "budget_warning", "budget_limit",
    "proactive_compaction_start", "proactive_compaction_complete", "proactive_compaction_failed",
    "transient_transport_turn_failure", "same_socket_recovery_start", "same_socket_recovery_action_start",
    "same_socket_recovery_action_complete", "same_socket_recovery_action_failed", "same_socket_recovery_retry",
    "same_socket_recovery_retry_failed", "same_socket_recovery_exhausted", "cast_recast", "cast_revive", "cast_end",
})
#: The ``null`` values pi-materia itself writes: a command's exit ``code`` and ``signal`` as Node reports them.
NULL_KEPT = {"utility_command": frozenset({"code", "signal"})}


def _set_fields(data: dict[str, Any], kept: frozenset[str] = frozenset()) -> dict[str, Any]:
    """``data`` without its unset (``None``) fields, except ``kept``; ``data`` itself when it has none."""
    # Most data has no None at all: told at C speed (``in`` tests identity first, so a value that
    # only compares equal to None goes on to the exact test below).
    if None not in data.values() or all(value is not None or key in kept for key, value in data.items()):
        return data
    return {key: value for key, value in data.items() if value is not None or key in kept}


class _Ctx:
    def __init__(self, state: CastState, at: float) -> None:
        self.s = state
        self.at = at
        self.ts_ms = int(round(at * 1000))  # the step's millisecond (every stamp of a transition)
        self.effects: list[Effect] = []
        self._iso: str | None = None
        self._usage_write: int | None = None  # where this transition's usage.json write is in effects
        self._usage_text: tuple[UsageReport, str] | None = None  # the report that write has, and its text

    def iso(self) -> str:
        """The step's time as JavaScript's ``toISOString`` writes it (milliseconds, ``Z``), the
        same millisecond as :attr:`ts_ms`."""
        iso = self._iso
        if iso is None:  # one clock reading per step: every timestamp of a transition is the same
            iso = self._iso = iso_utc_ms(self.ts_ms / 1000)
        return iso

    def emit(self, type_: str, data: dict[str, Any]) -> None:
        if type_ in PI_MATERIA_EVENTS:
            data = _set_fields(data, NULL_KEPT.get(type_, frozenset()))
        self.effects.append(built(EmitEvent, type=type_, data=data, ts_ms=self.ts_ms))

    def write(self, path: tuple[str, ...], content: str, manifest: dict[str, Any] | None = None) -> str:
        rel = "/".join(path)
        if manifest is not None:
            manifest = {**_set_fields(manifest), "artifact": rel, "timestamp": self.ts_ms}  # Date.now(), as pi-materia
        self.effects.append(built(WriteArtifact, path=path, content=content, manifest=manifest))
        return rel

    def manifest(self, entry: dict[str, Any]) -> None:
        self.effects.append(built(AddManifestEntry, entry={**_set_fields(entry), "timestamp": self.ts_ms}))

    def notify(self, level: Literal["info", "warning", "error"], message: str) -> None:
        self.effects.append(Notify(level=level, message=message))

    def write_usage(self) -> None:
        # A UsageReport is never changed in place (add_turn returns a new one), so its text is
        # rendered once per report in a transition (kept here, not with the report: a live cast
        # would hold it until its next transition), each turn record's text once per record.
        report = self.s.usage
        if self._usage_text is not None and self._usage_text[0] is report:
            return  # this report's text is the write's already
        content = usage_file_text(report)
        self._usage_text = (report, content)
        if self._usage_write is not None:
            # One usage.json write a transition (a turn's end and its socket's completion both
            # ask): the latest report, where the first ask put it (no other effect depends on it).
            self.effects[self._usage_write] = built(WriteArtifact, path=("usage.json",), content=content)
            return
        self._usage_write = len(self.effects)
        self.write(("usage.json",), content)


# =========================================================================== entry point


def step(state: CastState | None, event: Any) -> Transition:
    """Apply one event. Pure: returns a new state and the effects to perform, in order."""
    if isinstance(event, CastStarted):
        if state is not None:
            raise _reject(f"pi-materia cast {state.cast_id} already exists", "exists")
        return _start_cast(event)
    if state is None:
        raise NotFound("No pi-materia cast state in this session.")
    handler = _HANDLERS.get(type(event))
    if handler is None:
        raise _reject(f"unsupported cast event {type(event).__name__}", "unsupported")
    ctx = _Ctx(_fork(state), event.at)
    # A field of the user's commands only: read where it is one (a getattr that misses goes
    # through pydantic's __getattr__ and an AttributeError, on every turn's end).
    surface = event.surface if type(event) in _SURFACED else None
    if surface is not None:  # a user's command: its texts name the commands of where the user is
        ctx.s.surface = surface
    try:
        handler(ctx, event)
    except _Fail as failure:
        _fail_cast(ctx, failure.message, failure.entry_id, preserve=failure.preserve)
    ctx.s.updated_at = event.at
    return Transition(state=ctx.s, effects=tuple(ctx.effects))


#: The containers of CastState that handlers mutate in place (``dict[...] = ``, ``update``, ``pop``,
#: ``setdefault``). Everything else is replaced wholesale by the handlers (``s.usage = ...``,
#: ``s.data = apply_envelope(...)``, ``s.pending = Pending(...)``) or never changes (``config``).
_MUTABLE_CONTAINERS = ("data", "cursors", "visits", "multi_turn_refinements", "recovery_attempts",
                       "recovery_allowances", "task_attempts", "edge_traversals")


def _fork(state: CastState) -> CastState:
    """A working copy of ``state`` for one step, sharing everything the step cannot change.

    Structural sharing instead of a deep copy: the resolved config, the usage report, pending and
    recovery records are shared by reference (the engine never mutates them: it assigns new
    values); the dicts the handlers mutate in place get a fresh top level. Nested values inside
    ``data`` are shared too: every helper that changes nested data (``apply_envelope``,
    ``apply_assign``) works on its own deep copy and the handlers only add, replace or pop
    top-level keys. The purity test in tests/domain/materia proves the input is never touched.
    """
    values = state.__dict__
    fork = object.__new__(CastState)
    # What model_copy(update=...) does for these fields, without its generic copy steps.
    object.__setattr__(fork, "__dict__", {**values, **{name: dict(values[name]) for name in _MUTABLE_CONTAINERS}})
    object.__setattr__(fork, "__pydantic_fields_set__", set(state.__pydantic_fields_set__).union(_MUTABLE_CONTAINERS))
    object.__setattr__(fork, "__pydantic_extra__", None)
    object.__setattr__(fork, "__pydantic_private__", None)
    return fork


# =========================================================================== start / finish / fail


CONFIG_FILE = ("config.resolved.json",)  # the run dir's copy of the resolved config, written at start


def resolved_config_text(cfg: ResolvedConfig) -> str:
    """``config.resolved.json``'s text for ``cfg`` (made once per config object): a function of the
    config alone, so a saved state's config re-derives it exactly (its JSON round trip keeps
    every key, in order, and every value)."""
    return derived(cfg, "resolved_json", lambda: json.dumps(cfg.config, indent=2, ensure_ascii=False))


#: Every new cast's usage report: one object, shared (a report is never changed in place: see
#: ``write_usage``), so the first ``usage.json`` text of a cast is rendered once per process.
_NO_USAGE = UsageReport()


def _start_cast(ev: CastStarted) -> Transition:
    cfg = ev.config
    entry = cfg.pipeline.entry
    state = CastState(
        cast_id=ev.cast_id, request=ev.request, cwd=ev.cwd, run_dir=ev.run_dir, artifact_root=ev.artifact_root,
        config_source=cfg.source, config_hash=derived(cfg, "config_hash", lambda: config_hash(cfg.config)),
        config=cfg, active=True, phase=entry,
        current_socket_id=entry, awaiting_response=True, socket_state="awaiting_agent_response",
        started_at=ev.at, updated_at=ev.at, data=dict(ev.data), last_message="Cast started.", surface=ev.surface,
        usage=_NO_USAGE,
    )
    ctx = _Ctx(state, ev.at)
    ctx.write(CONFIG_FILE, resolved_config_text(cfg))
    # Compact: the artifacts adapter writes every manifest in its own layout (CastArtifacts.write_transition).
    ctx.write(("manifest.json",), json.dumps({"castId": ev.cast_id, "request": ev.request,
                                              "configSource": cfg.source, "entries": []}))
    name = cfg.pipeline.loadout_name
    loadout_cfg = (cfg.config.get("loadouts") or {}).get(name)
    ctx.emit("cast_start", {"request": ev.request, "configSource": cfg.source, "artifactRoot": ev.artifact_root,
                            "pipeline": loadout_cfg, "loadout": name, "nativeSession": True,
                            "isolatedMateriaContext": True})
    for warning in cfg.warnings:  # loaded and run the way pi-materia does; said once per cast
        ctx.emit("config_warning", {"code": warning.code, "path": warning.path, "source": warning.source,
                                    "message": warning.message})
        ctx.notify("warning", f"materia config warning {warning.pointed()}")
    ctx.write_usage()
    try:
        _goto(ctx, entry, None)
    except _Fail as failure:
        _fail_cast(ctx, failure.message, failure.entry_id, preserve=failure.preserve)
    return Transition(state=ctx.s, effects=tuple(ctx.effects))


def _finish(ctx: _Ctx, entry_id: str | None) -> None:
    s = ctx.s
    s.active = False
    s.phase = "complete"
    s.socket_state = "complete"
    s.awaiting_response = False
    s.pending = None
    s.recovery_exhaustion = None
    s.failed_reason = None
    s.aborted = False
    s.last_message = "Cast complete."
    s.ended_at = ctx.at
    ctx.write_usage()
    ctx.emit("cast_end", {"ok": True, "usage": s.usage.model_dump(mode="json", exclude={"turns"}, exclude_none=True),
                          "entryId": entry_id})
    ctx.manifest({"phase": "complete", "entryId": entry_id})
    ctx.notify("info", f"pi-materia cast complete. Cast {s.cast_id}: {js_string(s.usage.tokens.total)} tokens, "
                       f"${s.usage.cost.total:.4f}{usage_caveats(s.usage)}.")
    ctx.effects.append(Finished(cast_id=s.cast_id, entry_id=entry_id))


def _fail_cast(ctx: _Ctx, message: str, entry_id: str | None, *, preserve: bool = False,
               aborted: bool = False, aborted_from_elsewhere: bool = False) -> None:
    s = ctx.s
    s.active = False
    s.awaiting_response = False
    s.pending = None
    s.socket_state = "failed"
    s.phase = "failed"
    s.failed_reason = message
    s.aborted = aborted
    s.ended_at = ctx.at
    s.last_message = message
    if not preserve:
        s.recovery_exhaustion = None
    ctx.write_usage()
    data: dict[str, Any] = {"ok": False, "error": message, "entryId": entry_id, "socket": s.current_socket_id}
    if aborted:
        data["aborted"] = True
    ctx.emit("cast_end", data)
    ctx.manifest({"phase": "failed", "socket": s.current_socket_id, "materia": s.current_materia,
                  "itemKey": s.current_item_key, "entryId": entry_id})
    if aborted and aborted_from_elsewhere:  # the user here did not ask: say who did, and how to go on here
        ctx.notify("warning", f"pi-materia cast {s.cast_id} aborted from outside this session (castor abort). "
                              f"Recast it with {command(s.surface, 'recast', s.cast_id)}.")
    elif aborted:
        ctx.notify("warning", f"pi-materia cast {s.cast_id} aborted: {message}")
    else:  # pi-materia's phrase first ("pi-materia cast failed: <reason>"), then which cast
        ctx.notify("error", f"pi-materia cast failed: {message} (cast {s.cast_id})")
    ctx.effects.append(
        Failed(
            cast_id=s.cast_id,
            reason=message,
            revivable=preserve and s.recovery_exhaustion is not None,
            aborted=aborted,
            entry_id=entry_id,
        )
    )


# =========================================================================== routing driver


@dataclass(frozen=True)
class _Dispatched:
    pass


@dataclass(frozen=True)
class _Skip:
    target: str


@dataclass(frozen=True)
class _Inline:
    text: str
    entry_id: str


def _goto(ctx: _Ctx, target: str | None, entry_id: str | None) -> None:
    """Start ``target`` and keep going through skips and inline utilities until the cast waits or ends.

    A socket that fails to start fails the cast with ``entry_id`` (the output being routed), unless
    its failure names an entry of its own."""
    sockets = ctx.s.config.pipeline.sockets
    for _ in range(MAX_ROUTING_HOPS):
        if target is None or target == END:
            _finish(ctx, entry_id)
            return
        if target not in sockets:
            raise _Fail(f'Unknown graph target "{target}"', entry_id)
        try:
            outcome = _start_socket(ctx, sockets[target])
        except _Fail as failure:
            if failure.entry_id is not None or entry_id is None:
                raise
            # A socket that cannot start (its visit limit, say) fails the routing that led to it:
            # the cast ends with the entry id of the output being routed, as an edge limit does.
            raise _Fail(failure.message, entry_id, preserve=failure.preserve) from None
        if isinstance(outcome, _Dispatched):
            return
        if isinstance(outcome, _Skip):
            target, entry_id = outcome.target, "foreach-empty"
            continue
        entry_id = outcome.entry_id
        target = _complete_socket(ctx, sockets[ctx.s.current_socket_id], outcome.text, entry_id, finalized=False)
    raise _Fail(f"routing did not settle after {MAX_ROUTING_HOPS} steps", entry_id)


def _materia_model(rs: ResolvedSocket) -> dict[str, Any] | None:
    """The socket's ``materiaModel`` record (events, manifest): pi-materia's
    ``MateriaModelSelection`` (:func:`materia_model_selection`), the same fields as the socket's
    ``usage.json`` ``modelSelections`` records; None for a socket with no materia. One record per
    (model, thinking), made once (:func:`shared_materia_model`); nothing mutates it."""
    return facts_of(rs).materia_model


def _apply_model_settings(ctx: _Ctx, rs: ResolvedSocket, visit: int, **extra: Any) -> None:
    """An agent turn is about to be asked for: record the materia's model selection in the usage
    report (``modelSelections``: where it was applied, then the ``materiaModel`` record) and emit
    ``materia_model_settings`` (``extra``: refinementTurn, finalization)."""
    s = ctx.s
    facts = facts_of(rs)
    record = facts.materia_model
    if record is not None:
        s.usage = s.usage.add_selection(model_selection(
            socket=facts.id, materia=facts.materia_name, visit=visit, item_key=s.current_item_key,
            requested_model=record.get("requestedModel"), requested_thinking=record.get("requestedThinking"),
            thinking=record.get("thinking"), thinking_fallback_reason=record.get("thinkingFallbackReason"),
            attempt=max(s.attempt, 1)))
    ctx.emit("materia_model_settings", {"socket": facts.id, "materia": facts.materia_name, "visit": visit,
                                        **s.item_fields(), "materiaModel": record, **extra})


def _drop_path_holding(data: dict[str, Any], path: str, item: Any) -> None:
    """Remove the value at dotted ``path`` of ``data`` if it is ``item`` (the nested dicts on the
    way are copied: the input state's are shared)."""
    parts = path_segments(path)
    node: Any = data
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if not parts or not isinstance(node, dict) or node.get(parts[-1], MISSING) != item:
        return
    top = copy.deepcopy(data[parts[0]]) if len(parts) > 1 else None
    node = top
    for part in parts[1:-1]:
        node = node[part]
    if node is None:
        del data[parts[0]]
    else:
        del node[parts[-1]]
        data[parts[0]] = top


def _start_socket(ctx: _Ctx, rs: ResolvedSocket) -> _Dispatched | _Skip | _Inline:
    s = ctx.s
    facts = facts_of(rs)
    pipeline = s.config.pipeline
    it = iteration_for(pipeline, facts.id)
    if it is not None:
        sel = select_item(it, s.data, s.cursors, s.last_json if s.last_json is not None else MISSING)
        s.cursors.setdefault(it.cursor, sel.index)
        if sel.item is MISSING:
            s.current_item_key = s.current_item_label = None
            return _Skip(empty_loop_target(pipeline, facts.id, it))
        s.data.update(item_data_updates(it, sel.item))
        if it.as_ != "item" and "." in it.as_:  # pi-materia's setPath: "ctx.task" is data.ctx.task
            try:
                s.data = apply_assign(s.data, {it.as_: "item"}, Scope(data=s.data))
            except AssignError as exc:
                raise _Fail(f'socket "{facts.id}" loop item name: {exc.message}') from None
        s.current_item_key, s.current_item_label = sel.key, sel.label
    else:
        s.current_item_key = s.current_item_label = None
        # Deliberate difference: no stale loop item leaks into non-loop sockets -- under a loop's
        # own name for it (``as``) neither, while that name still holds the item (else it is data).
        item = s.data.get("item", MISSING)
        for alias in loop_aliases(pipeline):
            if item is not MISSING and "." in alias:
                _drop_path_holding(s.data, alias, item)
            elif item is not MISSING and alias in s.data and s.data[alias] == item:
                del s.data[alias]
        for key in ("item", "currentWorkItem", "workItem"):
            s.data.pop(key, None)
    s.assign(phase=facts.id, current_socket_id=facts.id, current_materia=facts.materia_name)
    try:
        visit = count_visit(facts.id, facts.socket, s.visits, s.config.limits)
    except LimitExceeded as exc:
        raise _Fail(exc.message) from None
    akey = task_attempt_key(facts.id, s.current_item_key)
    s.task_attempts[akey] = s.task_attempts.get(akey, 0) + 1
    s.assign(attempt=s.task_attempts[akey], multi_turn_finalizing=False, last_message=facts.id)
    ctx.emit("socket_start", {"socket": facts.id, "materia": facts.materia_name, "type": facts.type,
                              **s.item_fields(), "visit": visit})
    if not facts.is_agent:
        s.awaiting_response = False
        s.socket_state = "running_utility"
        return _dispatch_utility(ctx, rs)
    _apply_model_settings(ctx, rs, visit)
    _dispatch_agent(ctx, rs, "refinement" if facts.multi_turn else "normal", opens_visit=True)
    return _Dispatched()


#: pi-materia's ``MAX_UTILITY_ERROR_SUMMARY_LENGTH``: the stderr shown in a failure, in UTF-16 units.
STDERR_SUMMARY_UNITS = 800


def _item_suffix(s: CastState) -> str:
    """``-<item key>`` in artifact names; none for no item or an empty key (an item whose id is "":
    pi-materia tests the key for truthiness)."""
    return f"-{seg(s.current_item_key)}" if s.current_item_key else ""


def _next_visit_id(s: CastState, socket_id: str, visit: int) -> str:
    s.dispatch_seq += 1
    return f"{s.cast_id}:{socket_id}:{visit}:{s.dispatch_seq}"


def cast_of_visit(visit_id: str) -> str | None:
    """The cast a visit id (:func:`_next_visit_id`'s ``<cast id>:<socket>:<visit>:<dispatch>``)
    belongs to; None for an id of another shape."""
    parts = visit_id.rsplit(":", 3)
    return parts[0] if len(parts) == 4 and parts[0] else None


def _dispatch_agent(ctx: _Ctx, rs: ResolvedSocket, mode: TurnMode, *, recovery: bool = False, reuse: bool = False,
                    user_driven: bool = False, context_label: str | None = None,
                    opens_visit: bool = False) -> RunAgentTurn:
    s = ctx.s
    facts = facts_of(rs)
    visit = s.visit
    synthetic = prompts.synthetic_context(rs, s, mode=mode) if user_driven else None
    fresh, system_prompt = prompts.socket_prompt_and_suffix(rs, s, mode=mode)
    if reuse and s.active_turn_prompt is not None:
        prompt = s.active_turn_prompt
    elif synthetic is not None:
        prompt = prompts.refinement_turn_prompt(rs, s, synthetic)
    else:
        prompt = fresh
    visit_id = _next_visit_id(s, facts.id, visit)
    s.assign(active_turn_prompt=prompt, active_turn_mode=mode, active_turn_socket_id=facts.id, active_turn_visit=visit,
             awaiting_response=True, socket_state="awaiting_agent_response",
             pending=built(Pending, kind="agent_turn", visit_id=visit_id, socket_id=facts.id, visit=visit, mode=mode,
                                   user_driven=user_driven))
    label = context_label if context_label else ("" if mode == "normal" and not recovery else mode)
    suffix = f"-{seg(label)}-{s.dispatch_seq}" if label else ""
    name = f"{seg(facts.id)}{_item_suffix(s)}-{visit}{suffix}.md"
    kind = "context_refinement" if user_driven else "context"
    # the refinement turn a user-driven turn starts, in its manifest entry as in its event (pi-materia)
    turn_field = {"refinementTurn": s.refinement_turn() + 1} if user_driven else {}
    artifact = ctx.write(
        ("contexts", name),
        prompts.context_artifact(rs, s, mode=mode, prompt=prompt, at_iso=ctx.iso()),
        manifest={
            "phase": facts.id,
            "socket": facts.id,
            "materia": facts.materia_name,
            **s.item_fields(),
            "visit": visit,
            "kind": kind,
            **turn_field,
            "materiaModel": facts.materia_model,
        },
    )
    if user_driven:
        ctx.emit("context_refinement", {"socket": facts.id, "materia": facts.materia_name, "artifact": artifact,
                                        **turn_field, **s.item_fields(), "materiaModel": facts.materia_model})
    assert facts.materia is not None
    summary = _turn_summary(facts.materia_name, facts.id, s.current_item_label)
    effect = built(
        RunAgentTurn, visit_id=visit_id, socket_id=facts.id, visit=visit, materia=facts.materia_name or "",
        mode=mode, prompt=prompt, system_prompt=system_prompt, visible_summary=summary,
        model=facts.turn_model, tools=facts.tools,
        thinking=facts.applied_thinking,  # an unknown level is not applied: warned at load
        multi_turn=facts.multi_turn, item_key=s.current_item_key, item_label=s.current_item_label,
        materia_model=facts.materia_model, recovery=recovery, user_driven=user_driven,
        proactive_compaction=not recovery,
        isolated_context=synthetic,
        compaction=s.config.compaction, opens_visit=opens_visit, sent_again=reuse,
    )
    ctx.effects.append(effect)
    return effect


@functools.lru_cache(maxsize=256)  # a function of its arguments alone, the same at every visit of a socket
def _turn_summary(materia_name: str | None, socket_id: str, item_label: str | None) -> str:
    """A turn's visible line (:func:`prompts.cast_summary`) for the socket and item."""
    return prompts.cast_summary(materia_name, socket_id, socket_ordinal_text(socket_id), item_label)


def _utility_input(s: CastState, rs: ResolvedSocket) -> dict[str, Any]:
    it = iteration_for(s.config.pipeline, rs.id)
    cursor = {"name": it.cursor, "index": s.cursors.get(it.cursor, 0)} if it else None
    return {"cwd": s.cwd, "runDir": s.run_dir, "request": s.request, "castId": s.cast_id, "socketId": rs.id,
            "params": rs.socket.params or {}, "state": s.data, "item": s.data.get("item"),
            "itemKey": s.current_item_key, "itemLabel": s.current_item_label, "cursor": cursor,
            "cursors": s.cursors}


def _dispatch_utility(ctx: _Ctx, rs: ResolvedSocket) -> _Dispatched | _Inline:
    s = ctx.s
    sock = rs.socket
    visit = s.visit
    entry_id = f"utility:{rs.id}:{visit}"
    payload = _utility_input(s, rs)
    artifact = ctx.write(("sockets", seg(rs.id), f"{visit}{_item_suffix(s)}.input.json"),
                         json.dumps(payload, indent=2, ensure_ascii=False),
                         manifest={"phase": rs.id, "socket": rs.id, **s.item_fields(), "visit": visit,
                                   "entryId": f"{entry_id}:input"})
    ctx.emit("utility_input", {"socket": rs.id, "artifact": artifact, **s.item_fields(), "visit": visit})
    params = sock.params or {}
    timeout = sock.timeout_ms or DEFAULT_UTILITY_TIMEOUT_MS
    max_bytes = (sock.limits.max_output_bytes if sock.limits and sock.limits.max_output_bytes
                 else DEFAULT_MAX_OUTPUT_BYTES)
    if sock.command:
        visit_id = _next_visit_id(s, rs.id, visit)
        s.pending = Pending(kind="utility", visit_id=visit_id, socket_id=rs.id, visit=visit,
                            command=list(sock.command), timeout_ms=timeout)
        ctx.effects.append(RunUtility(visit_id=visit_id, socket_id=rs.id, visit=visit, command=tuple(sock.command),
                                      params=params, stdin_json=payload, timeout_ms=timeout,
                                      max_output_bytes=max_bytes, cwd=s.cwd,
                                      resources=sock.resources.model_dump() if sock.resources else {}))
        return _Dispatched()
    if "output" in params or sock.utility == "echo":
        return _Inline(echo_output(params), entry_id)
    if sock.utility == "noop":
        return _Inline("", entry_id)
    if sock.utility in IO_BUILTINS:
        visit_id = _next_visit_id(s, rs.id, visit)
        s.pending = Pending(kind="utility", visit_id=visit_id, socket_id=rs.id, visit=visit, timeout_ms=timeout)
        ctx.effects.append(RunUtility(visit_id=visit_id, socket_id=rs.id, visit=visit, builtin=sock.utility,
                                      params=params, stdin_json=payload, timeout_ms=timeout,
                                      max_output_bytes=max_bytes, cwd=s.cwd))
        return _Dispatched()
    raise _Fail(f'Unknown utility alias "{sock.utility}" for socket "{rs.id}".', entry_id)


# =========================================================================== completion


def _complete_socket(ctx: _Ctx, rs: ResolvedSocket, text: str, entry_id: str, *, finalized: bool) -> str:
    """Record, parse, assign, advance and route one socket output. Returns the next target."""
    s = ctx.s
    facts = facts_of(rs)
    sock = facts.socket
    visit = s.visit
    s.assign(pending=None, awaiting_response=False, socket_state="idle")
    if sock.limits and sock.limits.max_output_bytes and len(text.encode("utf-8")) > sock.limits.max_output_bytes:
        raise _Fail(f'Output of socket "{facts.id}" is {len(text.encode("utf-8"))} bytes, over its '
                    f"limits.maxOutputBytes ({sock.limits.max_output_bytes}).", entry_id)
    refinement_turn = s.refinement_turn() if facts.multi_turn else None
    manifest: dict[str, Any] = {"phase": facts.id, "socket": facts.id, "materia": facts.materia_name, **s.item_fields(),
                                "visit": visit, "entryId": entry_id, "kind": "socket_output"}
    if facts.multi_turn:
        manifest.update({"finalized": finalized, "refinementTurn": refinement_turn})
    artifact = ctx.write(("sockets", seg(facts.id), f"{visit}{_item_suffix(s)}.md"), text, manifest=manifest)
    s.last_output = text
    parsed: Any = text
    if facts.is_json:
        try:
            value = extract_json(text)
        except HandoffError as exc:
            raise _Fail(f'Invalid JSON output for socket "{facts.id}": {exc.message}', entry_id) from None
        try:
            validate_handoff(value, facts.id, require_satisfied=requires_satisfied(sock))
        except HandoffError as exc:
            raise _Fail(exc.message, entry_id) from None
        s.last_json = value
        ctx.write(("sockets", seg(facts.id), f"{visit}.json"), json.dumps(value, indent=2, ensure_ascii=False))
        parsed = value
        s.data = apply_envelope(s.data, value, adopt_work_items=facts.is_agent and facts.is_generator)
    try:
        s.data = apply_assign(s.data, sock.assign, Scope(data=s.data, parsed=parsed,
                                                          last_json=s.last_json if s.last_json is not None else MISSING,
                                                          last_output=s.last_output))
    except AssignError as exc:
        raise _Fail(f'socket "{facts.id}": {exc.message}', entry_id) from None
    item_fields = s.item_fields()  # of the completed item (a deliberate difference)
    advance_target = _apply_advance(ctx, rs, parsed, entry_id)
    event: dict[str, Any] = {"socket": facts.id, "materia": facts.materia_name, "type": sock.type, "artifact": artifact,
                             "parsed": facts.is_json, "entryId": entry_id, **item_fields,
                             "materiaModel": facts.materia_model}
    if facts.multi_turn:
        event.update({"finalizedRefinement": finalized, "refinementTurn": refinement_turn})
    ctx.emit("socket_complete", event)
    ctx.write_usage()
    _check_budget(ctx, entry_id)
    if advance_target is not None:
        return advance_target
    try:
        return next_target(facts.id, sock, parsed, s.edge_traversals, s.config.limits)
    except LimitExceeded as exc:
        raise _Fail(exc.message, entry_id) from None


def _apply_advance(ctx: _Ctx, rs: ResolvedSocket, parsed: Any, entry_id: str) -> str | None:
    s = ctx.s
    adv = rs.socket.advance
    if adv is None:
        return None
    scope = Scope(data=s.data, parsed=parsed, last_json=s.last_json if s.last_json is not None else MISSING,
                  last_output=s.last_output)
    if adv.when is not None and adv.when.strip():
        try:
            if not evaluate_condition(adv.when, scope):
                return None
        except ConditionError as exc:
            raise _Fail(f'socket "{rs.id}" advance: {exc.message}', entry_id) from None
    s.cursors[adv.cursor] = s.cursors.get(adv.cursor, 0) + 1
    s.current_item_key = s.current_item_label = None
    # pi-materia resolves the items with no reply of its own: "$" is the last JSON reply (for a
    # JSON socket, this one; for a text socket, the JSON it was handed), as at a socket's start
    items = as_list(resolve_value(adv.items, Scope(data=s.data, parsed=scope.last_json, last_json=scope.last_json,
                                                   last_output=s.last_output)))
    if s.cursors[adv.cursor] < len(items):
        return None
    flag = parsed.get("satisfied") if isinstance(parsed, dict) else None
    return exhaustion_target(s.config.pipeline, rs.id, flag if isinstance(flag, bool) else None)


#: The failed reason of a cast its budget stopped (pi-materia's phrase).
BUDGET_LIMIT_REACHED = "pi-materia budget limit reached"
#: What a recast of such a cast does, for the places that offer one (pi-materia's behaviour).
BUDGET_RECAST_NOTE = ("a recast keeps what the cast spent and the budget it started with, so it stops again after "
                      "its next socket; start a new cast with a higher budget to go further")


def _budget_reached(s: CastState, budget: Budget, result: BudgetCheck) -> str:
    """Which limit ``result`` found reached, and the figure that reached it."""
    reached = []
    if result.over_token:
        reached.append(f"{js_string(s.usage.tokens.total)} tokens of budget.maxTokens {js_string(budget.max_tokens)}")
    if result.over_cost:
        reached.append(f"${s.usage.cost.total:.4f} of budget.maxCostUsd {js_string(budget.max_cost_usd)}")
    return " and ".join(reached)


def _warn_of_a_spent_budget(ctx: _Ctx) -> None:
    """Before a recast: a cast whose spending already reaches a budget that stops it is stopped
    again by the next check (after its next socket, which is paid for). The recast goes ahead, as
    pi-materia's does; the user is told first, with what was spent."""
    s = ctx.s
    budget = s.config.budget
    if budget.max_tokens is None and budget.max_cost_usd is None:
        return
    result = check_budget(budget, s.usage, already_warned=True)
    if result.stop:
        ctx.notify("warning", f"pi-materia budget: cast {s.cast_id} has already reached its budget "
                              f"({_budget_reached(s, budget, result)}): {BUDGET_RECAST_NOTE}")


def _stop_if_the_budget_is_spent(ctx: _Ctx, entry_id: str | None) -> None:
    """A failed turn that is to be tried again (same-socket recovery, or the harness's own retry of a
    transient failure) when the cast's spending, its failed turns' usage included, reaches a limit
    that stops it: the cast stops as at a completed socket (:func:`_check_budget`) instead of paying
    for the retry. A limit that does not stop (``stopAtLimit: false``) is left to the next completion."""
    s = ctx.s
    budget = s.config.budget
    if budget.max_tokens is None and budget.max_cost_usd is None:
        return
    if check_budget(budget, s.usage, already_warned=True).stop:
        _check_budget(ctx, entry_id)


def _check_budget(ctx: _Ctx, entry_id: str | None) -> None:
    s = ctx.s
    budget = s.config.budget
    if budget.max_tokens is None and budget.max_cost_usd is None:
        return  # no limit configured (0 is one): check_budget could neither warn nor stop
    result = check_budget(budget, s.usage, already_warned=s.budget_warned)
    if not (result.warn or result.limit_hit):
        return
    usage = s.usage.model_dump(mode="json", exclude={"turns"}, exclude_none=True)
    if result.warn:
        s.budget_warned = True
        ctx.emit("budget_warning", {"percent": result.percent, "usage": usage})
        shown = f"{result.percent:.0f}%" if result.percent < 10_000 else "over 10000%"  # a 1e300-token report
        ctx.notify("warning", f"pi-materia budget at {shown}")
    if result.limit_hit:
        ctx.emit("budget_limit", {"overToken": result.over_token, "overCost": result.over_cost, "usage": usage})
        # which limit, and the figure that reached it (the failure's reason stays pi-materia's phrase)
        detail = f"{BUDGET_LIMIT_REACHED}: {_budget_reached(s, budget, result)}"
        if result.stop:
            ctx.notify("warning", f"{detail}{usage_caveats(s.usage)}")
            raise _Fail(BUDGET_LIMIT_REACHED, entry_id)
        ctx.notify("warning", f"{detail} (stopAtLimit is false; continuing)")


# =========================================================================== outcome handlers


def _ignored(ctx: _Ctx, kind: str, visit_id: str, reason: str) -> None:
    p = ctx.s.pending
    ctx.emit("outcome_ignored", {"outcome": kind, "visitId": visit_id, "expected": p.visit_id if p else None,
                                 "reason": reason})


def _matches(ctx: _Ctx, kind: str, pending_kind: str, visit_id: str) -> bool:
    s = ctx.s
    if not s.active:
        _ignored(ctx, kind, visit_id, "cast-inactive")
        return False
    if s.pending is None or s.pending.kind != pending_kind or s.pending.visit_id != visit_id:
        _ignored(ctx, kind, visit_id, "not-current-visit")
        return False
    return True


def _on_turn_ended(ctx: _Ctx, ev: TurnEnded) -> None:
    if not _matches(ctx, "turn_ended", "agent_turn", ev.visit_id):
        return
    s = ctx.s
    pending = s.pending
    assert pending is not None
    rs = s.config.pipeline.sockets[pending.socket_id]
    facts = facts_of(rs)
    entry_id = ev.entry_id or ev.visit_id
    # A turn stopped before its provider reported usage (an Esc mid-stream: an OpenAI-style stream
    # gives it at its end) used tokens nobody counted: recorded as reporting none, never as free --
    # and so is one whose stopped message alone reported nothing (its earlier tool-call steps count).
    usage_unknown = ev.stop_reason == "aborted" and (ev.usage is None or stopped_unreported(ev.usage))
    if ev.usage is not None or usage_unknown:
        turn = extract_usage(ev.usage if ev.usage is not None else {})
        # The answer's model fields where it named them, else the selection this turn was asked with
        # (pi-materia's ``{...materiaModel, ...messageModel}``).
        picked = s.usage.modelSelections[-1] if s.usage.modelSelections else {}
        if picked.get("socket") != facts.id:
            picked = {}
        model, provider, api = (ev.model or picked.get("model"), ev.provider or picked.get("provider"),
                                ev.api or picked.get("api"))
        thinking = ev.thinking_level or picked.get("thinking")
        named: dict[str, Any] = {"materia": facts.materia_name, "taskId": s.current_item_key, "model": model,
                                 "provider": provider, "api": api, "thinkingLevel": thinking, "thinking": thinking,
                                 "costFromProvider": cost_from_provider(ev.usage) if ev.usage is not None else None,
                                 **{k: picked.get(k) for k in SELECTION_FIELDS}}
        # Only the fields that name something are given (the rest keep their None default, written
        # the same): a record's set of given fields is kept with it, and a concurrent cast holds a
        # record per turn (bench/casts.py's peak memory per cast).
        unreadable = unreadable_figures(ev.usage) if ev.usage is not None else []
        # Said once per cast (a provider that writes its figures as strings writes every turn so);
        # each turn's record and event name its own.
        first_unreadable = bool(unreadable) and not any(t.unreadable for t in s.usage.turns)
        if unreadable:
            named["unreadable"] = unreadable
        kind = turn_cost_kind(ev.model, ev.provider, ev.api, facts.model)
        not_numbers = [note for note in unreadable if not note.endswith(CAPPED_NOTE)]  # a capped one counts
        unreported = (["tokens"] if usage_unknown
                      else _unreported(turn, ev, not_numbers, kind, named["costFromProvider"]))
        first_unreported = [f for f in unreported if not any(f in (t.unreported or ()) for t in s.usage.turns)]
        if unreported:
            named["unreported"] = unreported
        # A turn that counted nothing (no usage sent) gets the record its fields already have, if a
        # cast holds one (turn_record): concurrent casts of a loadout keep one per socket, not one each.
        s.usage = s.usage.add_turn(turn_record({
            "socket": facts.id, "attempt": max(s.attempt, 1), "tokens": turn.tokens, "cost": turn.cost,
            "costKind": kind, **{k: v for k, v in named.items() if v is not None}}))
        if usage_unknown and not s.usage.costEstimated:
            s.usage = s.usage.estimated()  # as for any turn with no usage
        ctx.write_usage()
        if unreadable:
            ctx.emit("usage_unreadable", {"socket": facts.id, "taskId": s.current_item_key, "figures": unreadable})
        if first_unreadable:
            ctx.notify("warning", _unreadable_warning(facts.id, unreadable))
        if unreported:
            ctx.emit("usage_unreported", {"socket": facts.id, "taskId": s.current_item_key, "figures": unreported})
        _say_unreported(ctx, facts.id, turn, first_unreported, ev.agent)
    elif not s.usage.costEstimated:
        # A turn whose agent reported no usage adds no turn record (it would be all zeros: a
        # deliberate difference, docs/materia.md), but the cast's cost is no longer all billed
        # figures. Once: the report is then unchanged by such turns (its JSON stays cached).
        s.usage = s.usage.estimated()
    if ev.stop_reason == "aborted":
        # The turn was stopped before it answered (the user's Esc, a cancel): a cut-off reply is
        # never an output, a draft or a failure to retry, whatever the socket's kind.
        if pending.user_driven:
            _withdraw_user_turn(ctx, "aborted")
        else:
            _interrupt(ctx, rs, ev)
        return
    failure = ev.error if ev.error else ("unknown agent error" if ev.stop_reason == "error" else None)
    text = (ev.text or "").strip()
    if failure:
        _turn_failure(ctx, rs, failure, entry_id, produced_output=bool(text), agent=ev.agent)
        return
    s.last_entry_id = entry_id
    s.last_assistant_text = text
    if facts.multi_turn and pending.mode != "finalization":
        _record_refinement(ctx, rs, text, entry_id)
        return
    s.multi_turn_finalizing = False
    target = _complete_socket(ctx, rs, text, entry_id, finalized=facts.multi_turn)
    _goto(ctx, target, entry_id)


#: The values of a figure that stand for a number that is not finite: JSON's names as Python
#: writes them, and as strings (how the Pi extension sends them, :func:`plain_usage`).
_NOT_FINITE_VALUES = frozenset({"NaN", "Infinity", "-Infinity", '"NaN"', '"Infinity"', '"-Infinity"'})


def _what_is_wrong(note: str) -> str:
    """What is wrong with the figure of an unreadable note (``name=value``, the value as JSON):
    ``negative``, ``not finite`` (NaN, an infinity, also written as a string), or ``not a number``
    (a string, a list, a map, a bool...)."""
    value = note.partition("=")[2]
    if value in _NOT_FINITE_VALUES:
        return "not finite"
    if len(value) > 1 and value[0] == "-" and value[1].isdigit():
        return "negative"
    return "not a number"


def _unreadable_warning(socket: str, unreadable: list[str]) -> str:
    """The cast's one warning of a turn's unreadable figures: those given but not usable count as
    not reported, each group named by what is wrong with it (negative, not finite, not a number),
    those past 10^18 (:data:`CAPPED_NOTE`) as 10^18."""
    capped = [note for note in unreadable if note.endswith(CAPPED_NOTE)]
    wrong: dict[str, list[str]] = {}
    for note in unreadable:
        if not note.endswith(CAPPED_NOTE):
            wrong.setdefault(_what_is_wrong(note), []).append(note)
    said = []
    if wrong:
        groups = [f"{'not numbers' if what == 'not a number' else what} ({', '.join(notes)})"
                  for what, notes in wrong.items()]
        listed = groups[0] if len(groups) == 1 else f"{', '.join(groups[:-1])} and {groups[-1]}"
        said.append(f"has figures that are {listed}; they count as not reported, "
                    "so the cast's totals and its budget leave them out")
    if capped:
        said.append(f"{'and ' if said else 'has '}figures past what castor counts ({', '.join(capped)}); each "
                    "counts as 10^18, so a budget stops on it")
    return f"pi-materia usage: the usage reported for {socket}'s turn {'; '.join(said)} (usage.json turns[].unreadable)"


def _unreported(turn: TurnUsage, ev: TurnEnded, unreadable: list[str], kind: str,
                from_provider: bool | None) -> list[str]:
    """What an answered turn's usage left out without saying so: ``tokens`` when it counts none (a
    provider that sent no usage, or one in a form the agent that answered does not read: Pi reports
    zeros), and ``cost`` when it counts tokens at no cost that is not the provider's billed figure (a
    model with no price in the agent's catalog). A stopped or failed turn may truly have used nothing; a
    figure that was given but not a number is named in ``unreadable`` instead."""
    if ev.stop_reason in ("aborted", "error") or ev.error or unreadable:
        return []
    if turn.tokens.total == 0:
        return ["tokens"]
    if turn.cost.total == 0 and from_provider is not True and kind != "subscription":
        return ["cost"]
    return []


def _tokens_text(total: float | int) -> str:
    """``N tokens`` as a warning says it; a count that is not a whole number (a provider's
    fractional figure, counted as given) is shown as given and said to be so."""
    if isinstance(total, float) and not total.is_integer():
        return f"{js_string(total)} tokens (not a whole number: the count as reported)"
    return f"{js_string(total)} tokens"


def _say_unreported(ctx: _Ctx, socket: str, turn: TurnUsage, first: list[str], agent: str | None = None) -> None:
    """Said once per cast for each kind of figure a turn left out, where a budget limit then cannot
    count it (usage.json ``turns[].unreported`` names every such turn, and the cast's end notice
    and status count them): no tokens, a warning; tokens at no cost, a notice. ``agent`` names what
    answered (``TurnEnded.agent``: "scripted agent (answers.json)", "Pi agent"...)."""
    budget = ctx.s.config.budget
    if "tokens" in first and turn.tokens.total and (budget.max_tokens is not None or budget.max_cost_usd is not None):
        ctx.notify("warning", f"pi-materia usage: {socket}'s turn was stopped before its last message reported "
                              f"usage: its earlier steps' {_tokens_text(turn.tokens.total)} count, that "
                              "message's cannot, so the cast's totals and its budget leave them out "
                              "(usage.json turns[].unreported)")
    elif "tokens" in first and (budget.max_tokens is not None or budget.max_cost_usd is not None):
        source = f"the answer of the {agent}" if agent else "its answer"
        ctx.notify("warning", f"pi-materia usage: {socket}'s turn reported no token counts ({source} carried no "
                              "usage castor reads), so the cast's totals and its budget cannot count it, nor any "
                              "later turn without usage (usage.json turns[].unreported; the cast's end counts "
                              "them)")
    if "cost" in first and budget.max_cost_usd is not None:
        # a notice, not a warning: the bundled budget has a maxCostUsd, and a model with no price
        # (a local one) is common -- every cast on it would warn
        ctx.notify("info", f"pi-materia usage: {socket}'s turn used {_tokens_text(turn.tokens.total)} at no "
                              "reported cost (the model has no price), so budget.maxCostUsd "
                              f"(${budget.max_cost_usd:g}) cannot count it (usage.json turns[].unreported)")


def _interrupt(ctx: _Ctx, rs: ResolvedSocket, ev: TurnEnded) -> None:
    """castor's own turn was stopped before it answered: the cast waits at the same socket.

    Nothing of the turn is kept as output (no artifact, no draft, no JSON parse, no retry); its
    usage was recorded by the caller. Drafts, data, counters, the visit and the turn's prompt stay
    as they were, so ``continue`` (or ``recast``) re-runs exactly that turn under a new visit id.
    """
    pending = ctx.s.pending
    assert pending is not None
    _stop_as_interrupted(ctx, rs, reason="aborted", text_discarded=bool((ev.text or "").strip()))
    if ev.usage is not None:
        _check_budget(ctx, ev.entry_id or pending.visit_id)  # its usage counts: a stopping limit still stops


def _stop_as_interrupted(ctx: _Ctx, rs: ResolvedSocket, *, reason: str, text_discarded: bool) -> None:
    """What castor waits for at this socket was stopped by the user (``reason``: ``aborted``, an
    Esc during the turn; ``compaction_cancelled``, an Esc during the recovery compaction before its
    retry): nothing pending, the cast ``interrupted`` at the same socket, ``continue`` re-runs the turn."""
    s = ctx.s
    pending = s.pending
    assert pending is not None and not pending.user_driven
    s.pending = None
    s.awaiting_response = False
    s.socket_state = "interrupted"
    s.last_message = (f"The turn of {rs.id} was interrupted; run {_cmd(s, 'continue')} to run it again, or "
                      f"{_cmd(s, 'abort')} to stop the cast.")
    ctx.emit("turn_interrupted", {"socket": rs.id, "materia": rs.materia_name, "visitId": pending.visit_id,
                                  "visit": pending.visit, "mode": pending.mode, "reason": reason,
                                  "textDiscarded": text_discarded, **s.item_fields()})
    ctx.notify("warning", f"{rs.materia_name} ({rs.id}): the turn was interrupted and nothing of it was kept. "
                          f"Run {_cmd(s, 'continue')} to run it again, or {_cmd(s, 'abort')} to stop the cast.")


def _rerun_interrupted(ctx: _Ctx, by: str) -> None:
    """Run the interrupted turn again: same socket, visit, mode and prompt; a new visit id."""
    s = ctx.s
    rs = s.socket
    mode = s.active_turn_mode if s.active_turn_socket_id == rs.id else ("refinement" if rs.multi_turn else "normal")
    s.multi_turn_finalizing = mode == "finalization"
    ctx.emit("turn_resumed", {"socket": rs.id, "materia": rs.materia_name, "visit": s.visit, "mode": mode, "by": by,
                              **s.item_fields()})
    s.last_message = f"Running {rs.id} again after its interrupted turn."
    _dispatch_agent(ctx, rs, mode, reuse=s.active_turn_socket_id == rs.id and s.active_turn_visit == s.visit,
                    context_label=f"resume-{by}")


def _record_refinement(ctx: _Ctx, rs: ResolvedSocket, text: str, entry_id: str) -> None:
    s = ctx.s
    ckey = refinement_counter_key(rs.id, s.current_item_key, s.visit)
    turn = s.multi_turn_refinements.get(ckey, 0) + 1
    s.multi_turn_refinements[ckey] = turn
    s.pending = None
    s.awaiting_response = False
    s.multi_turn_finalizing = False
    s.socket_state = "awaiting_user_refinement"
    artifact = ctx.write(("sockets", seg(rs.id), f"{s.visit}{_item_suffix(s)}.refinement-{turn}-{seg(entry_id)}.md"),
                         text, manifest={"phase": rs.id, "socket": rs.id, "materia": rs.materia_name,
                                         **s.item_fields(), "visit": s.visit, "entryId": entry_id,
                                         "kind": "socket_refinement", "refinementTurn": turn})
    ctx.emit("socket_refinement", {"socket": rs.id, "materia": rs.materia_name, "type": rs.socket.type,
                                   "artifact": artifact, "entryId": entry_id, "refinementTurn": turn,
                                   **s.item_fields(), "materiaModel": _materia_model(rs)})
    s.last_message = f"Paused for refinement on {rs.id}; run {_cmd(s, 'continue')} to finalize."
    ctx.notify("info", f'pi-materia multi-turn socket "{rs.id}" is waiting for refinement; run {_cmd(s, "continue")} '
                       f"to finalize. {rs.materia_name} ({rs.id}) is waiting for your reply.")


def _cmd(s: CastState, verb: str) -> str:
    """The command to ``verb`` this cast on its surface (the harness's acts on the newest cast)."""
    return command(s.surface, verb, s.cast_id, bare_in_harness=True)


#: How the last message of a cast left waiting after a transient transport failure begins: in Pi the
#: harness retries such a turn itself (its next end completes it); a standalone agent does not, and
#: the CLI tells its user so (castor.cli.materia) instead of waiting for a retry nobody makes.
TRANSIENT_WAIT = "Transient transport failure while awaiting"


def _turn_label(mode: str, socket_id: str, item_key: str | None) -> str:
    """pi-materia's ``recoveryDiagnosticLabel``: the turn a recovery message is about, its item key
    JSON-quoted (none for no key or an empty one)."""
    item = f" item {json.dumps(item_key, ensure_ascii=False)}" if item_key else ""
    return f'{mode} turn for socket "{socket_id}"{item}'


def _turn_failure(ctx: _Ctx, rs: ResolvedSocket, message: str, entry_id: str, *, produced_output: bool,
                  agent: str | None = None) -> None:
    s = ctx.s
    pending = s.pending
    assert pending is not None
    who = (agent or "agent").strip() or "agent"
    who = who[0].upper() + who[1:]
    lead = f"{who} turn failed" if produced_output else f"{who} turn failed before producing an assistant response"
    full = f'{lead} for socket "{rs.id}": {message}'
    failure = classify_turn_failure(message, allow_generic=not produced_output)
    s.last_entry_id = entry_id
    if failure == "transient_transport" or failure in RECOVERABLE:
        _stop_if_the_budget_is_spent(ctx, entry_id)  # before a retry, which is paid for
    if failure == "transient_transport":
        s.active = True
        s.awaiting_response = True
        s.socket_state = "awaiting_agent_response"
        s.last_message = (f"{TRANSIENT_WAIT} {_turn_label(pending.mode, rs.id, s.current_item_key)}; "
                          f"preserving active Pi turn: {full}")
        ctx.emit("transient_transport_turn_failure", {"warning": True, "error": full, "entryId": entry_id,
                                                      "socket": rs.id, **s.item_fields(), "mode": pending.mode})
        ctx.notify("warning", f"pi-materia warning: {s.last_message}")
        return
    if failure in RECOVERABLE:
        _recover(ctx, rs, failure, full, entry_id)
        return
    raise _Fail(f"Non-recoverable turn failure for {_turn_label(pending.mode, rs.id, s.current_item_key)} "
                f"(same-socket recovery not attempted): {full}", entry_id)


def _recover(ctx: _Ctx, rs: ResolvedSocket, failure: str, full: str, entry_id: str) -> None:
    s = ctx.s
    pending = s.pending
    assert pending is not None
    mode = pending.mode
    turn = s.refinement_turn() if mode == "refinement" else 0
    key = recovery_key(mode, rs.id, s.current_item_key, pending.visit, turn)
    allowance = allowance_for(s.recovery_allowances.get(key), failure)
    s.recovery_allowances[key] = allowance
    previous = s.recovery_attempts.get(key, 0)
    decision = decide_recovery(failure, previous, allowance)
    allowance_fields = {"originalMaxAttempts": allowance.original_max_attempts,
                        "effectiveMaxAttempts": allowance.effective_max_attempts,
                        "maxAttempts": allowance.effective_max_attempts, "reviveCount": allowance.revive_count}
    common = {"reason": failure, "key": key, "socket": rs.id, **s.item_fields(), "mode": mode}
    if not decision.retry:
        message = (f"Same-socket recovery exhausted for {_turn_label(mode, rs.id, s.current_item_key)} after "
                   f"{previous}/{allowance.effective_max_attempts} attempt(s): {full}")
        s.recovery_exhaustion = RecoveryExhaustion(
            reason=failure, key=key, attempts=previous, original_max_attempts=allowance.original_max_attempts,
            effective_max_attempts=allowance.effective_max_attempts, revive_count=allowance.revive_count,
            failed_reason=message, socket=rs.id, item_key=s.current_item_key, mode=mode, exhausted_at=ctx.at)
        ctx.emit("same_socket_recovery_exhausted", {**common, "attempts": previous, **allowance_fields,
                                                    "error": full, "entryId": entry_id})
        raise _Fail(message, entry_id, preserve=True)
    s.recovery_attempts[key] = decision.attempt
    s.awaiting_response = True
    s.socket_state = "awaiting_agent_response"
    ctx.emit("same_socket_recovery_start", {**common, "attempt": decision.attempt, **allowance_fields, "error": full,
                                            "entryId": entry_id, "visit": pending.visit})
    if decision.compact:
        visit_id = _next_visit_id(s, rs.id, pending.visit)
        s.pending = Pending(kind="compaction", visit_id=visit_id, socket_id=rs.id, visit=pending.visit, mode=mode,
                            recovery_key=key, failure_class=failure, original_error=full, entry_id=entry_id)
        ctx.emit("same_socket_recovery_action_start", {"action": "compact", **common, "attempt": decision.attempt,
                                                       "maxAttempts": allowance.effective_max_attempts,
                                                       "entryId": entry_id})
        ctx.effects.append(Compact(visit_id=visit_id, reason=failure, instructions=COMPACTION_INSTRUCTIONS, key=key,
                                   attempt=decision.attempt))
        return
    _retry(ctx, rs, mode, key, failure, decision.attempt)


def _retry(ctx: _Ctx, rs: ResolvedSocket, mode: TurnMode, key: str, failure: str, attempt: int) -> None:
    s = ctx.s
    allowance = s.recovery_allowances[key]
    _dispatch_agent(ctx, rs, mode, recovery=True, reuse=True, context_label=f"retry-{attempt}")
    ctx.emit("same_socket_recovery_retry", {"reason": failure, "key": key, "attempt": attempt,
                                            "originalMaxAttempts": allowance.original_max_attempts,
                                            "effectiveMaxAttempts": allowance.effective_max_attempts,
                                            "reviveCount": allowance.revive_count,
                                            "maxAttempts": allowance.effective_max_attempts, "socket": rs.id,
                                            "itemKey": s.current_item_key, "mode": mode})
    what = (f"{_turn_label(mode, rs.id, s.current_item_key)} after recoverable {failure} failure "
            f"({attempt}/{allowance.effective_max_attempts}).")
    s.last_message = f"Retrying {what}"
    ctx.notify("warning", f"pi-materia retrying {what}")


def _on_compaction_finished(ctx: _Ctx, ev: CompactionFinished) -> None:
    if not _matches(ctx, "compaction_finished", "compaction", ev.visit_id):
        return
    s = ctx.s
    p = s.pending
    assert p is not None and p.recovery_key is not None
    rs = s.config.pipeline.sockets[p.socket_id]
    attempt = s.recovery_attempts.get(p.recovery_key, 0)
    allowance = s.recovery_allowances[p.recovery_key]
    common = {"action": "compact", "reason": p.failure_class, "key": p.recovery_key, "attempt": attempt,
              "maxAttempts": allowance.effective_max_attempts, "entryId": p.entry_id, "socket": rs.id,
              "itemKey": s.current_item_key, "mode": p.mode}
    if ev.ok:
        data: dict[str, Any] = {**common, "result": compaction_summary(ev.result)}
        if ev.skipped:
            data["skipped"] = ev.skipped  # a host with nothing to compact says so in the record
        ctx.emit("same_socket_recovery_action_complete", data)
        _retry(ctx, rs, p.mode, p.recovery_key, p.failure_class or "context_window", attempt)
        return
    if ev.cancelled:  # the user pressed Esc while the harness compacted: as an Esc during the turn
        ctx.emit("same_socket_recovery_action_cancelled", {**common, "error": ev.error or "cancelled"})
        _stop_as_interrupted(ctx, rs, reason="compaction_cancelled", text_discarded=False)
        return
    error = ev.error or "unknown compaction error"
    ctx.emit("same_socket_recovery_action_failed", {**common, "error": error})
    # pi-materia: the failed action is the retry's error; the cast fails as a failed retry
    label = _turn_label(p.mode, rs.id, s.current_item_key)
    action_error = f"Same-socket recovery action compact failed for {label}: {error}"
    message = f"Same-socket recovery retry failed for {label}: {action_error}. Original failure: {p.original_error}"
    ctx.emit("same_socket_recovery_retry_failed", {"reason": p.failure_class, "key": p.recovery_key,
                                                   "attempt": attempt, "maxAttempts": allowance.effective_max_attempts,
                                                   "error": action_error, "originalError": p.original_error,
                                                   "entryId": p.entry_id, "socket": rs.id,
                                                   "itemKey": s.current_item_key, "mode": p.mode})
    raise _Fail(message, p.entry_id)


def _proactive_common(ctx: _Ctx, decision_data: dict[str, Any]) -> dict[str, Any]:
    s = ctx.s
    p = s.pending
    assert p is not None
    return {**decision_data, "socket": p.socket_id, **s.item_fields(), "visit": p.visit, "mode": p.mode}


def _on_proactive_started(ctx: _Ctx, ev: ProactiveCompactionStarted) -> None:
    """Record the decision; the turn stays pending (it is sent after)."""
    if not _matches(ctx, "proactive_compaction_started", "agent_turn", ev.visit_id):
        return
    ctx.emit("proactive_compaction_start", _proactive_common(ctx, ev.decision.event_data()))


def _on_proactive_finished(ctx: _Ctx, ev: ProactiveCompactionFinished) -> None:
    """``_complete{result}``, or ``_failed{error, warning}`` and a warning
    notification. Never fails the cast: the turn is sent either way, and a later context_window
    error still goes to same-socket recovery. A compaction the user cancelled (Esc) is
    ``_cancelled{error}`` and interrupts the cast at its socket: the turn was never sent, and
    ``continue`` sends it."""
    if not _matches(ctx, "proactive_compaction_finished", "agent_turn", ev.visit_id):
        return
    common = _proactive_common(ctx, ev.decision.event_data())
    if ev.ok:
        ctx.emit("proactive_compaction_complete", {**common, "result": compaction_summary(ev.result)})
        return
    if ev.cancelled:  # the user pressed Esc while the harness compacted: the turn is not sent
        ctx.emit("proactive_compaction_cancelled", {**common, "error": ev.error or "cancelled"})
        pending = ctx.s.pending
        assert pending is not None
        _stop_as_interrupted(ctx, ctx.s.config.pipeline.sockets[pending.socket_id], reason="compaction_cancelled",
                             text_discarded=False)
        return
    error = ev.error or "unknown compaction error"
    ctx.emit("proactive_compaction_failed", {**common, "error": error, "warning": True})
    p = ctx.s.pending
    assert p is not None
    label = _turn_label(p.mode, p.socket_id, ctx.s.current_item_key)
    ctx.s.last_message = (f"Proactive compaction failed before {label}; continuing turn so same-socket recovery "
                          f"can handle any later context-window failure: {error}")
    ctx.notify("warning", f"pi-materia warning: {ctx.s.last_message}")


def _on_utility_finished(ctx: _Ctx, ev: UtilityFinished) -> None:
    if not _matches(ctx, "utility_finished", "utility", ev.visit_id):
        return
    s = ctx.s
    p = s.pending
    assert p is not None
    rs = s.config.pipeline.sockets[p.socket_id]
    entry_id = f"utility:{rs.id}:{p.visit}"
    if ev.spawn_error:
        raise _Fail(f'Utility command failed to start for socket "{rs.id}": {ev.spawn_error}', entry_id)
    if p.command is not None:
        base = f"{p.visit}{_item_suffix(s)}.command"
        entry = {"phase": rs.id, "socket": rs.id, **s.item_fields(), "visit": p.visit}
        out_a = ctx.write(("sockets", seg(rs.id), f"{base}.stdout.txt"), ev.stdout,
                          manifest={**entry, "entryId": f"{entry_id}:command:stdout"})
        err_a = ctx.write(("sockets", seg(rs.id), f"{base}.stderr.txt"), ev.stderr,
                          manifest={**entry, "entryId": f"{entry_id}:command:stderr"})
        max_bytes = (rs.socket.limits.max_output_bytes if rs.socket.limits and rs.socket.limits.max_output_bytes
                     else DEFAULT_MAX_OUTPUT_BYTES)
        ctx.write(("sockets", seg(rs.id), f"{base}.json"),
                  json.dumps({"stdoutArtifact": out_a, "stderrArtifact": err_a, "stdoutTruncated": ev.stdout_truncated,
                              "stderrTruncated": ev.stderr_truncated, "maxBytes": max_bytes}, indent=2),
                  manifest={**entry, "entryId": f"{entry_id}:command:meta"})
        ctx.emit("utility_command", {"socket": rs.id, "command": p.command, "code": ev.exit_code,
                                     "signal": ev.signal, "timedOut": ev.timed_out, "timeoutMs": p.timeout_ms,
                                     "stdoutArtifact": out_a, "stderrArtifact": err_a,
                                     "stdoutTruncated": ev.stdout_truncated, "stderrTruncated": ev.stderr_truncated})
        # pi-materia's wording: the command as its JSON-quoted arguments, a signal as "code signal X"
        cmd = " ".join(json.dumps(part, ensure_ascii=False) for part in p.command)
        if ev.timed_out:
            raise _Fail(f'Utility command timed out for socket "{rs.id}" after {p.timeout_ms:g}ms: {cmd}. '
                        f"stdout: {out_a}; stderr: {err_a}", entry_id)
        if ev.exit_code != 0:
            summary = js_slice(js_collapse_whitespace(ev.stderr), STDERR_SUMMARY_UNITS) or "<empty>"
            if ev.stderr_truncated:
                summary += " (truncated)"
            how = ev.exit_code if ev.exit_code is not None else f"signal {ev.signal or 'unknown'}"
            raise _Fail(f'Utility command failed for socket "{rs.id}": {cmd} exited with code {how}. '
                        f"stderr: {summary}. stdout: {out_a}; stderr: {err_a}", entry_id)
        limit = rs.socket.limits.max_output_bytes if rs.socket.limits else None
        if limit and ev.stdout_truncated:  # the cap is the limit: what was kept is at most it
            raise _Fail(f'Output of socket "{rs.id}" is over its limits.maxOutputBytes ({limit}): the command '
                        f"wrote more, and only its first {limit} bytes were kept (stdout: {out_a}).", entry_id)
    elif ev.error or ev.timed_out:
        raise _Fail(f'Utility "{rs.socket.utility}" failed for socket "{rs.id}": '
                    f"{ev.error or 'timed out'}", entry_id)
    target = _complete_socket(ctx, rs, ev.stdout, entry_id, finalized=False)
    _goto(ctx, target, entry_id)


def _on_dispatch_failed(ctx: _Ctx, ev: DispatchFailed) -> None:
    s = ctx.s
    if not s.active or s.pending is None or s.pending.visit_id != ev.visit_id:
        _ignored(ctx, "dispatch_failed", ev.visit_id, "not-current-visit")
        return
    if ev.error_is_the_reason:
        raise _Fail(ev.error, ev.visit_id)
    raise _Fail(f'Could not start {s.pending.kind.replace("_", " ")} for socket "{s.pending.socket_id}": {ev.error}',
                ev.visit_id)


# =========================================================================== commands


#: What the user is told when their refinement turn is withdrawn (``refinement_turn_abandoned``).
_ABANDON_TEXT = {
    "settled_without_end": "the harness never reported the end of your refinement turn",
    "aborted": "your refinement turn was aborted",
    "session_shutdown": "the session shut down during your refinement turn",
    "session_closed": "the session closed during your refinement turn",
    "timed_out": "your refinement turn did not end within the configured bound",
    "superseded": "the end of your previous refinement turn was never reported",
    "restart": "castor restarted during your refinement turn and cannot redo it",
}


def _withdraw_user_turn(ctx: _Ctx, reason: str) -> None:
    """Withdraw the pending user-driven turn: back to paused, drafts and counters untouched.

    Guarantees: the refinement counter is not incremented (the next reply is still turn N+1),
    ``last_assistant_text`` / ``last_output`` / ``data`` are unchanged, and the turn's visit id is no
    longer pending, so its late ``agent_end`` is ``outcome_ignored``. Emits
    ``refinement_turn_abandoned{socket, materia, visitId, visit, reason, refinementTurn, item fields}``
    and a warning notification.
    """
    s = ctx.s
    pending = s.pending
    assert pending is not None and pending.user_driven
    rs = s.config.pipeline.sockets[pending.socket_id]
    turn = s.refinement_turn() + 1
    s.pending = None
    s.awaiting_response = False
    s.multi_turn_finalizing = False
    s.socket_state = "awaiting_user_refinement"
    s.last_message = (f"Refinement turn {turn} on {rs.id} withdrawn ({reason}); reply again, or run "
                      f"{_cmd(s, 'continue')} to finalize.")
    ctx.emit("refinement_turn_abandoned", {"socket": rs.id, "materia": rs.materia_name, "visitId": pending.visit_id,
                                           "visit": pending.visit, "reason": reason, "refinementTurn": turn,
                                           **s.item_fields()})
    ctx.notify("warning", f"{rs.materia_name} ({rs.id}): {_ABANDON_TEXT.get(reason, reason)}; it was withdrawn and "
                          f"the drafts so far are kept. Reply again, or run {_cmd(s, 'continue')} to finalize.")


def _on_refinement_turn_abandoned(ctx: _Ctx, ev: RefinementTurnAbandoned) -> None:
    s = ctx.s
    if not s.active:
        _ignored(ctx, "refinement_turn_abandoned", ev.visit_id, "cast-inactive")
        return
    if not s.user_turn_pending or s.pending is None or s.pending.visit_id != ev.visit_id:
        _ignored(ctx, "refinement_turn_abandoned", ev.visit_id, "not-current-visit")
        return
    _withdraw_user_turn(ctx, ev.reason)


def _on_refinement_turn(ctx: _Ctx, _ev: RefinementTurnStarted) -> None:
    s = ctx.s
    if s.user_turn_pending:
        # A new user run started, so the previous one is over although neither its end nor its
        # settle was reported: that turn can never be answered now.
        _withdraw_user_turn(ctx, "superseded")
    if not s.paused:
        raise _reject(f"pi-materia cast {s.cast_id} is not paused for refinement", "not-paused")
    rs = s.socket
    s.multi_turn_finalizing = False
    _apply_model_settings(ctx, rs, s.visit, refinementTurn=s.refinement_turn() + 1)
    _dispatch_agent(ctx, rs, "refinement", user_driven=True,
                    context_label=f"refinement-{s.refinement_turn() + 1}-{ctx.ts_ms}")


def _on_continue(ctx: _Ctx, _ev: ContinueRequested) -> None:
    s = ctx.s
    if not s.active:
        raise _reject(f"pi-materia cast {s.cast_id} is not active.", "not-active")
    if s.awaiting_response or s.pending is not None:
        raise _reject(f"pi-materia cast {s.cast_id} is already awaiting a Pi agent response.", "awaiting")
    if s.interrupted:
        _rerun_interrupted(ctx, "continue")
        return
    if s.paused:
        rs = s.socket
        s.multi_turn_finalizing = True
        _apply_model_settings(ctx, rs, s.visit, refinementTurn=s.refinement_turn(), finalization=True)
        _dispatch_agent(ctx, rs, "finalization")
        return
    _goto(ctx, s.current_socket_id, None)


def _on_abort(ctx: _Ctx, ev: AbortRequested) -> None:
    s = ctx.s
    if not s.active:
        raise _reject("No active pi-materia cast to abort.", "not-active")
    if s.pending is not None:
        ctx.effects.append(CancelWork(visit_id=s.pending.visit_id, reason="cast_aborted"))
    _fail_cast(ctx, ev.reason, None, aborted=True, aborted_from_elsewhere=ev.from_elsewhere)


def _resume(ctx: _Ctx, previous_failure: str | None) -> None:
    s = ctx.s
    pipeline = s.config.pipeline
    sid = s.current_socket_id if s.current_socket_id in pipeline.sockets else pipeline.entry
    rs = pipeline.sockets[sid]
    s.recovery_exhaustion = None
    s.failed_reason = None
    s.ended_at = None
    s.aborted = False
    s.pending = None
    s.active = True
    s.phase = sid
    s.current_socket_id = sid
    s.last_message = f"Recasting from socket {sid}."
    reuse = (rs.is_agent and s.active_turn_prompt is not None and s.active_turn_socket_id == sid
             and s.active_turn_visit == s.visit and s.visit > 0)
    ctx.emit("cast_recast", {"socket": sid, "materia": rs.materia_name, "type": rs.socket.type,
                             "previousFailure": previous_failure, **s.item_fields(), "visit": s.visit,
                             "reusedActivePrompt": reuse})
    if reuse:
        mode = s.active_turn_mode
        s.multi_turn_finalizing = mode == "finalization"
        _dispatch_agent(ctx, rs, mode, reuse=True, context_label="recast")
        return
    _goto(ctx, sid, None)


def _resume_paused(ctx: _Ctx, previous_failure: str | None, *, notify: bool) -> None:
    """Resume an active cast that waits for the user (after a restart): nothing of castor's was lost,
    so nothing is re-sent; the cast stays paused and (``notify``) the user is told it waits for them."""
    s = ctx.s
    rs = s.socket
    s.last_message = f"Paused for refinement on {rs.id}; run {_cmd(s, 'continue')} to finalize."
    ctx.emit("cast_recast", {"socket": rs.id, "materia": rs.materia_name, "type": rs.socket.type,
                             "previousFailure": previous_failure, **s.item_fields(), "visit": s.visit,
                             "reusedActivePrompt": False, "paused": True})
    if notify:
        ctx.notify("info", f"{rs.materia_name} ({rs.id}) is waiting for your reply. Run {_cmd(s, 'continue')} to "
                           "finalize.")


def _on_recast(ctx: _Ctx, ev: RecastRequested) -> None:
    s = ctx.s
    if s.interrupted:
        if ev.after_restart:  # nothing was lost: the cast still waits for the user's word
            rs = s.socket
            ctx.emit("cast_recast", {"socket": rs.id, "materia": rs.materia_name, "type": rs.socket.type,
                                     "previousFailure": f"{ev.cause or 'runtime restarted'} while the cast was "
                                                        "interrupted",
                                     **s.item_fields(), "visit": s.visit, "reusedActivePrompt": False,
                                     "interrupted": True})
            ctx.notify("info", f"{rs.materia_name} ({rs.id}) is still interrupted. Run {_cmd(s, 'continue')} to run "
                               f"it again, or {_cmd(s, 'abort')} to stop the cast.")
            return
        _rerun_interrupted(ctx, "recast")  # the user asked to go on: one command is enough
        return
    if s.active and not ev.after_restart:
        raise _reject(f"pi-materia cast {s.cast_id} is already running.", "running")
    if s.complete:
        raise _reject(f"pi-materia cast {s.cast_id} is complete and cannot be recast.", "complete")
    if not s.active and not s.failed:
        raise _reject(f"pi-materia cast {s.cast_id} is not failed or aborted (phase: {s.phase}, "
                      f"socket state: {s.socket_state}).", "not-failed")
    previous = s.failed_reason if not s.active else f"{ev.cause or 'runtime restarted'} while the cast was active"
    withdrawn = s.active and s.user_turn_pending
    if withdrawn:
        _withdraw_user_turn(ctx, "restart")  # only the harness runs a user's turn; castor cannot redo it
    if s.active and s.paused:
        _resume_paused(ctx, previous, notify=not withdrawn)  # the withdrawal already told the user
        return
    if s.active and s.pending is not None:
        # The work of the pending visit is redone under a new visit id: the old one must not
        # also run (a utility job still queued behind others, a turn still in flight).
        ctx.effects.append(CancelWork(visit_id=s.pending.visit_id, reason="cast_restarted"))
        if ev.after_restart and ev.command_interrupted and s.pending.kind == "utility":
            _say_the_command_runs_again(ctx, s.pending, ev.cause)
        if ev.after_restart and s.pending.kind == "agent_turn":
            _say_the_turn_runs_again(ctx, s.pending, ev.cause)
    if not s.active:
        _warn_of_a_spent_budget(ctx)
    _resume(ctx, previous)


def _say_the_turn_runs_again(ctx: _Ctx, pending: Pending, cause: str | None) -> None:
    """Castor's turn of ``pending`` was in flight when the cast's actor or its runtime stopped: the
    harness's run of it is stopped (``cast_restarted``) and the re-dispatch sends it again under a new
    visit id. The user is told, with how to stop it: an Esc pressed while the old run was being
    stopped ended only that run, and the turn the harness starts next is the re-sent one."""
    rs = ctx.s.config.pipeline.sockets[pending.socket_id]
    why = cause or "castor's runtime restarted"
    ctx.notify("warning", f"{rs.materia_name} ({rs.id}): {why} while its turn ran, so the turn runs again. "
                          f"Run {_cmd(ctx.s, 'abort')} to stop the cast.")


def _say_the_command_runs_again(ctx: _Ctx, pending: Pending, cause: str | None) -> None:
    """The utility command of ``pending`` started and never ended (killed with its runtime, or
    with its cast's actor): the re-dispatch runs it again from the start, and its side effects may
    happen twice. No utility socket says whether its command may run twice, so the command runs
    again, as pi-materia's recast re-runs it; the user is told which, and why."""
    rs = ctx.s.config.pipeline.sockets[pending.socket_id]
    what = (" ".join(json.dumps(part, ensure_ascii=False) for part in pending.command) if pending.command is not None
            else f'utility "{rs.socket.utility}"')
    why = cause or "its runtime stopped"
    facts = {"socket": rs.id, "visitId": pending.visit_id, "visit": pending.visit, "command": pending.command,
             "utility": rs.socket.utility if pending.command is None else None, "cause": why}
    ctx.emit("utility_interrupted", {key: value for key, value in facts.items() if value is not None})
    ctx.notify("warning", f'Utility command for socket "{rs.id}" was interrupted before it ended ({why}) and runs '
                          f"again from the start: {what}")


def _on_revive(ctx: _Ctx, _ev: ReviveRequested) -> None:
    s = ctx.s
    grant = grant_revive(cast_id=s.cast_id, active=s.active, failed=s.failed, failed_reason=s.failed_reason,
                         exhaustion=s.recovery_exhaustion, allowances=s.recovery_allowances, surface=s.surface)
    ex = s.recovery_exhaustion
    assert ex is not None
    s.recovery_allowances[grant.key] = grant.allowance
    ctx.emit("cast_revive", {"castId": s.cast_id, "exhaustedRecoveryKey": grant.key,
                             "recoveryContext": {"key": grant.key, "socket": ex.socket, "mode": ex.mode,
                                                 "itemKey": ex.item_key},
                             "priorEffectiveMaxAttempts": grant.prior_effective_max_attempts,
                             "increment": grant.increment,
                             "newEffectiveMaxAttempts": grant.allowance.effective_max_attempts,
                             "reviveCount": grant.allowance.revive_count})
    _resume(ctx, s.failed_reason)


def _on_project_moved(ctx: _Ctx, ev: ProjectMoved) -> None:
    """Re-root a cast whose project was moved or copied: its commands run in the project it is
    resumed in (the copy), never in the one it was started in. Nothing else changes."""
    s = ctx.s
    ctx.emit("cast_relocated", {"castId": s.cast_id, "from": {"cwd": s.cwd, "runDir": s.run_dir},
                                "to": {"cwd": ev.cwd, "runDir": ev.run_dir}})
    ctx.notify("info", f"pi-materia cast {s.cast_id} was moved or copied from {s.cwd}: it runs in {ev.cwd} now.")
    s.cwd, s.run_dir, s.artifact_root = ev.cwd, ev.run_dir, ev.artifact_root


_HANDLERS: dict[type, Any] = {
    TurnEnded: _on_turn_ended,
    UtilityFinished: _on_utility_finished,
    CompactionFinished: _on_compaction_finished,
    ProactiveCompactionStarted: _on_proactive_started,
    ProactiveCompactionFinished: _on_proactive_finished,
    DispatchFailed: _on_dispatch_failed,
    RefinementTurnStarted: _on_refinement_turn,
    RefinementTurnAbandoned: _on_refinement_turn_abandoned,
    ContinueRequested: _on_continue,
    AbortRequested: _on_abort,
    RecastRequested: _on_recast,
    ReviveRequested: _on_revive,
    ProjectMoved: _on_project_moved,
}

#: The events that carry a ``surface`` (the user's commands: where the command came from).
_SURFACED = frozenset(cls for cls in _HANDLERS if "surface" in getattr(cls, "model_fields", {}))

__all__ = ["step", "Transition", "CastRejected", "CastState"]
