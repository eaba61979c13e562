"""CastActor: the host of one cast's pure state machine (:func:`castor.domain.materia.engine.step`).

Path ``/root/session/<sid>/cast/<castId>``, restart TRANSIENT under the session's cast
supervisor. Every incarnation:

1. ``claim()``s a new incarnation in the :class:`CastStateStore` (a zombie incarnation can then
   never overwrite the state: its next save is refused and it stops);
2. loads the persisted state — or, on the very first start, applies ``CastStarted``;
3. if the loaded state is *active* and this is a restart (incarnation > 1) or a resume of an
   orphaned cast, applies ``RecastRequested(after_restart=True)``: the engine re-dispatches the
   lost work under a **new** visit id, so a late answer to the old one is ignored (a paused cast
   stays paused; a pending user-driven turn, which only the harness can run, is withdrawn).

Per transition (the one rule that makes casts survive crashes)::

    transition = step(state, event)
    store.save(state + outbox) # BEFORE any effect: state.json is atomic and fenced; the
                               # outbox holds this transition's file effects
    perform(file effects)      # batched: whole files, then ONE manifest rewrite, then ONE
                               # fsynced append of the events, each group in effect order
    perform(other effects, in order)  # turns, utilities, notifications, finish

After ``kill -9`` between the save and the last effect, the next incarnation (or process)
replays the outbox: file writes are redone, events and manifest entries already on disk are
not appended twice, and lost outside work is re-dispatched under a new visit id — after any
utility command the dead runtime left running has been killed (its record in the run dir). A
command that had *ended* is not run again: its slot wrote the outcome into its record before
telling the cast, and the re-dispatch applies that outcome instead (the record is removed once the
outcome is saved; see ``_redo``).

While an incarnation holds an active cast, the storage watches its run directory for ``castor
abort ID``'s request (:meth:`CastStorage.watch_abort_requests`: a stat per poll, nothing per
transition); one made while this runtime holds the cast is applied as the session's own abort
(``AbortRequested``), anything else found there is named to the harness and never applied.

| effect | performed by |
|---|---|
| ``WriteArtifact`` / ``AddManifestEntry`` / ``EmitEvent`` | :class:`CastArtifacts` (atomic files, one manifest rewrite and one fsynced event append per transition) |
| ``RunAgentTurn`` | a TEMPORARY :class:`SocketActor` at ``/root/session/<sid>/socket/<castId>.<seq>`` owns the visit; without a proactive compaction check the cast sends the turn itself (:class:`VisitTurn`) and a turn answered before ``run_turn`` returns needs no actor at all, any other is taken over by its SocketActor at once (an error sending it: that actor's crash, so ``WorkLost``); a user-driven refinement turn waits for the harness's own ``agent_end`` instead (see "User-driven turns") |
| ``RunUtility`` | the shared ``/root/utility/slot-<n>`` pool (:func:`castor.actors.materia.utility_pool.submit_utility`) |
| ``Compact`` | :class:`CompactionCall` through the session's :class:`HostContextPort` (the harness's ``session.compact``) under ``CastEnv.compaction_timeout_s``; its answer is told back as ``CompactionFinished`` — a timeout, an error or a harness without ``session.compact`` (``unknown_method``) is ``ok=False`` and the recovery fails; a standalone agent (no host context) answers ``ok`` with ``skipped: "no host context"`` |
| ``CancelWork`` | stops the visit's SocketActor (which cancels the turn; a harness hears why — ``agent.abort_turn`` with the effect's reason — and nothing waits for the model), stops waiting for its compaction, or kills the utility tree |
| ``Notify`` | ``HarnessLink.ui.notify`` (errors swallowed) |
| ``Finished`` / ``Failed`` | the incarnation stops after the effects (TRANSIENT: not restarted) |

Outcomes (``CastOutcome``) arrive on this actor's handle, which is stable across restarts.
Progress notes (``CastProgress``: a SocketActor's proactive compaction before its turn) are
applied the same way — each one a persisted transition with its events — but the work stays
pending. No harness round trip ever runs on this actor's thread: a compaction that never answers
fails at its deadline, and an abort during one stops waiting at once.
``WorkLost(visit_id)`` (a SocketActor or utility slot died first) re-dispatches through
``RecastRequested(after_restart=True)``; more than :data:`MAX_LOST_IN_A_ROW` losses in a row
fail the cast through ``DispatchFailed`` instead of looping.

User-driven turns: the pending one is read from the state (``Pending.user_driven``), never kept
apart, so it cannot drift from what was saved. The harness answers it (``UserRunEnded``) or the
session actor withdraws it (``WithdrawUserTurn``: the run settled without an end, was aborted, the
session ended); the opt-in bound ``CastEnv.user_turn_timeout_s`` withdraws it too
(``UserTurnExpired``). The visit id of the last withdrawn turn is remembered until a new user turn
starts, so one late ``agent_end`` is applied to *that* id and reported as ``outcome_ignored``.

Failure behaviour: a stale incarnation (fenced) stops without performing anything; an effect
that cannot be started becomes ``DispatchFailed`` (the cast fails, recastable).

Storage faults (``ENOSPC``, ``EDQUOT``, ``EIO``, ``EROFS``, ``EACCES``, ``EPERM``, ``EFBIG``, ``EMLINK``,
``ENAMETOOLONG``, ``EMFILE``, ``ENFILE`` on the state or
an artifact: :data:`castor.adapters.fs.STORAGE_ERRNOS`) are the environment's, and a restart
cannot fix them, so they never crash the incarnation (a crash loop would spend the cast
supervisor's restart intensity in a millisecond). Instead:

| where | outcome |
|---|---|
| a new cast's first save (``on_start``) | nothing of it is kept: the lease is released and the run directory removed (it was never a cast); the starter raises ``storage_unavailable`` (``CastEnv.start_error``) |
| a resumed cast's start (outbox replay) | the incarnation stops; the starter raises ``storage_unavailable``; the saved state is untouched |
| a transition's save | the transition is dropped (nothing of it was performed); the cast is failed once more through ``DispatchFailed`` (reason ``storage unavailable: ...``) if that save still fits, else it stays as last saved (``orphaned`` once the lease is freed); either way recastable |
| a transition's file effects (after its save) | the incarnation stops; the saved outbox is kept, so ``recast`` writes the rest (a new cast's first transition included: its starter was answered once the save was durable, and the cast is then failed or orphaned, recastable, as any running cast) |
| the run directory damaged under a running cast (its ``state.json`` or ``manifest.json`` not a document, a directory where a file goes or the reverse, the directory removed) | as the two rows above, with ``state_corrupt`` (``forbidden`` for a link planted out of it) instead of ``storage_unavailable``, and "repair or remove what was damaged" as the advice: the incarnation stops rather than crash (a restart met the same damage, or started the cast over in a removed directory) or wait (a told message's fault was only logged, and the cast waited for ever) |
| a state castor cannot serialise (its own bug) | as a transition's save, with ``internal`` and "this is a castor bug: report it": stopped once, never a crash loop that re-sends the turn at every restart |
| the engine's step raising on an event (its own bug: the step is pure, so every restart would replay the same work into the same exception) | the same, the message naming the event and the exception |

Every case but a new cast's start (whose caller gets the error, and which leaves no cast) tells the
harness (``ui.notify``, level ``error``) and appends a ``storage_unavailable`` event (``{errno,
path}``) to the cast's ``events.jsonl`` where it still fits; every case answers the ask in flight
with ``storage_unavailable`` and stops the incarnation normally (lease released).
Any other ``OSError`` is still a crash, and the restart resumes from the saved state -- except at
a start, where a run directory damaged underneath (a link planted out of it: ``forbidden``; a
directory or FIFO where a file goes: ``forbidden`` / ``state_corrupt``) is permanent like a corrupt
state: the incarnation stops and the starter raises it, instead of a crash loop.

A cast resumed from another run directory than its state names (its project moved or copied) is
re-rooted by a ``ProjectMoved`` transition first (:func:`moved_to`): its commands run where it is.
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import errno
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from castor import tree
from castor._log import logger
from castor.actors.materia.activity import cast_activity
from castor.actors.materia.compaction_call import CompactionCall
from castor.actors.materia.messages import (
    AbortRequestFound,
    CastApply,
    CastOutcome,
    CastProgress,
    CastStatusQuery,
    PerformSavedStart,
    UserRunEnded,
    UserTurnContextQuery,
    UserTurnExpired,
    WithdrawUserTurn,
    WorkLost,
    answer_fields,
)
from castor.actors.materia.socket_actor import (
    COMPACTION_TIMEOUT_S,
    SOCKET_VISIT_RESTARTS,
    SOCKET_VISITS,
    USAGE_TIMEOUT_S,
)
from castor.actors.materia.views import saved_state, status_view
from castor.domain.materia.budget import usage_file_text_json, usage_state_json
from castor.domain.materia.cast_messages import (
    EFFECT_ADAPTER,
    AbortRequested,
    AddManifestEntry,
    CancelWork,
    CastStarted,
    Compact,
    CompactionFinished,
    DispatchFailed,
    EmitEvent,
    Failed,
    Finished,
    Notify,
    ProactiveCompactionFinished,
    ProactiveCompactionStarted,
    ProjectMoved,
    RecastRequested,
    RefinementTurnAbandoned,
    RunAgentTurn,
    RunUtility,
    TurnEnded,
    UtilityFinished,
    WriteArtifact,
    emit_event_json,
    event_data_json,
)
from castor.domain.materia.engine import CONFIG_FILE, Transition, resolved_config_text, step
from castor.domain.materia.memo import derived
from castor.domain.materia.state import CastState, short_label
from castor.domain.materia.surface import command
from castor.messages.errors import (
    CastorError,
    Conflict,
    Forbidden,
    Internal,
    InvalidMessage,
    NotFound,
    StorageUnavailable,
)
from castor.ports.agent import AgentPort
from castor.ports.cast_storage import (
    STATE_TOO_LARGE,
    CastFiles,
    CastHold,
    CastStorage,
    CastStore,
    StateCorrupt,
    StateTooLarge,
)
from castor.ports.host_context import CompactionOutcome, CompactionRequest, HostContextPort, NoHostContext
from castor.supervision import Actor, CancelToken, ChildSpec, handles

MAX_LOST_IN_A_ROW = 3
OUTBOX_KEY = "outbox"  # the last transition's file effects, saved with the state (see _replay_outbox)
_OUTBOX_OPEN = f',"{OUTBOX_KEY}":['.encode()
_STATE_SERIALIZER = CastState.__pydantic_serializer__
_NOT_IN_BODY = {"config"}  # spliced in from its cached JSON (see _encode)
# The usage report is spliced in from its own JSON, derived once per report (see _encode), between
# the fields before it and those after it, so the body is what the state's serialiser writes.
_STATE_FIELDS = tuple(CastState.model_fields)
_AFTER_USAGE = tuple(name for name in _STATE_FIELDS[_STATE_FIELDS.index("usage") + 1:] if name not in _NOT_IN_BODY)
_NOT_IN_BODY_NOR_USAGE = {"usage", *_NOT_IN_BODY}
_USAGE_OPEN = b',"usage":'
FILE_EFFECTS = (WriteArtifact, EmitEvent, AddManifestEntry)
# OSErrors of a run directory damaged under a running cast (not the disk's): a directory where a
# file goes or the reverse, the directory removed. A restart would meet them again: the cast stops.
_DAMAGE = (IsADirectoryError, NotADirectoryError, FileExistsError, FileNotFoundError)
# An outbox WriteArtifact of config.resolved.json saved without its text: the text is a function
# of the state's config (saved in the same document), so it is not encoded twice (see _encode).
FROM_CONFIG_KEY = "content_from_config"
_WRITE_SERIALIZER = WriteArtifact.__pydantic_serializer__
_NO_CONTENT = {"content"}
_FROM_CONFIG_CLOSE = f',"{FROM_CONFIG_KEY}":true}}'.encode()
# The outbox entry of a usage.json write, around its content's JSON string (WriteArtifact's fields
# in order, as its serialiser writes them: see _outbox_json).
USAGE_FILE = ("usage.json",)
_USAGE_WRITE_OPEN = b'{"kind":"write_artifact","path":["usage.json"],"content":'
_USAGE_WRITE_CLOSE = b',"manifest":null}'
SESSION_ENTRY_TYPE = "pi-materia-cast-state"
#: The harness footer entry of a session's casts: pi-materia's one ``materia`` entry while a session
#: runs one cast at a time (the default), one ``materia-<id>`` entry per cast where it may run several
#: at once (each would overwrite the others' in a shared entry). What an ended cast leaves there:
FOOTER_DONE, FOOTER_FAILED = "done", "failed"


def footer_key(cast_id: str, *, shared: bool) -> str:
    """The footer entry of cast ``cast_id``: ``materia`` when the session's casts share one."""
    return "materia" if shared else f"materia-{cast_id}"
CONTEXT_ENTRY_TYPE = "pi-materia-context"  # one per prompt castor sends (pi-materia's entry)


@dataclass
class CastEnv:
    """Everything a CastActor needs from outside; shared by all incarnations of one cast."""

    cast_id: str
    artifact_root: Path  # resolved (Runtime.artifact_root_for)
    session_path: str
    registry: Any  # castor.supervision.registry.Registry
    agent: AgentPort | None
    storage: CastStorage  # the cast's state, artifacts, lease and command records (castor.ports.cast_storage)
    ui: Any = None  # SessionUiPort | None
    session_log: Any = None  # SessionMirror | None (never a blocking SessionPort: see session_mirror.py)
    start_event: CastStarted | None = None  # None: resume a persisted cast
    resume_active: bool = False  # first incarnation re-dispatches an active (orphaned) cast
    lease: CastHold | None = None
    spawn_child: Callable[[ChildSpec, str], Any] | None = None  # (spec, under) -> handle
    clock: Callable[[], float] = time.time
    user_turn_timeout_s: float | None = None  # opt-in bound on a user-driven turn (RuntimeSettings)
    extras: dict[str, Any] = field(default_factory=dict)
    # The status view right after a new cast's start, set by its first incarnation's on_start;
    # the starter reads it once spawn has returned (spawn waits for on_start), instead of an ask,
    # and drops it (a live cast does not hold its start's view, ~4 KB, for its life).
    started_view: dict[str, Any] | None = None
    host_context: HostContextPort | None = None  # None: a standalone agent, no host context
    compaction_timeout_s: float = COMPACTION_TIMEOUT_S
    usage_timeout_s: float = USAGE_TIMEOUT_S
    status_key: str = ""  # the harness footer entry (footer_key); "" -- the cast's own
    # Why the last incarnation's start ended without a running cast (storage_unavailable): the
    # starter (SessionActor) raises it once spawn has returned. None: started, or crashed.
    start_error: CastorError | None = None
    # The session's project directory: what a storage error's path is shown relative to when the
    # cast has neither a start event nor a loaded state yet (a recast whose first save fails).
    project: str | None = None
    # When this runtime went to take the cast (before its lease): a ``castor abort`` request older
    # than this was not made while the cast was held here, and is never applied (abort_requests).
    held_since: float = field(default_factory=time.time)

    @property
    def socket_supervisor(self) -> str:
        return f"{self.session_path}/socket"

    @property
    def host(self) -> HostContextPort:
        """The session's host context; a standalone session has none and says so (NoHostContext)."""
        return self.host_context if self.host_context is not None else _NO_HOST_CONTEXT


_NO_HOST_CONTEXT = NoHostContext()


def moved_to(state: CastState, run_dir: str, artifact_root: str, at: float) -> ProjectMoved | None:
    """``ProjectMoved`` when the cast is now at ``run_dir`` but its state names another run
    directory (its project was moved or copied), else None. Its project directory moves with it:
    the run directory's place inside the project is kept (``<project>/.pi/pi-materia/<id>`` ->
    ``<copy>/.pi/pi-materia/<id>``)."""
    if state.run_dir == run_dir:
        return None
    inside = os.path.relpath(state.run_dir, state.cwd) if state.cwd and state.run_dir else ""
    if inside.startswith("..") or os.path.isabs(inside) or not inside or inside == ".":
        raise StateCorrupt(f"cast {state.cast_id}'s state names run directory {state.run_dir} outside its "
                           f"project {state.cwd}", data={"cast_id": state.cast_id, "path": run_dir})
    if not run_dir.endswith(os.sep + inside):
        raise StateCorrupt(f"cast {state.cast_id} was moved to {run_dir}, where its project directory cannot be "
                           f"told (its run directory was {inside} inside {state.cwd})",
                           data={"reason": "project_moved", "cast_id": state.cast_id, "path": run_dir})
    cwd = run_dir[:-len(os.sep + inside)] or os.sep
    return ProjectMoved(cwd=cwd, run_dir=run_dir, artifact_root=artifact_root, at=at)


class CastActor(Actor):
    @property
    def start_on_caller(self) -> bool:  # type: ignore[override]  # Actor's class flag; a cast decides per incarnation
        """A new cast's first incarnation starts on its starter's thread (the SessionActor's
        handler, inside ``spawn``): its ``on_start`` — the claim, the first save, the view the
        starter answers with — never blocks and never asks its starter, so ``cast.start`` crosses
        no thread to run it and waits for no loop thread to report back; the loop thread is handed
        the rest: the first transition's effects (its files, the first visit: see ``_commit``),
        then the first outcome. A restart or a resume (outbox replay, killing a recorded command)
        starts on a loop thread as before: its starter is a supervisor, which must not run it."""
        return self.env.start_event is not None and self.incarnation == 1

    def __init__(self, env: CastEnv) -> None:
        super().__init__()
        self.env = env
        self.state: CastState | None = None
        self.fence = 0
        self._sockets: dict[str, Any] = {}  # visit_id -> SocketActor handle
        self._visit_tallies: tuple[Callable[[], object], Callable[[], object]] | None = None  # see _count_visit
        self._withdrawn_user_turn: str | None = None  # the last withdrawn user turn (its late end is ignored)
        self._user_turn_timer: CancelToken | None = None
        #: (visit id, monotonic deadline) of the armed user-turn bound, for the activity; None unarmed.
        self.user_turn_deadline: tuple[str, float] | None = None
        self._compactions: dict[str, CompactionCall] = {}  # visit_id -> a recovery compaction in flight
        self._user_turn_context: dict[str, Any] | None = None  # what that turn must tell the model
        self._user_turn_isolated: str | None = None  # that turn's synthetic context (the `context` hook)
        self._lost_in_a_row = 0
        #: the visit whose SocketActor waits for the host's proactive compaction (its turn not sent
        #: yet), for the cast's activity; None otherwise
        self.compacting_visit: str | None = None
        self._done = False
        self._fenced = False
        self._storage_failed = False
        self._unwatch_abort_requests: Callable[[], None] | None = None
        #: a new cast's first transition, saved, its effects left to the loop thread (see _commit)
        self._saved_start: tuple[Transition, list[Any]] | None = None
        # The data texts of the last encoded transition's events, by the event's id (see _outbox_json).
        self._event_data_json: dict[int, tuple[EmitEvent, str]] = {}
        #: False until a new cast's subdirectories are made (with its first files: see _perform_files)
        self._dirs_made = True
        #: the recorded outcome of the command the loaded state waits for (see _redo); None: none
        self._finished_command: UtilityFinished | None = None
        #: the visit whose command a dead runtime (or incarnation) left unfinished: its re-dispatch says so
        self._interrupted_visit: str | None = None

    # ------------------------------------------------------------------ lifecycle
    def on_start(self) -> None:
        self.describe_activity(lambda: cast_activity(self, self._utility_progress))
        try:
            self._start()
            if self.state is not None and self.env.start_event is not None and self.incarnation == 1:
                self.env.started_view = self._status()
            if self.state is not None and self.state.active and not self.is_ending and self._saved_start is None:
                self._watch_abort_requests()  # a start answered first watches on its loop thread (below)
        except (NotFound, StateCorrupt, InvalidMessage, Forbidden) as exc:
            # Permanent: restarting cannot help, and a crash loop would exhaust the cast
            # supervisor's intensity and take the session's other casts down with it. (Forbidden:
            # a link planted in the run directory, refused by its confinement.) The starter
            # raises it.
            self.log.error("cast cannot start: {exc}", exc=exc)
            self.env.start_error = exc
            self._stop()
        except (IsADirectoryError, NotADirectoryError) as exc:  # a directory where a file must be, or so
            self._damaged_at_start(exc, (exc.strerror or type(exc).__name__).lower())
        except StorageUnavailable as exc:  # from _commit (which told the harness), or reading the state
            self.log.error("cast cannot start: {exc}", exc=exc.message)
            self.env.start_error = exc
            self._stop()
            self._discard_unsaved_start()
        except Internal as exc:
            if not self._storage_failed:
                raise
            # _commit's "cannot be saved" (_stopped_on stopped this incarnation): a restart would
            # meet the same state, so the start fails once, typed, and leaves no run directory
            self.env.start_error = exc
            self._discard_unsaved_start()
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a link where a lock file must be (opened O_NOFOLLOW): damaged
                self._damaged_at_start(exc, "is a symbolic link")
                return
            if not self.env.storage.is_storage_fault(exc):
                raise
            self.env.start_error = self._storage_fault(exc, where="start")
            self._discard_unsaved_start()

    def _damaged_at_start(self, exc: OSError, why: str) -> None:
        """The run directory holds something castor cannot use where its own file or directory
        must be: a permanent ``state_corrupt`` start error naming it, never a crash (a restart
        would meet the same and crash-loop the cast supervisor)."""
        self.log.error("cast cannot start: {exc}", exc=exc)
        path = _damaged_path(exc)
        self.env.start_error = StateCorrupt(
            f"cast {self.env.cast_id}'s run directory is damaged: {path} {why}; "
            "restore it, or remove the cast's directory",
            data={"cast_id": self.env.cast_id, "path": str(path)})
        self._stop()

    def _discard_unsaved_start(self) -> None:
        """A new cast whose first state never reached the disk was never a cast: free its lease and
        remove its run directory, so nothing is left to list as unreadable."""
        env = self.env
        if env.start_event is None or self.incarnation != 1:
            return
        if env.lease is not None:
            env.lease.release()
        if env.storage.discard_unsaved(env.artifact_root, env.cast_id):  # kept if a state was saved after all
            self.log.info("removed the run directory of cast {cast}: its first state could not be saved",
                          cast=env.cast_id)

    def _start(self) -> None:
        env = self.env
        self.store: CastStore = env.storage.store(env.artifact_root, resolved=True)
        # A new cast's first incarnation claims without a fence write (its first save makes the
        # document); any later one outranks every earlier incarnation of this process.
        self.fence, stored = self.store.claim_loaded(env.cast_id, at_least=self.incarnation,
                                                     fresh=env.start_event is not None and self.incarnation == 1)
        # After the claim: a new cast's files take the run directory its claim just looked at.
        self.artifacts: CastFiles = self.store.artifacts(env.cast_id)
        if stored.revision == 0:
            if env.start_event is None:
                raise NotFound(f"no persisted state for cast {env.cast_id}", data={"cast_id": env.cast_id})
            # Its sockets/ and contexts/ are made with its first files, after the first save (the
            # replay of a save cut short makes them first too): not on the starter's way to its answer.
            self._dirs_made = False
            self._commit(step(None, env.start_event), answer_first=self.start_on_caller)
            if self._saved_start is None:  # performed here (or stopped): its index row now, not later
                self._index_new_cast()
            if self.state is not None:
                self.log.info("cast {cast} started in {run_dir} (loadout {loadout})", cast=env.cast_id,
                              run_dir=self.state.run_dir, loadout=self.state.config.pipeline.loadout_name)
            return
        self.state = saved_state(stored.state, env.cast_id, env.artifact_root)
        # The command the cast waits for may have ended just before the runtime that ran it died,
        # its outcome recorded but not saved: the cast takes that outcome instead of running it again.
        self._finished_command = self._recorded_outcome(self.state)
        # Or it was still running (or was killed with its runtime): it runs again, and the cast says so.
        self._interrupted_visit = self._unfinished_command(self.state) if self._finished_command is None else None
        # A command an earlier runtime (or incarnation) left running is killed before the
        # cast can run it again: never two copies at once. One a cast host started on a cluster
        # cannot be reached from here: the cast's commands wait until its lease has lapsed.
        self._hold_for_cluster_commands(env.storage.cluster_fence_s(self.artifacts.run_dir, env.cast_id))
        env.storage.kill_recorded(self.artifacts.run_dir, env.cast_id,
                                  keep=self._finished_command.visit_id if self._finished_command else None)
        self._replay_outbox(stored.state.get(OUTBOX_KEY) or [])
        moved = moved_to(self.state, str(self.artifacts.run_dir), str(env.artifact_root), env.clock())
        if moved is not None:
            self.log.info("cast {cast} was moved or copied from {old} to {new}: it runs there now",
                          cast=env.cast_id, old=self.state.cwd, new=moved.cwd)
            self._apply(moved)
        if not self.state.active and self.incarnation > 1:
            self._stop()  # restarted after its last transition: the replay above was all that was left
            return
        if self.state.active and (self.incarnation > 1 or env.resume_active):
            self.log.info("resuming active cast after a restart (incarnation {n})", n=self.incarnation)
            cause = None  # a new runtime (or session) brings the cast in: the runtime restarted
            if self.incarnation > 1:  # this runtime restarted the cast's actor after a crash
                failure = self.handle.last_failure
                cause = f"the cast's actor crashed ({failure[0] if failure else 'unknown'}) and was restarted"
            self._redo(RecastRequested(after_restart=True, cause=cause, at=env.clock()))

    def _hold_for_cluster_commands(self, fence_s: float) -> None:
        """Start none of this cast's commands in this runtime's pool for ``fence_s`` from now: a
        command of it that a cast host started on a cluster, and never saw end, may run on until
        then (its host died or was taken for lost before now, and such a command lives at most its
        lease and margin after that). Before, a cast taken up by another runtime (``castor recast``
        on another machine, a serve on this one) ran the command again at once beside it."""
        if fence_s <= 0:
            return
        from castor.actors.materia.utility_pool import pool_of

        try:
            pool = pool_of(self.env.registry)
        except NotFound:
            return  # no utility pool here: nothing of this cast's runs in this runtime
        self.log.warning("cast {cast}: a command a cast host started on a cluster may still run there; its "
                         "commands here wait {s:.0f} s, until that command's lease has lapsed", cast=self.env.cast_id,
                         s=fence_s)
        pool.hold_commands(self.env.cast_id, time.monotonic() + fence_s)

    def _recorded_outcome(self, state: CastState) -> UtilityFinished | None:
        """The outcome recorded for the command ``state`` waits for, if it ended before its runtime
        died (see command_records); None when there is none or it is not one castor wrote."""
        pending = state.pending
        if not state.active or pending is None or pending.kind != "utility":
            return None
        recorded = self.env.storage.finished_command(self.artifacts.run_dir, self.env.cast_id, pending.visit_id)
        if recorded is None:
            return None
        try:
            finished = UtilityFinished.model_validate({**recorded, "kind": "utility_finished"})
        except ValueError:  # not castor's (a planted record): the command runs again, as before
            return None
        return finished if finished.visit_id == pending.visit_id else None

    def _unfinished_command(self, state: CastState) -> str | None:
        """The visit id of the command ``state`` waits for when it started and never ended (its
        record has no outcome: see command_records), else None."""
        pending = state.pending
        if not state.active or pending is None or pending.kind != "utility":
            return None
        started = self.env.storage.interrupted_command(self.artifacts.run_dir, self.env.cast_id, pending.visit_id)
        return pending.visit_id if started else None

    def _redo(self, event: Any) -> None:
        """Apply ``event``; a re-dispatch of the cast's lost work (``RecastRequested`` after a
        restart) whose command ended before its runtime died applies that command's recorded
        outcome instead (it is not run again), with the event's ``surface`` (a user's request:
        where the cast's later texts send the user), and then removes its record. A re-dispatch
        of a command that started and never ended runs it again, marked ``command_interrupted``
        (the engine tells the user)."""
        finished = self._finished_command
        self._finished_command = None
        interrupted, self._interrupted_visit = self._interrupted_visit, None
        pending = self.state.pending if self.state is not None else None
        if (interrupted is not None and isinstance(event, RecastRequested) and event.after_restart
                and pending is not None and pending.visit_id == interrupted):
            event = event.model_copy(update={"command_interrupted": True})
        if (finished is None or not isinstance(event, RecastRequested) or not event.after_restart
                or pending is None or pending.visit_id != finished.visit_id):
            self._apply(event)
            return
        self.log.info("cast {cast}: the command of {visit} ended before its runtime stopped; its recorded outcome is "
                      "taken, the command is not run again", cast=self.env.cast_id, visit=finished.visit_id)
        if event.surface is not None and self.state is not None and event.surface != self.state.surface:
            # The outcome stands in for the user's recast or continue: where it came from still holds,
            # so the cast's later texts name that surface's commands (saved with the outcome).
            self.state = self.state.model_copy(update={"surface": event.surface})
        self._apply(finished)
        self._forget_command(finished.visit_id)

    def _forget_command(self, visit_id: str) -> None:
        """Remove the record of a command whose outcome this incarnation has saved (a save that did
        not happen -- fenced, the storage failing -- keeps it for the next holder)."""
        if self._fenced or self._storage_failed:
            return
        try:
            self.env.storage.forget_command(self.artifacts.run_dir, visit_id)
        except OSError as exc:  # the outcome is saved; a record left is ignored (not the state's visit)
            self.log.debug("the record of {visit} could not be removed: {exc}", visit=visit_id, exc=exc)

    def _stop(self) -> None:
        """End this incarnation after the current message, releasing what it holds now.

        (``stop_self`` ends the loop without ``on_terminate``; the cleanup must not wait for it.)
        """
        self._release("stopped")
        self.stop_self()

    def on_terminate(self, cause: str) -> None:
        self._release(cause)

    def _release(self, cause: str) -> None:
        unwatch, self._unwatch_abort_requests = self._unwatch_abort_requests, None
        if unwatch is not None:
            unwatch()
        if self.state is not None:  # saved, stopped before its first message: its row is still written
            self._index_new_cast()
        self._disarm_user_turn_bound()
        note = getattr(self.env.agent, "note_stop_reason", None)
        for visit_id, handle in list(self._sockets.items()):
            if note is not None and cause == "crashed":
                note(visit_id, "cast_restarted")  # the restart re-sends it under a new visit id
            self._stop_socket(handle)
        self._sockets.clear()
        for call in list(self._compactions.values()):
            call.cancel()
        self._compactions.clear()
        pending = self.state.pending if self.state is not None else None
        if cause != "crashed" and pending is not None and pending.kind == "utility":
            # The cast stops (its session closed, the runtime shuts down) while its command runs:
            # nothing would take the command's outcome and a continue runs it again, so it ends now
            # rather than going on unseen (a crash keeps it: the restart takes its outcome).
            from castor.actors.materia.utility_pool import UTILITY_STOP_GRACE_S, cancel_utility

            cancel_utility(self.env.registry, pending.visit_id, grace_s=UTILITY_STOP_GRACE_S)
        if cause != "crashed" and self.env.lease is not None:
            self.env.lease.release()  # a crash keeps the lease: the restart reuses it

    def _watch_abort_requests(self) -> None:
        """While this incarnation holds the cast, ``castor abort ID`` typed anywhere reaches it:
        the request it leaves in the run directory is judged on the storage's watcher thread
        (:meth:`CastStorage.watch_abort_requests`) and told here -- the same rules whichever
        runtime holds the cast (a ``castor cast``, a ``castor serve``, one a harness embeds)."""
        handle = self.handle

        def tell(message: AbortRequestFound) -> None:
            try:
                handle.tell(message)
            except CastorError:  # this incarnation is gone: the next one watches for itself
                pass

        self._unwatch_abort_requests = self.env.storage.watch_abort_requests(
            self.artifacts.run_dir, self.env.held_since, lambda: tell(AbortRequestFound()),
            lambda line: tell(AbortRequestFound(refused=line)))

    # ------------------------------------------------------------------ handlers
    @handles(AbortRequestFound)
    def _on_abort_request(self, message: AbortRequestFound) -> None:
        """``castor abort ID`` asked this runtime to abort the cast: aborted as by the session's own
        abort (``cast_end`` says aborted, the cast stops here), but the engine's note to the harness
        says the abort came from outside and names the recast there; one found but not applied
        (left from before, not castor's) is named to the harness."""
        if message.refused is not None:
            self._notify(message.refused, "warning")
            return
        if self.state is None or not self.state.active:
            return  # it ended meanwhile: the abort that asked sees how
        self.log.info("cast {cast} aborted by castor abort's request", cast=self.env.cast_id)
        self._apply(AbortRequested(from_elsewhere=True, at=self.env.clock()))  # its Failed effect ends this incarnation

    @handles(CastOutcome)
    def _on_outcome(self, message: CastOutcome) -> None:
        if self.state is None:
            return
        pending = self.state.pending
        if pending is not None and getattr(message.event, "visit_id", None) == pending.visit_id:
            self._lost_in_a_row = 0
        self._sockets.pop(getattr(message.event, "visit_id", ""), None)
        self._compactions.pop(getattr(message.event, "visit_id", ""), None)
        self._apply(message.event)
        if type(message.event) is UtilityFinished:
            self._forget_command(message.event.visit_id)

    @handles(CastProgress)
    def _on_progress(self, message: CastProgress) -> None:
        """A note about work still pending (proactive compaction): persisted like any event, but
        the SocketActor doing the work stays registered and no loss counter is reset."""
        if self.state is None:
            return
        event = message.event
        if isinstance(event, ProactiveCompactionStarted):
            self.compacting_visit = event.visit_id
        elif isinstance(event, ProactiveCompactionFinished):
            self.compacting_visit = None
        self._apply(event)

    @handles(WorkLost)
    def _on_work_lost(self, message: WorkLost) -> None:
        self._sockets.pop(message.visit_id, None)
        s = self.state
        if s is None or not s.active or s.pending is None or s.pending.visit_id != message.visit_id:
            return  # stale: that visit is no longer what the cast waits for
        self._lost_in_a_row += 1
        self.log.warning("work of {visit} lost ({reason}); loss {n} in a row", visit=message.visit_id,
                         reason=message.reason, n=self._lost_in_a_row)
        if self._lost_in_a_row > MAX_LOST_IN_A_ROW:
            self._apply(DispatchFailed(visit_id=message.visit_id, at=self.env.clock(),
                                       error=f"work lost {self._lost_in_a_row} times in a row: {message.reason}"))
            return
        # A command killed under its slot runs again from the start: the engine says so, as after
        # the cast's own restart (utility_interrupted and a warning naming the command).
        interrupted = message.command_started and s.pending.kind == "utility"
        self._apply(RecastRequested(after_restart=True, cause=f"its work was lost ({message.reason})",
                                    command_interrupted=interrupted, at=self.env.clock()))

    @property
    def _user_turn(self) -> str | None:
        """The visit id of the user-driven refinement turn the cast waits for (from the state)."""
        s = self.state
        return s.pending.visit_id if s is not None and s.user_turn_pending and s.pending is not None else None

    @handles(UserRunEnded)
    def _on_user_run_ended(self, message: UserRunEnded) -> str | None:
        """The harness's user run ended: answer the pending user turn, or (``late``) quote the last
        withdrawn one so the engine reports it as ``outcome_ignored``. The visit id quoted, else None."""
        if self.state is None:
            return None
        visit_id = self._withdrawn_user_turn if message.late else self._user_turn
        if visit_id is None:
            return None
        if message.late:
            self._withdrawn_user_turn = None  # one late end at most: the next user run is not it
        self._apply(TurnEnded(visit_id=visit_id, **answer_fields(message), at=self.env.clock()))
        return visit_id

    @handles(WithdrawUserTurn)
    def _on_withdraw_user_turn(self, message: WithdrawUserTurn) -> str | None:
        """Withdraw the pending user turn (its end will never be reported); the visit id, else None."""
        visit_id = self._user_turn
        if visit_id is None:
            return None
        self.log.warning("withdrawing user-driven refinement turn {visit} ({reason})", visit=visit_id,
                         reason=message.reason)
        self._apply(RefinementTurnAbandoned(visit_id=visit_id, reason=message.reason, at=self.env.clock()))
        return visit_id

    @handles(UserTurnExpired)
    def _on_user_turn_expired(self, message: UserTurnExpired) -> None:
        if self._user_turn != message.visit_id:
            return  # that turn ended meanwhile: nothing to bound
        self.log.warning("user-driven refinement turn {visit} did not end within {limit}s; withdrawing it",
                         visit=message.visit_id, limit=self.env.user_turn_timeout_s)
        self._apply(RefinementTurnAbandoned(visit_id=message.visit_id, reason="timed_out", at=self.env.clock()))

    @handles(CastApply)
    def _on_apply(self, message: CastApply) -> dict[str, Any]:
        if self.state is None:
            raise NotFound(f"cast {self.env.cast_id} has no state")
        self._user_turn_context = None
        if self._finished_command is not None or self._interrupted_visit is not None:
            self._redo(message.event)
        else:
            self._apply(message.event)
        view = self._status()
        if self._user_turn_context is not None:  # only a RefinementTurnStarted dispatches a user turn
            view["user_turn"] = self._user_turn_context
        return view

    @handles(CastStatusQuery)
    def _on_status(self, _message: CastStatusQuery) -> dict[str, Any]:
        return self._status()

    @handles(UserTurnContextQuery)
    def _on_user_turn_context(self, _message: UserTurnContextQuery) -> str | None:
        """The synthetic context a pending user-driven turn's transcript is cut to."""
        return self._user_turn_isolated if self._user_turn is not None else None

    # ------------------------------------------------------------------ the one transition rule
    def _apply(self, event: Any) -> None:
        try:
            transition = step(self.state, event)
        except CastorError:
            raise  # CastRejected (and its kin) propagate to the asker; state unchanged
        except Exception as exc:  # noqa: BLE001 - any other is castor's own bug, named below
            # The step is pure: every restart would replay the same work into the same exception,
            # re-sending the turn each time. Stopped once instead, the cast failed for the record.
            raise self._stopped_on(Internal(
                f"cast {self.env.cast_id} could not apply {type(event).__name__}: {type(exc).__name__}: {exc}"),
                where="save") from None
        self._commit(transition)

    def _commit(self, transition: Transition, *, answer_first: bool = False) -> None:
        """Save ``transition`` (state and outbox, durably), then perform its effects.

        ``answer_first``: a new cast's first transition on its starter's thread. Once its save is
        durable the cast exists (its run directory was made at allocation, its state is on disk,
        its outbox holds every file effect), so its effects -- its index row, the files, the first
        visit -- are handed to the cast's loop thread (:class:`PerformSavedStart`, the first message in its
        mailbox: whatever is asked of the cast is answered after them) and the starter answers at
        once. A transition with something to tell the user (``Notify``: a config warning, a start
        that failed) is performed here as before, so the user hears it before the answer.
        """
        if self._fenced or self._storage_failed:
            return
        files = [e for e in transition.effects if type(e) in FILE_EFFECTS]
        try:
            document = self._encode(transition.state, files)
        except ValueError as exc:  # a state castor cannot serialise: its own bug, but never a crash loop
            raise self._stopped_on(Internal(f"the state of cast {self.env.cast_id} cannot be saved: {exc}"),
                                   where="save") from None
        try:
            self.store.save_encoded(self.env.cast_id, document, incarnation=self.fence, index=transition.state)
        except Conflict as exc:
            if (exc.data or {}).get("reason") != "stale_incarnation":
                raise
            self.log.warning("fenced off by a newer incarnation; stopping without side effects")
            self._fenced = True
            self._stop()
            return
        except (OSError, StateCorrupt, Forbidden) as exc:  # the disk, or its state file damaged under it
            raise self._stopped_by(exc, where="save") from None
        had_user_turn = self._user_turn is not None
        self.state = transition.state
        if had_user_turn:  # only a pending user turn can be withdrawn (and have a bound armed)
            self._note_withdrawals(transition)
        if answer_first and not any(type(effect) is Notify for effect in transition.effects):
            self._saved_start = (transition, files)
            self.handle.tell(PerformSavedStart())
            return
        self._perform_transition(transition, files)

    @handles(PerformSavedStart)
    def _on_perform_saved_start(self, _message: PerformSavedStart) -> None:
        saved, self._saved_start = self._saved_start, None
        self._index_new_cast()
        if saved is None:
            return
        if self._unwatch_abort_requests is None and self.state is not None and self.state.active \
                and not self.is_ending:
            # Its abort watch, off the starter's way too: a request left from the start on (its
            # time is after held_since) is still found at the watcher's next poll.
            self._watch_abort_requests()
        self._perform_transition(*saved)

    def _waiting_for_agent(self) -> None:
        """The cast now waits for a turn its SocketActor owns (seconds to minutes with a model; a
        turn answered at once, as a steady run of transitions has them, makes no SocketActor and
        never comes here): what its files object keeps between writes is dropped, and read back
        from the run directory at its next transition (the same bytes: see ``forget_kept``). A
        cast's hibernation, as far as it is cheap: its state stays (reading it back would cost a
        parse and a validation of state.json per turn)."""
        self.artifacts.forget_kept()

    def _index_new_cast(self) -> None:
        """A new cast's index row, which its allocation left for this thread (see allocate_cast_id's
        ``index_later``); nothing once written (or for a cast that was not new here)."""
        if self.env.start_event is not None:
            self.env.storage.index_new_cast(self.env.artifact_root, self.env.cast_id)

    def _perform_transition(self, transition: Transition, files: list[Any]) -> None:
        """Perform a saved transition's effects: its files batched, then the others in order."""
        try:
            self._perform_files(files)
        except (OSError, StateCorrupt, Forbidden, NotFound) as exc:
            # the disk, or an artifact damaged (a manifest not JSON) or removed (NotFound: the run
            # directory removed under the cast, as after an rm -rf)
            raise self._stopped_by(exc, where="files") from None
        for effect in transition.effects:
            if type(effect) not in FILE_EFFECTS:
                self._perform(effect)
        if transition.state.socket_state == "interrupted" and transition.state.interrupted:
            # The footer said which turn runs; now none does until the user acts.
            state = transition.state
            self._set_status(f"materia: interrupted at {state.current_socket_id} — "
                             f"{command(state.surface, 'continue')}")
        elif transition.state.active and transition.state.socket_state == "awaiting_user_refinement" \
                and transition.state.pending is None:
            # Paused for the user (pi-materia's footer: "<materia>:refine"): say so, and what finalizes.
            state = transition.state
            self._set_status(f"materia: {state.current_materia} ({state.current_socket_id}) — refine; "
                             f"{command(state.surface, 'continue')} finalizes")
        self._mirror_contexts(transition)
        self._mirror_to_session()
        if self._done:
            self._stop()

    def _storage_fault(self, exc: OSError, *, where: str) -> CastorError:
        """End this incarnation on a storage fault with a defined, recastable state (see the module
        doc's table); the typed error for the asker (and the starter)."""
        env = self.env
        base = getattr(env.start_event, "cwd", None) or (self.state.cwd if self.state is not None else None) \
            or env.project
        error = env.storage.storage_unavailable(exc, base=base, path=Path(env.artifact_root) / env.cast_id)
        if isinstance(exc, StateTooLarge):  # no storage fixed saves it: say so, and what starts anew
            surface = self.state.surface if self.state is not None else getattr(env.start_event, "surface", None)
            error = StorageUnavailable(f"cast {env.cast_id}'s state has outgrown what castor saves ({exc.strerror}), "
                                       f"so it cannot go on and recasting it cannot help; `{command(surface, 'cast')} "
                                       f"REQUEST` starts a new cast (its artifacts so far stay in "
                                       f"{error.data.get('path')})",
                                       data={**error.data, "reason": STATE_TOO_LARGE, "cast_id": env.cast_id})
        return self._stopped_on(error, where=where)

    def _stopped_by(self, exc: OSError | CastorError, *, where: str) -> CastorError:
        """The typed error for a fault of the cast's storage, the incarnation stopped on it
        (:meth:`_stopped_on`); any other ``OSError`` is raised again as it is (a crash: the restart
        resumes from the saved state)."""
        if isinstance(exc, CastorError):
            return self._stopped_on(exc, where=where)
        if self.env.storage.is_storage_fault(exc):
            return self._storage_fault(exc, where=where)
        if isinstance(exc, _DAMAGE):
            return self._stopped_on(self._damaged(exc), where=where)
        raise exc

    def _damaged(self, exc: OSError) -> StateCorrupt:
        """The typed error for a run directory damaged under a running cast: a directory where a file
        goes, a file where a directory goes, the directory itself removed."""
        path = _damaged_path(exc)
        return StateCorrupt(f"the run directory of cast {self.env.cast_id} is damaged: {exc.strerror or exc}"
                            + (f" ({path})" if path else ""),
                            data={"path": str(path or Path(self.env.artifact_root) / self.env.cast_id)})

    def _stopped_on(self, error: CastorError, *, where: str) -> CastorError:
        """End this incarnation, with a defined, recastable state, on a fault of its storage that a
        restart cannot mend: ``storage_unavailable`` (the disk) or ``state_corrupt`` / ``forbidden``
        (its files damaged or replaced under it). A crash would restart it into the same fault, and a
        fault in the handling of a told message would leave the cast waiting for ever."""
        env = self.env
        self.log.error("{code} ({where}): {message}", code=error.code.value, where=where, message=error.message)
        self._storage_failed = True
        if self.state is None:  # a new cast's first save: the starter reports it, nothing is kept
            self._stop()
            return error
        pending = self.state.pending
        if pending is not None:
            self._cancel(pending.visit_id)  # its outcome could not be saved either
        outgrown = (error.data or {}).get("reason") == STATE_TOO_LARGE  # a failed record would be as large
        if where == "save" and self.state.active and pending is not None and not outgrown:
            # Nothing of the dropped transition ran. Fail the cast for the record, if that still fits.
            try:
                failed = step(self.state, DispatchFailed(visit_id=pending.visit_id, at=env.clock(),
                                                         error=error.message, error_is_the_reason=True))
                files = [e for e in failed.effects if type(e) in FILE_EFFECTS]
                self.store.save_encoded(env.cast_id, self._encode(failed.state, files), incarnation=self.fence,
                                        index=failed.state)
                self.state = failed.state
                self._perform_files(files)
            except Exception as again:  # noqa: BLE001 - the record is best effort: the stop must happen
                self.log.warning("the failed state could not be written either: {exc}", exc=again)
        try:
            note = {"errno": (error.data or {}).get("errno"), "path": (error.data or {}).get("path"),
                    "code": error.code.value}
            if outgrown:  # what status and the listings say instead of a recast that cannot help
                note |= {"reason": STATE_TOO_LARGE, "message": error.message}
            self.artifacts.append_event("storage_unavailable", note)
        except Exception as again:  # noqa: BLE001 - the log is on the same storage: best effort
            self.log.debug("storage_unavailable event not written: {exc}", exc=again)
        mend = "Free space (or fix the storage)" if isinstance(error, StorageUnavailable) else \
            "This is a castor bug: report it" if isinstance(error, Internal) else "Repair or remove what was damaged"
        self._notify(f"pi-materia cast {env.cast_id} stopped: {error.message}." if outgrown else
                     f"pi-materia cast {env.cast_id} stopped: {error.message}. {mend}, then "
                     f"{command(self.state.surface, 'recast', env.cast_id)}.", "error")
        self._set_status(None)
        self._stop()
        return error

    def _note_withdrawals(self, transition: Transition) -> None:
        """Remember a withdrawn user turn (its late end must be ignored, not lost) and drop its bound."""
        for effect in transition.effects:
            if type(effect) is EmitEvent and effect.type == "refinement_turn_abandoned":
                self._withdrawn_user_turn = effect.data.get("visitId")
        if self._user_turn is None:
            self._disarm_user_turn_bound()

    def _encode(self, state: CastState, files: list[Any]) -> list[bytes | memoryview]:
        """The state document (state + outbox) as UTF-8 JSON in pieces (their concatenation is the
        document), reusing the resolved config's JSON.

        The resolved config is immutable and shared (between the states of a cast, and between
        casts started from unchanged config files), so its JSON is derived once per config
        object (:mod:`castor.domain.materia.memo`) and spliced in; the rest is serialised per
        transition by pydantic's own JSON serialiser straight to bytes (what ``model_dump_json``
        returns before decoding it: no intermediate dicts, no str round trip of the document).
        A start's ``config.resolved.json`` goes into the outbox without its text (the config's
        JSON is in the document already; the replay derives the text from it): the first state
        document is about half as large, and its ~30 KB of indented text is not escaped again.
        """
        config = state.config
        config_json = derived(config, "state_json_bytes", lambda: json.dumps(
            config.model_dump(mode="json"), ensure_ascii=False, allow_nan=False).encode("utf-8"))
        # The report's JSON, like the config's, is derived once per report object (a transition
        # with no new turn reuses it; one with a new turn renders that turn's record only).
        body = memoryview(_STATE_SERIALIZER.to_json(state, exclude=_NOT_IN_BODY_NOR_USAGE))
        at = len(body) - 1 - _after_usage_length(state)  # where the report goes: before the fields after it
        # An event's data is encoded once, for its outbox entry and its line (see _perform_files).
        event_json: dict[int, tuple[EmitEvent, str]] = {}
        self._event_data_json = event_json
        outbox = b",".join([_outbox_json(effect, config, event_json) for effect in files])
        # The pieces, not their concatenation: the store joins them once with its header (a state
        # document is tens of KB, and every copy of it is a pass through the CPU's caches).
        return [body[:at], _USAGE_OPEN, usage_state_json(state.usage), body[at:-1], _OUTBOX_OPEN, outbox,
                b'],"config":', config_json, b"}"]

    def _perform_files(self, files: list[Any]) -> None:
        """Perform one transition's file effects, batched; the outcome on disk is the same.

        Whole files first (a path written twice in one transition, like ``usage.json``, is
        written once with its last content), then every manifest entry in order with one
        manifest rewrite, then every event in order with one fsynced append. So every artifact
        exists before an event or manifest entry names it, and after a crash anywhere in here
        the outbox saved with the state redoes the rest without duplicates.
        """
        if not self._dirs_made:  # a new cast's first files: its sockets/ and contexts/ first, made durable
            self.artifacts.create()
            self._dirs_made = True
        writes: dict[str, str | bytes] = {}
        entries: list[dict[str, Any]] = []
        events: list[tuple[str, dict[str, Any], int]] = []
        event_json, self._event_data_json = self._event_data_json, {}
        data_json: list[str | None] = []
        for effect in files:
            if type(effect) is WriteArtifact:
                writes["/".join(effect.path)] = effect.content
                if effect.manifest is not None:
                    entries.append(effect.manifest)
            elif type(effect) is EmitEvent:
                events.append((effect.type, effect.data, effect.ts_ms))
                known = event_json.get(id(effect))  # None: the line encodes the data itself
                data_json.append(known[1] if known is not None and known[0] is effect else None)
            else:
                entries.append(effect.entry)
        self.artifacts.write_transition(writes, entries, events, data_json=data_json)

    def _replay_outbox(self, outbox: list[dict[str, Any]]) -> None:
        """Redo the file effects of the last saved transition that a crash may have cut short.

        Whole-file writes are simply redone; an event or manifest entry already on disk (same
        timestamp, type and data) is not appended again, so replay never duplicates a record.
        """
        if not outbox:
            return
        self.artifacts.create()
        seen_events = {json.dumps(e.model_dump(), sort_keys=True) for e in self.artifacts.read_events().events}
        for raw in outbox:
            if raw.get(FROM_CONFIG_KEY) is True:  # saved without its text: derive it from the saved config
                assert self.state is not None  # loaded before the replay
                raw = {**{k: v for k, v in raw.items() if k != FROM_CONFIG_KEY},
                       "content": resolved_config_text(self.state.config)}
            effect = EFFECT_ADAPTER.validate_python(raw)
            if isinstance(effect, EmitEvent):
                record = {"ts": effect.ts_ms, "type": effect.type, "data": effect.data}
                if json.dumps(json.loads(json.dumps(record)), sort_keys=True) not in seen_events:
                    self.artifacts.append_event(effect.type, effect.data, ts_ms=effect.ts_ms)
            elif isinstance(effect, WriteArtifact):
                self.artifacts.write_relative("/".join(effect.path), effect.content)
                if effect.manifest is not None:
                    self._add_manifest_once(effect.manifest)
            elif isinstance(effect, AddManifestEntry):
                self._add_manifest_once(effect.entry)

    def _add_manifest_once(self, entry: dict[str, Any]) -> None:
        try:
            entries = self.artifacts.read_manifest().get("entries") or []
        except NotFound:
            s = self.state
            assert s is not None
            self.artifacts.init_manifest(request=s.request, config_source=s.config_source)
            entries = []
        if entry not in entries:
            self.artifacts.add_manifest_entry(entry)

    def _status(self) -> dict[str, Any]:
        assert self.state is not None
        view = status_view(self.state, live=True)
        view["user_turn_visit_id"] = self._user_turn
        return view

    # ------------------------------------------------------------------ effects
    def _perform(self, effect: Any) -> None:
        """Perform one effect that is not a file effect (those go through :meth:`_perform_files`)."""
        kind = type(effect)
        if kind is Notify:
            self._notify(effect.message, effect.level)
        elif kind is RunAgentTurn:
            self._run_agent_turn(effect)
        elif kind is RunUtility:
            self._run_utility(effect)
        elif kind is Compact:
            self._compact(effect)
        elif kind is CancelWork:
            self._cancel(effect.visit_id, effect.reason)
        elif kind is Finished:
            self._done = True
            self.log.info("cast {cast} complete", cast=effect.cast_id)  # the runtime's log says how casts end
            self._set_status(FOOTER_DONE)
        elif kind is Failed:
            self._done = True
            state = self.state
            self.log.info("cast {cast} {how} at {socket}: {reason}", cast=effect.cast_id,
                          how="aborted" if effect.aborted else "failed", reason=effect.reason,
                          socket=(state.current_socket_id if state is not None else None) or "-")
            # pi-materia's footer after a cast: "done", "failed", and nothing after an abort.
            self._set_status(None if effect.aborted else FOOTER_FAILED)

    def _dispatch_failed(self, visit_id: str, error: str) -> None:
        # Told, not applied inline: effects of the current transition finish first.
        self.handle.tell(CastOutcome(event=DispatchFailed(visit_id=visit_id, error=error, at=self.env.clock())))

    def _run_agent_turn(self, effect: RunAgentTurn) -> None:
        self._count_visit(effect)
        if self.env.ui is not None:  # the footer's text is built only for a harness that shows it
            item = short_label(effect.item_label or effect.item_key)  # the work item, as pi-materia's footer shows it
            self._set_status(f"materia: {effect.materia} ({effect.socket_id})" + (f" — {item}" if item else ""))
        if effect.user_driven:
            # The user's own message drives it (no hidden prompt is sent); the harness's
            # agent_end answers it. Its instructions reach the model through the answer to
            # before_agent_start (see component.py), so they go back to the asker.
            self._withdrawn_user_turn = None  # a late end can no longer be told from this turn's
            self._user_turn_isolated = effect.isolated_context
            self._arm_user_turn_bound(effect.visit_id)
            self._user_turn_context = {"visit_id": effect.visit_id, "socket_id": effect.socket_id,
                                       "prompt": effect.prompt, "model": effect.model,
                                       "thinking": effect.thinking, "tools": effect.tools}
            return
        env = self.env
        agent, spawn_child = env.agent, env.spawn_child
        if agent is None or spawn_child is None:
            self._dispatch_failed(effect.visit_id, "this session has no agent port")
            return
        from castor.actors.materia.socket_actor import VisitTurn, socket_spec, wants_proactive_check

        turn: VisitTurn | None = None
        failed: BaseException | None = None
        if not wants_proactive_check(effect, env.host):
            # The cast sends the turn itself: a turn answered at once is handed on right here and
            # the visit needs no actor (nothing is left of it to show, stop or contain); one not
            # answered yet is taken over by its SocketActor below, as is an error sending it.
            turn = VisitTurn(effect, cast=self.handle, cast_id=env.cast_id, agent=agent)
            try:
                ready = turn.send()
            except BaseException as exc:  # noqa: BLE001 - the visit's crash: its SocketActor raises it
                ready, failed = None, exc
            if ready is not None or (failed is None and turn.answered):
                if ready is not None:
                    turn.hand_on(ready)
                return
        spec = socket_spec(effect, cast=self.handle, cast_id=env.cast_id, agent=agent,
                           host=env.host, usage_timeout_s=env.usage_timeout_s,
                           compaction_timeout_s=env.compaction_timeout_s, turn=turn, raise_on_start=failed)
        try:
            self._sockets[effect.visit_id] = spawn_child(spec, env.socket_supervisor)
        except CastorError as exc:
            if turn is not None and turn.once.acquire(blocking=False):
                try:  # sent (or tried), but no actor can own it: call it off (a later answer is dropped)
                    agent.cancel(effect.visit_id)
                except Exception:  # noqa: BLE001 - best effort; the engine ignores late answers anyway
                    pass
            self._dispatch_failed(effect.visit_id, f"cannot start the socket actor: {exc.message}")
        else:
            self._waiting_for_agent()

    def _count_visit(self, effect: RunAgentTurn) -> None:
        """Count the visit ``effect`` opens once (``castor_socket_visits_total``), however many
        times its turn is sent again -- a retry, a rerun, a recast after this cast or castor
        restarted, each a new SocketActor -- and each such send as a restart of its visit
        (``castor_socket_visit_restarts_total``). Counted from the engine's own word, whether
        or not the turn needs a SocketActor."""
        if not (effect.opens_visit or effect.sent_again):
            return
        tallies = self._visit_tallies
        if tallies is None:
            meters = self.handle.registry.meters
            tallies = self._visit_tallies = (meters.tally(SOCKET_VISITS, "SocketActor"),
                                             meters.tally(SOCKET_VISIT_RESTARTS, "SocketActor"))
        tallies[0 if effect.opens_visit else 1]()

    def _compact(self, effect: Compact) -> None:
        """Same-socket recovery compaction (before the retry) through the host context port.

        Never waits: the port answers on another thread, and that answer — or the deadline's
        failure — is told back as ``CompactionFinished`` with the effect's visit id (so one that
        arrives after an abort or a restart is ignored by the engine).
        """
        cast, visit_id, clock = self.handle, effect.visit_id, self.env.clock

        def deliver(outcome: CompactionOutcome) -> None:
            cast.tell(CastOutcome(event=CompactionFinished(visit_id=visit_id, ok=outcome.ok, result=outcome.result,
                                                           error=outcome.error, skipped=outcome.skipped,
                                                           cancelled=outcome.cancelled, at=clock())))

        request = CompactionRequest(cast_id=self.env.cast_id, instructions=effect.instructions, reason=effect.reason)
        self._compactions[visit_id] = CompactionCall(self.env.host, request, timeout_s=self.env.compaction_timeout_s,
                                                     deliver=deliver).start()

    def _run_utility(self, effect: RunUtility) -> None:
        from castor.actors.materia.messages import UtilityJob
        from castor.actors.materia.utility_pool import submit_utility

        # The footer named the previous agent turn (or nothing, at a cast's first socket): it now
        # says the utility's command runs -- an Esc stops no command; /materia abort does.
        self._set_status(f"materia: utility ({effect.socket_id})")
        try:
            submit_utility(self.env.registry, UtilityJob(effect=effect, cast=self.handle,
                                                         run_dir=str(self.artifacts.run_dir)))
        except CastorError as exc:
            self._dispatch_failed(effect.visit_id, f"cannot queue the utility: {exc.message}")

    def _cancel(self, visit_id: str, reason: str = "cast_aborted") -> None:
        handle = self._sockets.pop(visit_id, None)
        if handle is not None:
            # The socket actor cancels its turn on the way out; a harness hears why (agent.abort_turn).
            note = getattr(self.env.agent, "note_stop_reason", None)
            if note is not None:
                note(visit_id, reason)
            self._stop_socket(handle)
        compaction = self._compactions.pop(visit_id, None)
        if compaction is not None:
            compaction.cancel()  # the host may still finish it; its answer is no longer awaited
        from castor.actors.materia.utility_pool import cancel_utility

        cancel_utility(self.env.registry, visit_id)

    def _utility_progress(self, visit_id: str) -> tuple[str, int | None, int, float | None] | None:
        """Where this cast's utility job is (for its activity; snapshots only): see
        UtilityPoolState.progress_of, with the pool's slots and the running command's deadline
        (monotonic; None unless it runs). None where this runtime has no utility pool."""
        from castor.actors.materia.utility_pool import pool_of

        try:
            pool = pool_of(self.env.registry)
        except NotFound:
            return None
        where, pid = pool.progress_of(visit_id)
        return where, pid, pool.slots, pool.deadline_of(visit_id) if where == "running" else None

    def _arm_user_turn_bound(self, visit_id: str) -> None:
        """Start the opt-in bound on a user-driven turn (none by default: see docs/materia.md)."""
        self._disarm_user_turn_bound()
        limit = self.env.user_turn_timeout_s
        if not limit:
            return
        # A timer as a message; a tell the cast no longer takes (it ended meanwhile) is dropped.
        self._user_turn_timer = self.tell_self_later(UserTurnExpired(visit_id=visit_id), limit)
        self.user_turn_deadline = (visit_id, time.monotonic() + limit)

    def _disarm_user_turn_bound(self) -> None:
        timer, self._user_turn_timer = self._user_turn_timer, None
        self.user_turn_deadline = None
        if timer is not None:
            timer.cancel()

    def _stop_socket(self, handle: Any) -> None:
        try:
            handle.stop(1.0)  # a clean stop cancels the turn and reports no loss
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass

    # ------------------------------------------------------------------ harness mirrors (best effort)
    def _notify(self, message: str, level: str) -> None:
        ui = self.env.ui
        if ui is None:
            return
        try:
            ui.notify(message, level)
        except Exception as exc:  # noqa: BLE001 - a toast never fails a cast
            self.log.debug("ui.notify failed: {exc}", exc=exc)

    def _set_status(self, text: str | None) -> None:
        ui = self.env.ui
        if ui is None:
            return
        try:
            ui.set_status(self.env.status_key or footer_key(self.env.cast_id, shared=False), text)
        except Exception as exc:  # noqa: BLE001 - an outcome that cannot be delivered is logged, never a crash loop
            self.log.debug("ui.set_status failed: {exc}", exc=exc)

    def _mirror_contexts(self, transition: Transition) -> None:
        """One ``pi-materia-context`` session entry per prompt castor sends (pi-materia appends it
        beside each hidden prompt): the socket, materia, item, the context artifact and the model; a
        field with no value is left out, as pi-materia's JSON leaves out what is undefined."""
        log = self.env.session_log
        if log is None:
            return
        for effect in transition.effects:
            if type(effect) is WriteArtifact and effect.manifest and effect.manifest.get("kind") == "context":
                m = effect.manifest
                entry = {"phase": m.get("phase"), "socketId": m.get("socket"), "materiaName": m.get("materia"),
                         "itemKey": m.get("itemKey"), "itemLabel": m.get("itemLabel"),
                         "itemLabelShort": m.get("itemLabelShort"), "artifact": m.get("artifact"),
                         "materiaModel": m.get("materiaModel")}
                log.submit(CONTEXT_ENTRY_TYPE, {key: value for key, value in entry.items() if value is not None})

    def _mirror_to_session(self) -> None:
        """Append a compact state record to the harness session (pi-materia's session entry), in
        pi-materia's terms: ``updatedAt`` in epoch milliseconds (an integer, as ``Date.now()``), and
        a field with no value left out (pi-materia's JSON leaves out what is undefined)."""
        log = self.env.session_log
        if log is None or self.state is None:
            return
        s = self.state
        record = {"castId": s.cast_id, "active": s.active, "phase": s.phase, "socketState": s.socket_state,
                  "currentSocketId": s.current_socket_id, "currentMateria": s.current_materia,
                  "currentItemKey": s.current_item_key, "failedReason": s.failed_reason,
                  "runDir": s.run_dir, "updatedAt": int(s.updated_at * 1000)}
        # queued: a harness round trip must never block a cast
        log.submit(SESSION_ENTRY_TYPE, {key: value for key, value in record.items() if value is not None})


def _after_usage_length(state: CastState) -> int:
    """How many bytes the fields after the usage report take at the end of the state's JSON
    (``,"name":value`` each): counted for a field holding a bool, measured otherwise."""
    length = 0
    for name in _AFTER_USAGE:
        value = getattr(state, name)
        if value is True or value is False:
            length += len(name) + (8 if value else 9)  # ,"name":true / ,"name":false
        else:
            # {...}: its members, and the comma before them in place of the two braces
            return len(_STATE_SERIALIZER.to_json(state, include=set(_AFTER_USAGE))) - 1
    return length


def _outbox_json(effect: Any, config: Any, event_json: dict[int, tuple[EmitEvent, str]]) -> bytes:
    """One outbox entry's JSON; ``config.resolved.json`` of ``config`` without its text (see _encode).

    An event's entry is made from its data's text as its line writes it (json's), kept in
    ``event_json`` by the effect's id for :meth:`CastActor._perform_files`: the data is encoded
    once. Data json cannot write (NaN, a type it does not know, a lone surrogate) is left to the
    effect's serialiser, as before, and its line refuses it then, after the save, as before."""
    kind = type(effect)
    if kind is EmitEvent:
        try:
            data_json = event_data_json(effect.data)
            entry = emit_event_json(effect, data_json)
        except (ValueError, TypeError, RecursionError):
            pass
        else:
            event_json[id(effect)] = (effect, data_json)
            return entry
    elif kind is WriteArtifact and effect.path == USAGE_FILE and effect.manifest is None:
        # usage.json's text, escaped from its pieces' escapes (each derived once: see budget.py)
        # when it is the text the engine made at this transition; else pydantic escapes it whole.
        content_json = usage_file_text_json(effect.content)
        if content_json is not None:
            return b"".join((_USAGE_WRITE_OPEN, content_json, _USAGE_WRITE_CLOSE))
    elif kind is WriteArtifact and effect.path == CONFIG_FILE and effect.manifest is None:
        text = resolved_config_text(config)
        if effect.content is text or effect.content == text:
            return _WRITE_SERIALIZER.to_json(effect, exclude=_NO_CONTENT)[:-1] + _FROM_CONFIG_CLOSE
    serialized: bytes = type(effect).__pydantic_serializer__.to_json(effect)
    return serialized


def _record_give_up(env: CastEnv, reason: str) -> None:
    """A ``cast_given_up`` event in the cast's log (its feed on the console): the cast stops
    running with its state still active, and ``castor status`` can only call it orphaned; the
    event says why. Written while the lease is still held (no runtime resumes it meanwhile); a
    file system that refuses it costs the event, never the give-up."""
    data = {"castId": env.cast_id, "reason": reason, "maxRestarts": CAST_MAX_RESTARTS,
            "withinSeconds": CAST_RESTART_WINDOW_S, "resumable": True}
    try:
        store = env.storage.store(env.artifact_root, resolved=True)
        if not store.load(env.cast_id).state.get("active"):
            return  # ended: its log's last line must stay its last transition's (outbox_on_disk)
        store.artifacts(env.cast_id).append_event("cast_given_up", data)
    except Exception as exc:  # noqa: BLE001 - evidence only: the give-up itself goes on
        logger.warning("cannot record that cast {cast} was given up: {exc}", cast=env.cast_id, exc=exc)


CAST_MAX_RESTARTS = tree.CAST_GIVE_UP.max_restarts
CAST_RESTART_WINDOW_S = tree.CAST_GIVE_UP.within_seconds


def cast_spec(env: CastEnv) -> ChildSpec:
    """The cast supervisor's child for one cast (TRANSIENT: restarted after a crash only).

    A cast that keeps crashing (a full disk, a bug) is given up after
    ``CAST_MAX_RESTARTS`` restarts in ``CAST_RESTART_WINDOW_S``: its actor is
    removed, its last persisted state stays resumable with ``recast``, and the
    session's other casts are untouched (the cast supervisor does not fail).
    """
    def given_up(reason: str) -> None:
        if reason.startswith("gave up"):  # past its own limit (not an end of its own)
            _record_give_up(env, reason)
        # The crashed incarnations kept the lease for a restart that will not come:
        # free it so the cast shows as orphaned and `recast` can resume it.
        if env.lease is not None:
            env.lease.release()

    return tree.CAST.child_spec(lambda: CastActor(env), id=env.cast_id,
                                on_removed=given_up, direct_start=True)  # started by its session, no supervisor hop


def _damaged_path(exc: OSError) -> str | None:
    """The file a damage error is about: a rename's target (``filename2``: the ``usage.json`` a
    directory stands in place of), not the atomic write's temporary file it was renaming from."""
    target = exc.filename2 if exc.filename2 is not None else exc.filename
    return None if target is None else str(target)
