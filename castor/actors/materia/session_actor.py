"""SessionActor: one harness session's ``/materia`` verbs (``/root/session/<sid>/materia``).

It owns no cast state of its own — casts persist theirs — so a restart of this actor loses
nothing: live casts are the live children of ``/root/session/<sid>/cast``, and every other
cast is read from the state store under the session's artifact root.

| verb (message) | params | rule |
|---|---|---|
| ``start`` (``StartCast``) | request, loadout?, config_path? | live casts ≥ ``max_casts_per_session`` → ``conflict``; config errors → ``invalid_config`` and nothing is created; an untrusted session may not run a loadout with ``command`` sockets while a project config layer is loaded (``forbidden``) |
| ``status`` (``ShowCast``) | cast_id? | the cast, else the newest live cast, else the newest persisted cast; none → ``not_found`` |
| ``list`` (``ListCasts``) | limit?, cursor? | one page (default 50) of the casts under the artifact root, newest first (views.py table), from the cast index; ``next_cursor`` for the next page |
| ``abort`` (``AbortCast``) | cast_id? | the cast, else the newest live cast; a live turn is stopped through the harness (``agent.abort_turn``) and the answer never waits for the model; a cast already aborted (a second abort; id-less: the newest cast when none is live) answers ``already: true``, level info |
| ``continue`` (``ContinueCast``) | cast_id? | the cast, else the newest live cast, else the newest interrupted or orphaned one: an interrupted cast re-runs its turn, a paused one finalizes; a cast no runtime holds is brought in first (an orphaned one whose work was lost resumes it) |
| ``recast`` (``RecastCast``) | cast_id? | id-less: a live interrupted cast (re-runs its turn), else newest resumable (failed, aborted or orphaned); ``conflict`` if it is live (and not interrupted) or the session is at its limit |
| ``revive`` (``ReviveCast``) | cast_id? | id-less: newest revivable; then as recast |
| ``context`` (``IsolateContext``) | messages | a user-driven refinement turn's transcript cut to its isolated context; ``{}`` when none is pending |
| ``refine`` (``BeginRefinement``) | — | ``before_agent_start`` (a user message) while a cast is paused, or still waits for an earlier user turn → ``RefinementTurnStarted`` |
| ``agent_end`` (``UserAgentEnded``) | text, error?, entry_id?, stop_reason?, turn_id? | a user run (``turn_id`` null) answers the pending user-driven refinement turn; with none pending, the last withdrawn one (→ ``outcome_ignored``) |
| ``settled`` (``UserRunSettled``) | aborted, turn_id? | a user run settled: a user-driven turn still pending lost its end → withdrawn (``settled_without_end``, or ``aborted``) |
| ``session_end`` (``SessionEnding``) | reason | ``session_shutdown`` / the session closing: every pending user-driven turn is withdrawn |
| ``session_start`` (``SessionStarting``) | — | the harness (re)started its session: the cast an id-less status would show, when it is still going and no other session runs it, is named in a ``notify`` ("… restored in <phase>. Use /materia status for details.") and a footer ``status``; else ``{}`` |
| ``loadouts`` / ``set_loadout`` / ``grid`` / ``validate`` (``ListLoadouts`` / ``SetActiveLoadout`` / ``RenderGrid`` / ``ValidateConfig``) | | config reads/writes through the config loader |

A cast that is not live in this runtime is brought in by spawning its CastActor in *resume*
mode (the lease is taken first: a cast another live runtime holds is a ``conflict``).

Every ``cast_id`` is a reference (:func:`castor.actors.materia.views.resolve_cast_id`): the exact id,
``latest`` or a unique prefix. Every text names the commands of the session's *surface*: a
harness over the endpoint (``/materia continue``) or the standalone CLI (``castor continue <id>``).
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, overload

from castor._log import logger
from castor.actors.materia.cast_actor import CastEnv, cast_spec, footer_key, moved_to
from castor.actors.materia.messages import (
    AbortCast,
    BeginRefinement,
    CastApply,
    CastStatusQuery,
    ContinueCast,
    IsolateContext,
    ListCasts,
    ListLoadouts,
    RecastCast,
    RenderGrid,
    ReviveCast,
    SessionEnding,
    SessionStarting,
    SessionVerb,
    SetActiveLoadout,
    ShowCast,
    StartCast,
    UserAgentEnded,
    UserRunEnded,
    UserRunSettled,
    UserTurnContextQuery,
    ValidateConfig,
    WithdrawUserTurn,
    answer_fields,
)
from castor.actors.materia.session_mirror import SessionMirror
from castor.actors.materia.views import (
    cast_page,
    cast_rows,
    casts_text,
    find_cast,
    held_elsewhere,
    load_state_and_writer,
    loadout_line,
    persisted_view,
    resolve_cast_id,
    status_text,
)
from castor.domain.materia.cast_messages import (
    AbandonReason,
    AbortRequested,
    CastStarted,
    ContinueRequested,
    RecastRequested,
    RefinementTurnStarted,
    ReviveRequested,
)
from castor.domain.materia.config import ConfigError, ResolvedConfig
from castor.domain.materia.engine import CastRejected
from castor.domain.materia.grid import render_grid
from castor.domain.materia.prompts import isolate_context
from castor.domain.materia.surface import Surface, command
from castor.domain.materia.trust import check_project_trust, check_saved_cast_trust
from castor.domain.paths import named_under
from castor.messages.errors import (
    ActorStopped,
    CastorError,
    Conflict,
    InvalidParams,
    NotFound,
    StorageUnavailable,
)
from castor.ports.agent import harness_turn_settings
from castor.ports.cast_storage import DEFAULT_PAGE, CastHold, CastStorage
from castor.ports.cli_note import CAST_BACKEND_FLAGS
from castor.ports.session_component import SessionContext
from castor.shown import one_line
from castor.supervision import Actor, HandleState, handles

ASK_TIMEOUT_S = 10.0


def answers_bad_input(handler: Callable[[Any, Any], dict[str, Any]]) -> Callable[[Any, Any], dict[str, Any]]:
    """Wrap one verb's handler so bad input is the caller's error, answered and survived: the same
    input would crash every restart, and enough crashes would take the session down with it.

    A ``ValueError`` (pydantic's ``ValidationError`` too: a value no event or path can hold) answers
    ``invalid_params``; an ``OSError`` (the project's files, not castor) ``storage_unavailable``;
    both quote the verb. Anything else is a crash, as for any handler.
    """

    @functools.wraps(handler)
    def run(self: SessionActor, message: SessionVerb) -> dict[str, Any]:
        try:
            return handler(self, message)
        except ValueError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InvalidParams(f"invalid input for materia {message.verb}: {first}",
                                data={"verb": message.verb}) from None
        except OSError as exc:
            error = self.storage.storage_unavailable(exc, base=self.cwd, action=f"run materia {message.verb}")
            raise StorageUnavailable(error.message, data={**error.data, "verb": message.verb}) from None
        except StorageUnavailable as exc:
            raise named_under(exc, (str(self.cwd), os.path.realpath(self.cwd))) from None

    return run


_DRIVEN_KEPT = 64  # the casts a session remembers having driven (for an id-less status)


class SessionActor(Actor):
    # An ask that finds the session idle runs its verb on the asking thread (docs/supervision.md
    # "Inline asks"): a verb costs no thread hand-off there and back. Every handler bounds its own
    # run time (each ask or wait inside has its own deadline, ASK_TIMEOUT_S; the rest is file
    # work), and none asks this actor.
    inline_asks = True

    def __init__(self, ctx: SessionContext, storage: CastStorage) -> None:
        super().__init__()
        self.ctx = ctx
        self.storage = storage  # the casts' files, leases, index and config (castor.ports.cast_storage)
        self.runtime = ctx.runtime
        self.cwd = Path(ctx.info.cwd)
        flags = ctx.info.flags or {}
        self.config_path = flags.get("materia_config") if isinstance(flags.get("materia_config"), str) else None
        self.mirror: SessionMirror | None = None
        self.configs = storage.config_cache()  # re-read only when a layer file changed
        self._roots: dict[str | None, Path] = {}  # configured artifactDir -> resolved artifact root
        # Where the user is: a harness over the endpoint names /materia commands, the CLI castor ones;
        # a Ray cast host's session names those of the harness it relays (user_kind), never its own.
        self.surface: Surface = "harness" if getattr(ctx.harness, "user_kind", None) == "endpoint" else "cli"
        # The casts this session started or brought in, oldest first: an id-less status shows this
        # session's own cast, not the newest another session (a second Pi in the project) runs.
        self._driven: list[str] = []

    def on_start(self) -> None:
        log = self.ctx.harness.session_log
        self.mirror = SessionMirror(log, name=self.path) if log is not None else None

    def on_terminate(self, cause: str) -> None:
        if self.mirror is not None:
            self.mirror.close()

    # ------------------------------------------------------------------ plumbing
    def _cmd(self, verb: str, cast_id: str | None = None) -> str:
        return command(self.surface, verb, cast_id)

    @overload
    def _ref(self, cast_id: str, root: Path | None = None) -> str: ...

    @overload
    def _ref(self, cast_id: None, root: Path | None = None) -> None: ...

    def _ref(self, cast_id: str | None, root: Path | None = None) -> str | None:
        """The cast id a reference (exact, ``latest``, a unique prefix) means; None stays None."""
        if cast_id is None:
            return None
        artifact_root = root if root is not None else self._artifact_root()
        return resolve_cast_id(self.storage, artifact_root, cast_id, set(self._live()))

    @property
    def cast_sup(self) -> str:
        return self.ctx.child("cast")

    def _live(self) -> dict[str, Any]:
        """cast id -> handle of every live CastActor of this session, one its supervisor is
        restarting after a crash included: its handle and mailbox outlive the crash, so what is
        asked of it now is answered by the next incarnation (it was taken for a cast another
        runtime holds -- its lease is still held here -- and an abort was refused
        ``held_elsewhere``). A crashed actor its supervisor gives up on is closed: an ask fails
        ``actor_stopped``, never waits past its deadline."""
        prefix = len(self.cast_sup) + 1
        return {handle.path[prefix:]: handle for handle in self.runtime.system.registry.children(self.cast_sup)
                if handle.alive or (handle.state is HandleState.CRASHED and not handle.closed.is_set())}

    def _resolved(self, loadout: str | None = None, config_path: str | None = None) -> ResolvedConfig:
        return self.configs.load_resolved(self.cwd, loadout=loadout, config_path=config_path or self.config_path)

    def _artifact_root(self, config_path: str | None = None) -> Path:
        # The cached resolved config carries the merged layers (re-read only when a layer file
        # changed): status, list and recast no longer merge and validate every layer per call.
        # A config that does not resolve (a bad loadout) still names its artifactDir: read it.
        try:
            configured = self._resolved(None, config_path).config.get("artifactDir")
        except ConfigError:
            try:
                loaded = self.storage.load_config(self.cwd, config_path=config_path or self.config_path)
                configured = loaded.merged.get("artifactDir")
            except ConfigError:
                configured = None
        return self._root_for(configured if isinstance(configured, str) else None)

    def _root_for(self, configured: str | None) -> Path:
        """``Runtime.artifact_root_for`` of this session's project, resolved once per configured value:
        a resolved path stays the real location (and stays inside the project) even if a component is
        later swapped for a symlink, and a refusal is never cached."""
        root = self._roots.get(configured)
        if root is None:
            root = self._roots[configured] = self.runtime.artifact_root_for(str(self.cwd), configured)
        return root

    def _footer_key(self, cast_id: str) -> str:
        """The harness footer entry of cast ``cast_id``: one shared by the session's casts unless
        it may run several at once (:func:`footer_key`)."""
        return footer_key(cast_id, shared=self.runtime.settings.max_casts_per_session == 1)

    def _env(self, cast_id: str, root: Path, *, lease: CastHold, held_since: float,
             start: CastStarted | None = None) -> CastEnv:
        """``held_since``: when this runtime went to take the cast's lease (an abort request older
        than that was not made while it held the cast)."""
        harness = self.ctx.harness
        system = self.runtime.system
        settings = self.runtime.settings
        return CastEnv(cast_id=cast_id, artifact_root=root, session_path=self.ctx.path, registry=system.registry,
                       agent=harness.agent, storage=self.storage, ui=harness.ui, session_log=self.mirror,
                       start_event=start, lease=lease, spawn_child=lambda spec, under: system.spawn(spec, under=under),
                       user_turn_timeout_s=settings.user_turn_timeout_s,
                       host_context=harness.host_context, compaction_timeout_s=settings.compaction_timeout_s,
                       usage_timeout_s=settings.context_usage_timeout_s,
                       status_key=self._footer_key(cast_id), project=str(self.cwd), held_since=held_since)

    def _active(self) -> dict[str, Any]:
        """The live casts that are still active (a cast that just ended may not have exited yet)."""
        out = {}
        for cast_id, handle in self._live().items():
            try:
                if handle.ask(CastStatusQuery(), timeout=ASK_TIMEOUT_S).get("active"):
                    out[cast_id] = handle
            except CastorError:
                continue
        return out

    def _await_exit(self, cast_id: str) -> None:
        """Wait for an ended cast's actor to stop and leave the cast supervisor (at most ``ASK_TIMEOUT_S``).

        It releases the lease on its way out; only once its supervisor has removed it can an actor
        start under the same id (a recast right after an abort used to start it in between:
        ``Conflict``). A cast being restarted after a crash ends the wait, and is seen running.
        """
        handle = self.runtime.system.registry.find(f"{self.cast_sup}/{cast_id}")
        if handle is not None:
            handle.wait_gone(ASK_TIMEOUT_S)

    def _active_at_capacity(self) -> dict[str, Any] | None:
        """The active live casts when they fill the session's ``max_casts_per_session``, else None.
        The live actors are counted first: fewer of them than the limit cannot hold that many
        active casts, and then none is asked (asking each live cast its status made a start cost
        one round trip per cast the session runs: 99 for the hundredth)."""
        limit = self.runtime.settings.max_casts_per_session
        if len(self._live()) < limit:
            return None
        active = self._active()
        return active if len(active) >= limit else None

    def _check_capacity(self) -> None:
        live = self._active_at_capacity()
        limit = self.runtime.settings.max_casts_per_session
        if live is not None:
            newest = max(live)
            raise Conflict(f"pi-materia cast already active ({newest}). Use {self._cmd('status', newest)} or "
                           f"{self._cmd('abort', newest)}.",
                           data={"reason": "active", "cast_id": newest, "limit": limit})

    # ------------------------------------------------------------------ casts
    @handles(StartCast)
    @answers_bad_input
    def _on_start(self, message: StartCast) -> dict[str, Any]:
        """``cli_note`` (in-process callers only: the standalone CLI; else the runtime's
        ``cast_cli_note``, if any) is written to ``<runDir>/cli.json`` before the cast's first
        save, so a kill at any point after the start leaves it with the cast."""
        loadout, config_path, cli_note = message.loadout, message.config_path, message.cli_note
        if cli_note is None and self.runtime.settings.cast_cli_note:  # where this runtime runs its casts
            cli_note = dict(self.runtime.settings.cast_cli_note)
        request = " ".join(message.request.split())
        if not request:
            raise InvalidParams(f"{self._cmd('cast')} needs a request.", data={"reason": "empty_request"})
        self._check_capacity()
        try:
            resolved = self._resolved(loadout, config_path)
        except ConfigError as exc:
            raise ConfigError(exc.issues, headline=f"cast failed to start: {exc.message}") from None
        self._check_trust(resolved)
        root = self._root_for(resolved.artifact_dir)
        try:
            # Its index row is written on the cast's thread once this caller has its answer (a
            # listing before that finds the new directory by the root's changed signature).
            cast_id = self.storage.allocate_cast_id(root, root_resolved=True, index_later=True)
        except OSError as exc:  # a read-only or full project: say what could not be made, and where
            error = self.storage.storage_unavailable(exc, base=self.cwd)
            shown = self.storage.storage_unavailable(OSError(exc.errno, exc.strerror), path=root, base=self.cwd)
            raise StorageUnavailable(
                f"storage unavailable: cannot create the cast's run directory in {shown.data['path']} "
                f"({error.data['errno']}: {exc.strerror or 'error'})",
                data={**error.data, "verb": message.verb, "artifact_root": shown.data["path"]}) from None
        held_since = time.time()
        try:
            lease = self.storage.try_lease(root, cast_id, root_resolved=True, fresh=True)  # made 0700 just now
            if lease is None:  # cannot happen for a fresh id unless someone races us on purpose
                raise Conflict(f"cast {cast_id} is held by another runtime", data={"cast_id": cast_id})
            if cli_note is not None:
                try:
                    self.storage.write_json(root / cast_id / "cli.json", cli_note)
                except BaseException:
                    lease.release()
                    raise
            start = CastStarted(cast_id=cast_id, request=request, config=resolved, cwd=str(self.cwd),
                                run_dir=f"{root}/{cast_id}", artifact_root=str(root), surface=self.surface,
                                at=time.time())
            env = self._env(cast_id, root, lease=lease, held_since=held_since, start=start)
            handle = self._spawn(env, lease)
        except BaseException:
            self.storage.discard_unsaved(root, cast_id)  # a start that saved no state was never a cast: nothing to list
            raise
        view, env.started_view = env.started_view or self._ask_status(handle, root, cast_id), None  # read once
        # What pi-materia tells at a start: where the artifacts are, the config source and the entry.
        text = (f"pi-materia cast started: {cast_id} ({one_line(resolved.pipeline.loadout_name)}). "
                f"Artifacts: {one_line(str(view.get('run_dir') or f'{root}/{cast_id}'))}\n"
                f"pi-materia config: {one_line(resolved.source or '-')}\n"
                f"pi-materia grid entry: {resolved.pipeline.entry}")
        warnings = [w.model_dump() for w in resolved.warnings]  # also config_warning events of the cast
        if warnings:
            text += "".join(f"\nwarning [{w['code']}] {w['path']}: {w['message']}" for w in warnings)
        return {**view, "text": text, "level": "warning" if warnings else "info", "warnings": warnings}

    def _check_trust(self, resolved: ResolvedConfig) -> None:
        check_project_trust(resolved, trusted=self.ctx.info.trusted)  # the rule: castor.domain.materia.trust

    def _spawn(self, env: CastEnv, lease: CastHold) -> Any:
        try:
            handle = self.runtime.system.spawn(cast_spec(env), under=self.cast_sup)
        except BaseException:
            lease.release()
            raise
        if env.start_error is not None:  # its start met a storage fault: stopped, told here
            raise env.start_error
        if env.cast_id in self._driven:
            self._driven.remove(env.cast_id)
        self._driven = [*self._driven[-(_DRIVEN_KEPT - 1):], env.cast_id]
        return handle

    def _ask_status(self, handle: Any, root: Path, cast_id: str) -> dict[str, Any]:
        try:
            status: dict[str, Any] = handle.ask(CastStatusQuery(), timeout=ASK_TIMEOUT_S)
            return status
        except CastorError:
            return persisted_view(self.storage, root, cast_id, live=False)  # it already finished (or stopped)

    def _target(self, cast_id: str | None, verb: str) -> tuple[str, Any | None]:
        live = self._live()
        if cast_id is not None:
            self.storage.validate_cast_id(cast_id)
            return cast_id, live.get(cast_id)
        if live:
            newest = max(live)
            return newest, live[newest]
        raise NotFound(f"No active pi-materia cast to {verb}.", data={"reason": "no_active_cast"})

    def _bring_in(self, cast_id: str, root: Path) -> Any:
        """Spawn a resume-mode CastActor for a persisted cast that is not live here."""
        # NotFound / StateCorrupt before anything starts
        saved, written_by_another = load_state_and_writer(self.storage, root, cast_id)
        moved_to(saved, f"{root}/{cast_id}", str(root), 0.0)  # a move it cannot follow: StateCorrupt, too
        check_saved_cast_trust(saved.config, cast_id, trusted=self.ctx.info.trusted, foreign=written_by_another)
        held_since = time.time()
        try:
            lease = self.storage.try_lease(root, cast_id, root_resolved=True)
        except PermissionError as exc:  # a storage fault, as the store's own EACCES: storage_unavailable
            error = self.storage.storage_unavailable(exc, base=self.cwd)
            raise StorageUnavailable(f"pi-materia cast {cast_id} cannot be taken over: its run directory is not "
                                     f"writable ({error.data['errno']}: {exc.strerror or 'error'} on "
                                     f"{error.data.get('path', cast_id)})",
                                     data={**error.data, "reason": "not_writable", "cast_id": cast_id}) from None
        if lease is None:
            # the shell's commands on either surface: a harness's /materia verbs reach only its own casts
            raise Conflict(f"pi-materia cast {cast_id} is running in another session or castor runtime: "
                           f"`castor status {cast_id}` shows where; stop it there (or `castor abort {cast_id}`) "
                           "to take it over here.", data={"reason": "held_elsewhere", "cast_id": cast_id})
        return self._spawn(self._env(cast_id, root, lease=lease, held_since=held_since), lease)

    def _note_where_it_runs(self, root: Path, cast_id: str) -> None:
        """A cast taken up here to run again (recast, revive, continue), with
        ``notes_where_resumed_casts_run`` (``castor serve``): record in the cast's
        ``cli.json`` the backend flags this runtime runs casts with, or none (this machine), so the
        CLI's resume hints name where it now runs. Best effort: a file that cannot be written is
        logged, and the cast runs all the same."""
        settings = self.runtime.settings
        if not settings.notes_where_resumed_casts_run:
            return
        flags = settings.cast_cli_note.get(CAST_BACKEND_FLAGS) or None
        try:
            self.storage.note_in_cli_json(root / cast_id, CAST_BACKEND_FLAGS, flags)
        except OSError as exc:
            logger.bind(actor=self.path).warning("cannot record where cast {cast} runs in its cli.json ({exc}): "
                                                 "`castor status` may name where it ran before", cast=cast_id,
                                                 exc=exc.strerror or exc)

    def _apply(self, handle: Any, event: Any, *, root: Path, cast_id: str, stop_if_idle: bool) -> dict[str, Any]:
        try:
            view: dict[str, Any] = handle.ask(CastApply(event=event), timeout=ASK_TIMEOUT_S)
            return view
        except CastorError:
            if stop_if_idle:
                self._stop_if_inactive(handle, cast_id)
            raise

    def _stop_if_inactive(self, handle: Any, cast_id: str) -> None:
        try:
            view = handle.ask(CastStatusQuery(), timeout=ASK_TIMEOUT_S)
        except CastorError:
            return
        if not view.get("active"):
            try:
                self.runtime.system.stop_child(f"{self.cast_sup}/{cast_id}", timeout=ASK_TIMEOUT_S)
            except CastorError:
                pass

    @handles(ShowCast)
    @answers_bad_input
    def _on_status(self, message: ShowCast) -> dict[str, Any]:
        cast_id = message.cast_id
        cast_id = self._ref(cast_id)
        live = self._live()
        elsewhere = False
        view = None
        if cast_id is None:
            cast_id, elsewhere, view = (max(live), False, None) if live else self._newest_to_show()
        self.storage.validate_cast_id(cast_id)
        handle = live.get(cast_id)
        if handle is not None:
            try:
                view = handle.ask(CastStatusQuery(), timeout=ASK_TIMEOUT_S)
            except CastorError:
                view = None  # it ended meanwhile: read what it persisted
        if view is None:
            view = persisted_view(self.storage, self._artifact_root(), cast_id, live=False)
            named_elsewhere = not elsewhere and held_elsewhere(view)
        else:
            named_elsewhere = False
        view.pop("user_turn_visit_id", None)
        text = status_text(view, self.surface)
        if elsewhere:
            text = (f"No pi-materia cast in this session; the newest in this project runs in another session "
                    f"(abort or continue it there):\n{text}")
        elif named_elsewhere:  # asked for by id: say whose it is, as the verbs on it will (held_elsewhere)
            elsewhere = True
            text = (f"This pi-materia cast runs in another session or castor runtime "
                    f"(abort or continue it there):\n{text}")
        return {**view, "text": text, "level": "info", **({"elsewhere": True} if elsewhere else {})}

    def _newest_to_show(self) -> tuple[str, bool, dict[str, Any] | None]:
        """An id-less status with no live cast here: the newest cast this session drove that is
        still on disk (with the view read to find it); else the newest one in the project that no
        other live session holds; else the newest one, another session's running cast (the flag
        says so)."""
        root = self._artifact_root()
        for cast_id in reversed(self._driven):
            try:
                return cast_id, False, persisted_view(self.storage, root, cast_id, live=False)
            except CastorError:
                continue  # removed since, or unreadable now
        found = find_cast(self.storage, root, set(), "readable", accept=lambda row: not held_elsewhere(row))
        if found is not None:
            return str(found["cast_id"]), False, None
        found = find_cast(self.storage, root, set(), "readable")
        if found is None:
            raise NotFound("No pi-materia cast state in this session.", data={"reason": "no_casts"})
        return str(found["cast_id"]), True, None

    @handles(ListCasts)
    @answers_bad_input
    def _on_list(self, message: ListCasts) -> dict[str, Any]:
        limit, cursor = message.limit, message.cursor
        root = self._artifact_root()
        page = cast_page(self.storage, root, set(self._live()), limit=limit or DEFAULT_PAGE, cursor=cursor)
        rows = page["casts"]
        more = page["total"] - len(rows) if page["next_cursor"] and cursor is None else 0
        return {"casts": rows, "next_cursor": page["next_cursor"], "total": page["total"], "artifact_root": str(root),
                "text": casts_text(rows, root, self.surface, more=more), "level": "info"}

    def _already_ended(self, view: dict[str, Any]) -> dict[str, Any]:
        """The answer to aborting a cast that is not active any more (a second abort, a race)."""
        cast_id = view["cast_id"]
        if view.get("status") == "aborted":
            return {**view, "already": True, "level": "info",
                    "text": f"pi-materia cast {cast_id} is already aborted. Recast it with "
                            f"{self._cmd('recast', cast_id)}."}
        raise Conflict(f"pi-materia cast {cast_id} is {view.get('status')}: there is nothing to abort.",
                       data={"reason": "not-active", "cast_id": cast_id, "status": view.get("status")})

    @handles(AbortCast)
    @answers_bad_input
    def _on_abort(self, message: AbortCast) -> dict[str, Any]:
        cast_id = message.cast_id
        root = self._artifact_root()
        cast_id = self._ref(cast_id, root)
        live = self._live()
        if cast_id is None:
            if not live:  # the newest cast, if the user's abort already ended it
                rows = [r for r in cast_rows(self.storage, root, set()) if r["status"] != "unreadable"]
                if rows and rows[0]["status"] == "aborted":
                    return self._already_ended(persisted_view(self.storage, root, rows[0]["cast_id"], live=False))
                raise NotFound("No active pi-materia cast to abort.", data={"reason": "no_active_cast"})
            cast_id = max(live)
        handle = live.get(cast_id)
        if handle is None:
            self._await_exit(cast_id)
            before = persisted_view(self.storage, root, cast_id, live=False)
            if not before["active"]:
                return self._already_ended(before)
            handle = self._bring_in(cast_id, root)
        try:
            view = self._apply(handle, AbortRequested(surface=self.surface, at=time.time()), root=root,
                               cast_id=cast_id, stop_if_idle=True)
        except CastorError as exc:
            # Aborted meanwhile (a second abort racing the first), or its actor stopped as it ended.
            if isinstance(exc, CastRejected) or not handle.alive:
                self._await_exit(cast_id)
                after = persisted_view(self.storage, root, cast_id, live=False)
                if not after["active"]:
                    return self._already_ended(after)
            raise
        return {**view, "text": f"pi-materia cast {cast_id} aborted. Recast it with {self._cmd('recast', cast_id)}.",
                "level": "warning"}

    @handles(ContinueCast)
    @answers_bad_input
    def _on_continue(self, message: ContinueCast) -> dict[str, Any]:
        cast_id = message.cast_id
        root = self._artifact_root()
        cast_id = self._ref(cast_id, root)
        if cast_id is None and not self._live():
            # None live here (a new harness session, a new process): the newest active cast no
            # runtime holds — interrupted, or orphaned with its work lost.
            for row in cast_rows(self.storage, root, set()):
                if row["resumable"] and row["status"] in ("interrupted", "orphaned"):
                    cast_id = row["cast_id"]
                    break
        if cast_id is None and not self._live() and not any(
                row["status"] != "unreadable" for row in cast_rows(self.storage, root, set(), limit=1)):
            raise NotFound("No pi-materia cast state in this session.", data={"reason": "no_casts"})
        cast_id, handle = self._target(cast_id, "continue")
        event: Any = ContinueRequested(surface=self.surface, at=time.time())
        if handle is None:
            # Not running here: a CLI process resuming it, or its runtime died. Bring it in.
            self._await_exit(cast_id)
            before = persisted_view(self.storage, root, cast_id, live=False)
            if not before["active"]:
                hint = (f" Resume it with {self._cmd('recast', cast_id)}." if before.get("resumable") else "")
                raise Conflict(f"pi-materia cast {cast_id} is {before['status']}, not active.{hint}",
                               data={"reason": "not-active", "cast_id": cast_id, "status": before["status"]})
            full = self._active_at_capacity()
            if full is not None:
                raise Conflict(f"pi-materia cast {max(full)} is active. Abort it before continuing "
                               f"{cast_id}.", data={"reason": "active", "cast_id": cast_id})
            if before.get("pending") is not None:  # its work was lost with its runtime: redo it
                event = RecastRequested(after_restart=True, surface=self.surface, at=time.time())
            handle = self._bring_in(cast_id, root)
            view = self._apply(handle, event, root=root, cast_id=cast_id, stop_if_idle=False)
            self._note_where_it_runs(root, cast_id)
        else:
            view = self._apply(handle, event, root=root, cast_id=cast_id, stop_if_idle=False)
        return {**view, "text": f"pi-materia cast {cast_id} continues at {view.get('current_socket')}.",
                "level": "info"}

    def _pick_resumable(self, root: Path, *, revive: bool) -> str:
        live = set(self._live())
        if not revive:
            for cast_id, _handle, view in self._statuses():  # an interrupted cast goes on where it is
                if view.get("status") == "interrupted":
                    return cast_id
        found = find_cast(self.storage, root, live, "revivable" if revive else "candidate",
                          lambda row: (row["resumable"] and (row["revivable"] or not revive)
                                       and row["cast_id"] not in live))
        if found is not None:
            newest: str = found["cast_id"]
            return newest
        if revive:
            raise NotFound("No failed pi-materia casts exhausted by same-socket recovery are available to revive. "
                           f"Use {self._cmd('recast')} [cast-id] for general failed or aborted casts.",
                           data={"reason": "none_revivable"})
        raise NotFound("No failed or aborted pi-materia casts are available to recast.",
                       data={"reason": "none_resumable"})

    def _resume(self, cast_id: str | None, *, revive: bool) -> dict[str, Any]:
        root = self._artifact_root()
        cast_id = self._ref(cast_id, root) if cast_id is not None else self._pick_resumable(root, revive=revive)
        self.storage.validate_cast_id(cast_id)
        live = self._active()
        if cast_id in live and not revive:
            try:
                interrupted = live[cast_id].ask(CastStatusQuery(), timeout=ASK_TIMEOUT_S).get("status") == "interrupted"
            except CastorError:
                interrupted = False
            if interrupted:  # the engine re-runs the interrupted turn: one command is enough
                view = self._apply(live[cast_id], RecastRequested(surface=self.surface, at=time.time()), root=root,
                                   cast_id=cast_id, stop_if_idle=False)
                return {**view, "text": f'pi-materia cast {cast_id} recast from socket "{view.get("current_socket")}".',
                        "level": "info"}
        if cast_id in live:
            raise Conflict(f"pi-materia cast {cast_id} is already running.", data={"reason": "running"})
        self._await_exit(cast_id)
        if len(live) >= self.runtime.settings.max_casts_per_session:
            raise Conflict(f"pi-materia cast {max(live)} is active. Abort it ({self._cmd('abort', max(live))}) "
                           "before recasting.", data={"reason": "active", "cast_id": max(live)})
        try:
            before = persisted_view(self.storage, root, cast_id, live=False)
        except NotFound:
            raise NotFound(f"Unknown pi-materia cast id \"{cast_id}\".", data={"cast_id": cast_id}) from None
        handle = self._bring_in(cast_id, root)  # its start performs the saved outbox again
        if revive:
            event: Any = ReviveRequested(surface=self.surface, at=time.time())
        else:
            # An interrupted cast lost nothing: the user's recast re-runs its turn (the engine's rule).
            event = RecastRequested(after_restart=before["active"] and before.get("socket_state") != "interrupted",
                                    surface=self.surface, at=time.time())
        try:
            view = self._apply(handle, event, root=root, cast_id=cast_id, stop_if_idle=True)
        except Conflict:
            if not before.get("artifacts_pending"):
                raise
            # An ended cast whose last artifacts were cut short: starting it wrote them; that
            # was the work to do, and the cast stays as it ended.
            view = persisted_view(self.storage, root, cast_id, live=False)
            return {**view, "text": f"pi-materia cast {cast_id} is {view['status']}; the artifacts of its last "
                                    "step were written again.", "level": "info"}
        self._note_where_it_runs(root, cast_id)
        verb = "revived" if revive else "recast"
        if view.get("paused"):  # resumed where it waited for the user: nothing was re-sent
            return {**view, "text": f"pi-materia cast {cast_id} {verb}: paused for refinement at socket "
                                    f"{view.get('current_socket')}; reply to refine, or "
                                    f"{self._cmd('continue', cast_id)} to finalize.",
                    "level": "info"}
        # A revive then recasts, and says so as pi-materia does (its recast notice, then why).
        text = f'pi-materia cast {cast_id} recast from socket "{view.get("current_socket")}".'
        if revive:
            text += " Revived: its same-socket recovery allowance was extended."
        return {**view, "text": text, "level": "info"}

    @handles(RecastCast)
    @answers_bad_input
    def _on_recast(self, message: RecastCast) -> dict[str, Any]:
        return self._resume(message.cast_id, revive=False)

    @handles(ReviveCast)
    @answers_bad_input
    def _on_revive(self, message: ReviveCast) -> dict[str, Any]:
        return self._resume(message.cast_id, revive=True)

    # ------------------------------------------------------------------ harness events
    def _statuses(self) -> list[tuple[str, Any, dict[str, Any]]]:
        out = []
        for cast_id, handle in sorted(self._live().items(), reverse=True):
            try:
                out.append((cast_id, handle, handle.ask(CastStatusQuery(), timeout=ASK_TIMEOUT_S)))
            except CastorError:
                continue
        return out

    @handles(BeginRefinement)
    @answers_bad_input
    def _on_refine(self, message: BeginRefinement) -> dict[str, Any]:
        """Start a user-driven refinement turn on the newest paused cast, if any.

        Answers ``system_prompt_append`` (the host's system prompt + "Materia active
        materia (<socketId>):" + the turn prompt — materia instructions, synthetic cast context,
        refinement guidance) and ``turn_settings``: the materia's ``model`` / ``thinking`` / ``tools``
        (re-applied for the refinement turn; encoded as in ``agent.run_turn``) for
        the harness to apply to the user's turn; ``{}`` when no cast is paused.
        """
        for cast_id, handle, view in self._statuses():
            if view.get("paused") or view.get("user_turn_visit_id"):  # the engine supersedes a stale user turn
                applied = handle.ask(CastApply(event=RefinementTurnStarted(at=time.time())), timeout=ASK_TIMEOUT_S)
                turn = applied.get("user_turn") or {}
                out: dict[str, Any] = {"cast_id": cast_id, "refining": True, "turn_settings": harness_turn_settings(
                    turn.get("model"), turn.get("thinking"), turn.get("tools"))}
                if turn.get("prompt"):
                    out["system_prompt_append"] = (f"\n\nMateria active materia ({turn.get('socket_id')}):\n"
                                                   f"{turn['prompt']}")
                return out
        return {}

    @handles(IsolateContext)
    @answers_bad_input
    def _on_context(self, message: IsolateContext) -> dict[str, Any]:
        """Cut the transcript of a user-driven refinement turn to the isolated context:
        everything before the socket's prompt becomes one synthetic message. ``{}`` when no cast
        of this session has such a turn pending (the harness keeps its messages)."""
        for _cast_id, handle in self._live().items():
            try:
                synthetic = handle.ask(UserTurnContextQuery(), timeout=ASK_TIMEOUT_S)
            except CastorError:
                continue
            if synthetic:
                return {"messages": isolate_context([m for m in message.messages if isinstance(m, dict)], synthetic)}
        return {}

    @handles(UserAgentEnded)
    @answers_bad_input
    def _on_agent_end(self, message: UserAgentEnded) -> dict[str, Any]:
        """A user run ended: answer the pending user-driven turn (newest cast first); with none
        pending, quote the last withdrawn one, which the engine reports as ``outcome_ignored`` (a late
        end is never applied). A run of castor's own turn (``turn_id``) is answered by
        ``agent.turn_ended``, never here. Answered once the transition is saved."""
        if message.turn_id is not None:
            return {}
        live = sorted(self._live().items(), reverse=True)
        for late in (False, True):
            for cast_id, handle in live:
                try:
                    visit_id = handle.ask(UserRunEnded(**answer_fields(message), late=late),
                                          timeout=ASK_TIMEOUT_S)
                except CastorError:
                    continue
                if visit_id:
                    return {"cast_id": cast_id, "visit_id": visit_id, "late": late}
        return {}

    @handles(UserRunSettled)
    @answers_bad_input
    def _on_settled(self, message: UserRunSettled) -> dict[str, Any]:
        """A user run settled (``agent_settled``, sent after its ``agent_end``). A user-driven turn still
        pending now lost its end (mistyped, lost, or an abort that produced none): withdraw it. After a
        normal end nothing is pending any more and nothing changes."""
        if message.turn_id is not None:
            return {}
        return self._withdraw_user_turns("aborted" if message.aborted else "settled_without_end")

    @handles(SessionEnding)
    @answers_bad_input
    def _on_session_end(self, message: SessionEnding) -> dict[str, Any]:
        """The harness session ends (``session_shutdown``, ``session.close``, its connection closed):
        nobody will report a pending user turn now, so it is withdrawn and saved paused before the
        casts stop — they stay resumable, and a recast resumes them paused."""
        return self._withdraw_user_turns(message.reason)

    @handles(SessionStarting)
    @answers_bad_input
    def _on_session_start(self, message: SessionStarting) -> dict[str, Any]:
        """The harness started (or resumed) its session: a cast still going that this session may
        drive -- the one an id-less status shows, run by no other session -- is named, as pi-materia
        names the cast it restores from the session. Nothing is resumed: ``continue`` or ``recast``
        does that."""
        if self._live():
            return {}
        try:
            cast_id, elsewhere, view = self._newest_to_show()
            if elsewhere:
                return {}
            if view is None:
                view = persisted_view(self.storage, self._artifact_root(), cast_id, live=False)
        except CastorError:
            return {}  # no cast, or none readable: nothing to tell
        if not view.get("active") or held_elsewhere(view):
            return {}
        phase = view.get("phase") or view.get("current_socket")
        where = f"{view['status']} at {view.get('current_socket')}" if view.get("current_socket") else view["status"]
        return {"notify": {"message": f"pi-materia cast {cast_id} restored in {one_line(str(phase))}. "
                                      f"Use {self._cmd('status')} for details.", "level": "info"},
                "status": {"key": self._footer_key(cast_id),
                           "text": f"materia: {one_line(where)}"}}

    def _withdraw_user_turns(self, reason: AbandonReason) -> dict[str, Any]:
        withdrawn: dict[str, str] = {}
        for cast_id, handle in sorted(self._live().items(), reverse=True):
            try:
                visit_id = handle.ask(WithdrawUserTurn(reason=reason), timeout=ASK_TIMEOUT_S)
            except ActorStopped as exc:
                # Its actor exited after the listing above (the cast ended as the user's run
                # settled): a cast that ended waits for no user turn; nothing to withdraw.
                self.log.debug("no user turn of cast {cast} to withdraw ({reason}): {exc}", cast=cast_id,
                               reason=reason, exc=exc)
                continue
            except CastorError as exc:
                self.log.warning("cannot withdraw the user turn of cast {cast} ({reason}): {exc}", cast=cast_id,
                                 reason=reason, exc=exc)
                continue
            if visit_id:
                withdrawn[cast_id] = visit_id
        return {"withdrawn": withdrawn} if withdrawn else {}

    # ------------------------------------------------------------------ loadouts and config
    @handles(ListLoadouts)
    @answers_bad_input
    def _on_loadouts(self, message: ListLoadouts) -> dict[str, Any]:
        return self._loadouts(message.config_path)

    def _loadouts(self, config_path: str | None) -> dict[str, Any]:
        loaded = self.storage.load_config(self.cwd, config_path=config_path or self.config_path)
        names = list((loaded.merged.get("loadouts") or {}).keys())
        active = loaded.merged.get("activeLoadout")
        source = " < ".join(layer.path for layer in loaded.layers if layer.loaded)
        return {"active": active, "loadouts": names, "source": source,
                "text": loadout_line(active, names), "level": "info"}

    @handles(SetActiveLoadout)
    @answers_bad_input
    def _on_set_loadout(self, message: SetActiveLoadout) -> dict[str, Any]:
        name, config_path = message.name, message.config_path
        live = self._active()
        if live:
            raise Conflict(f"Cannot change active loadout during active cast {max(live)}.",
                           data={"reason": "active", "cast_id": max(live)})
        path = self.storage.save_active_loadout(self.cwd, name, config_path=config_path or self.config_path)
        listing = self._loadouts(config_path)
        # pi-materia's notice ("pi-materia active loadout set to <name> (<file>)"), then the listing
        return {**listing, "path": str(path),
                "text": f"pi-materia active loadout set to {one_line(name)} ({one_line(str(path))})\n{listing['text']}"}

    @handles(RenderGrid)
    @answers_bad_input
    def _on_grid(self, message: RenderGrid) -> dict[str, Any]:
        loadout, config_path = message.loadout, message.config_path
        resolved = self._resolved(loadout, config_path)
        text = render_grid(resolved)
        return {"loadout": resolved.pipeline.loadout_name, "grid": text, "text": text, "level": "info"}

    @handles(ValidateConfig)
    @answers_bad_input
    def _on_validate(self, message: ValidateConfig) -> dict[str, Any]:
        path = message.path
        # forbidden outside the project; nothing read
        target = self.storage.confine(self.cwd, path, allow_absolute=True)
        # the layers a cast of this session runs: its --materia-config too
        issues = self.storage.validate_config_file(target, project=self.cwd, config_path=self.config_path)
        errors = [str(i) for i in issues if not i.is_warning]
        warnings = [str(i) for i in issues if i.is_warning]
        text = "\n".join(errors + warnings) if errors else "\n".join([f"{target}: valid", *warnings])
        return {"ok": not errors, "path": str(target), "errors": errors, "warnings": warnings,
                "issues": [i.model_dump() for i in issues], "text": text,
                "level": "error" if errors else "warning" if warnings else "info"}
