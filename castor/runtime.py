"""The runtime: one actor system, its session tree and shared pools.

Actor tree (paths are stable; see docs/architecture.md)::

    /root                                   root supervisor (one_for_one)
    /root/utility                           utility executor pool (supervisor)
    /root/utility/slot-<n>                  UtilityExecutorActor
    /root/session                           all harness sessions (supervisor)
    /root/session/<sid>                     one session (supervisor, one_for_one)
    /root/session/<sid>/<component>/...     what each session component adds
                                            (materia: ``materia``, ``cast/<id>``;
                                            icarus: ``icarus/...``)

A *session component* (the contract is :mod:`castor.ports.session_component`) contributes
children to every session supervisor, plus optional ``harness.event`` listeners. Components
are how the materia and Icarus systems plug into a session without the runtime knowing either;
:mod:`castor.composition` passes the default ones in.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from castor import tree
from castor._log import logger
from castor.adapters.fs import check_project_dir, project_artifact_root
from castor.adapters.memory_return import MemoryReturn, limit_malloc_arenas
from castor.messages.errors import CastorError, Conflict, MailboxFull, NotFound, Timeout
from castor.messages.ids import check_safe_id
from castor.ports.session_component import (
    AnsweringEventListener,
    EarlyAnswer,
    EventListener,
    HarnessLink,
    RuntimeSettings,
    SessionComponent,
    SessionContext,
    SessionInfo,
)
from castor.supervision import ActorHandle, ActorSystem, ChildSpec
from castor.supervision.actor import running_actor
from castor.supervision.threads import start_thread

SESSIONS_PATH = "/root/session"
SLOW_CLOSE_NOTE_S = 2.0
"""While castor stops, how long a session may take to close before the log says what it waits on."""
SLOW_CLOSE_REPEAT_S = 10.0
"""How often it is said again while that session still has not closed."""
UTILITY_PATH = "/root/utility"




def _merged_answer(before: dict[str, Any], answer: Callable[[dict[str, Any]], None]) -> EarlyAnswer:
    """An early answer for the last component: its part merged over the parts answered before it."""

    def answer_part(result: dict[str, Any] | None) -> None:
        answer({**before, **result} if result else before)

    return answer_part


class Runtime:
    """One castor runtime: actor system, sessions, components, shared pools.

    The runtime builds no session component itself: ``components`` are what every session gets,
    in order (default: none — a bare runtime whose sessions have no children). The materia and
    Icarus components with their file and process adapters are put together by
    :mod:`castor.composition` (``castor.composition.build_runtime(settings)``, or
    ``Runtime(settings, components=castor.composition.default_components())``).
    """

    def __init__(
        self,
        settings: RuntimeSettings | None = None,
        *,
        components: Sequence[SessionComponent] = (),
        extra_children: list[ChildSpec] | None = None,
        scaleout: Any = None,
    ) -> None:
        self.settings = settings or RuntimeSettings()
        self.scaleout = scaleout  # castor.scaleout's RayBackend when casts run on a cluster, else None
        self.components = list(components)
        # Before the first actor thread starts: the arenas threads made before stay (module doc).
        limit_malloc_arenas(self.settings.malloc_arenas)
        # The components with a harness-event listener, in order (dispatch_event), found once.
        self._listeners = tuple(component for component in self.components if component.on_event is not None)
        self._sessions: dict[str, SessionContext] = {}
        # A session whose close is under way (keyed by its context: a reopened id is another
        # session): a second close waits for the first instead of stopping its actors under it.
        self._closing: dict[int, threading.Event] = {}
        self._lock = threading.Lock()
        children = [
            *_utility_children(self.settings),
            tree.SESSIONS.supervisor_spec(),
            *(extra_children or []),
        ]
        self.system = ActorSystem(children, **tree.ROOT.supervisor_args())
        self.log = logger.bind(actor="/runtime")
        meters = self.system.registry.meters
        #: Returns the allocator's free pages after each closed session (castor.adapters.memory_return).
        self.memory_return = MemoryReturn(self.settings.memory_return_interval_s,
                                          on_trim=lambda s: meters.observe("memory_trim_seconds", "runtime", s))

    # -- sessions ------------------------------------------------------------
    def open_session(self, info: SessionInfo, harness: HarnessLink, *, keep_free: int = 0) -> SessionContext:
        """Start ``/root/session/<sid>`` with every component's children.

        Opening an already-open session id replaces its harness link only if
        the old one is gone; otherwise it is a ``conflict``. Over ``max_sessions`` it is
        ``mailbox_full``; so it is when it would leave fewer than ``keep_free`` slots free (at most
        half the limit is ever kept: the endpoint keeps them for the first session of a connection
        that holds none, ``data.reason: kept_for_first_sessions``). Both checks and the count are
        under one lock: two opens never both take the last slot.
        """
        check_safe_id(info.session_id, "session_id")  # the refusal names the field the caller sent
        check_project_dir(info.cwd)
        path = f"{SESSIONS_PATH}/{info.session_id}"
        if self.system.stopping.is_set():  # shut down: actor_stopped, as for any spawn (docs/supervision.md)
            raise self.system.stopped_error(path)
        with self._lock:
            if info.session_id in self._sessions and not self._gone(self._sessions[info.session_id]):
                raise Conflict(f"session {info.session_id!r} is already open", data={"session_id": info.session_id})
            self._sessions.pop(info.session_id, None)  # gone (given up, or lost with its parent): reopen
            if len(self._sessions) >= self.settings.max_sessions:
                raise MailboxFull(f"the runtime has {len(self._sessions)} open sessions, its limit; close one first",
                                  data={"limit": self.settings.max_sessions})
            kept = min(keep_free, self.settings.max_sessions // 2)
            if kept and len(self._sessions) >= self.settings.max_sessions - kept:
                raise MailboxFull(
                    f"the runtime has {len(self._sessions)} open sessions; its last {kept} of "
                    f"{self.settings.max_sessions} are kept for connections opening their first session; "
                    "close one first", data={"limit": self.settings.max_sessions, "kept": kept,
                                             "reason": "kept_for_first_sessions"})
            ctx = SessionContext(info=info, harness=harness, runtime=self, path=path)
            self._sessions[info.session_id] = ctx
        try:
            specs: list[ChildSpec] = []
            for component in self.components:
                specs.extend(component.children(ctx))
            spec = tree.SESSION.supervisor_spec(specs, id=info.session_id,
                                                max_restarts=self.settings.session_restart_intensity)
            spec = dataclasses.replace(spec, on_removed=lambda reason: self._forget(ctx, reason))
            self.system.spawn(spec, under=SESSIONS_PATH, timeout=self.settings.session_open_timeout_s)
        except BaseException as exc:
            with self._lock:
                if self._sessions.get(info.session_id) is ctx:
                    self._sessions.pop(info.session_id, None)
            if isinstance(exc, Timeout):
                # The supervisor may still start it after the answer came too late: stop it then
                # (its StartChild is ahead in the same mailbox), so the id is not held forever.
                start_thread(self._stop_late_child, args=(path,), name=f"late-session-{info.session_id}",
                             owner=SESSIONS_PATH, purpose="stops a session that started after its open timed out")
            raise
        _label_session(self.system.find(path), info)
        self.log.info("session opened: {sid}", sid=info.session_id)
        return ctx

    def has_session(self, session_id: str) -> bool:
        """Whether ``session_id`` is open and its actors run."""
        with self._lock:
            ctx = self._sessions.get(session_id)
        return ctx is not None and not self._gone(ctx)

    def _gone(self, ctx: SessionContext) -> bool:
        """The session's supervisor no longer runs (it gave up, or went with its parent)."""
        handle = self.system.registry.find(ctx.path)
        return handle is None or handle.closed.is_set()

    def _forget(self, ctx: SessionContext, reason: str) -> None:
        with self._lock:
            if self._sessions.get(ctx.info.session_id) is ctx:
                self._sessions.pop(ctx.info.session_id, None)
                self.log.warning("session {sid} is gone ({reason}); it may be opened again",
                                 sid=ctx.info.session_id, reason=reason)

    def _stop_late_child(self, path: str) -> None:
        try:
            self.system.stop_child(path, timeout=120.0)
        except CastorError:
            pass

    def session(self, session_id: str) -> SessionContext:
        with self._lock:
            ctx = self._sessions.get(session_id)
        if ctx is None:
            raise NotFound(f"no open session {session_id!r}", data={"session_id": session_id})
        return ctx

    def sessions(self) -> list[SessionContext]:
        with self._lock:
            return list(self._sessions.values())

    def close_session(self, session_id: str, *, timeout: float = 30.0, opened_by: object | None = None) -> None:
        """Run component close hooks, then stop the session's actors (casts persist their state).

        ``opened_by`` (the harness agent link the session was opened with) makes the close
        conditional: a connection that closes after its session gave up, and after another
        connection opened the same id again, must close nothing of that newer session — when the
        id's current session was opened with another link, this returns without doing anything.
        Whatever the caller, the id's entry is forgotten only if it is still the session this call
        closed (a reopen that slipped in once the actors stopped keeps its entry). A session closed
        twice at once is closed once: the second call waits (up to ``timeout``) for the first.
        """
        ctx = self.session(session_id)
        if opened_by is not None and ctx.harness.agent is not opened_by:
            return
        with self._lock:
            underway = self._closing.get(id(ctx))
            if underway is None:
                self._closing[id(ctx)] = threading.Event()
        if underway is not None:
            # Closed twice at once (the harness closes its session as castor serve stops): the
            # first close runs the close hooks -- Icarus's on_session_end in the worker -- and this
            # one stopping the session's actors meanwhile killed that call mid-way.
            underway.wait(timeout)
            return
        try:
            self._close_session(session_id, ctx, timeout)
        finally:
            with self._lock:
                done = self._closing.pop(id(ctx), None)
            if done is not None:
                done.set()

    def _close_session(self, session_id: str, ctx: SessionContext, timeout: float) -> None:
        for component in self.components:
            if component.on_close is not None:
                try:
                    component.on_close(ctx)
                except Exception as exc:  # noqa: BLE001 - one component must not block the others
                    self.log.opt(exception=exc).error("{name}.on_close failed", name=component.name)
        try:
            self.system.stop_child(ctx.path, timeout=timeout)
        except NotFound:
            pass
        with self._lock:
            if self._sessions.get(session_id) is ctx:
                self._sessions.pop(session_id, None)
        self.log.info("session closed: {sid}", sid=session_id)
        self.memory_return.work_ended()

    def dispatch_event(self, session_id: str, event: str, data: dict[str, Any], *,
                       answer: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Offer a harness event to every component; merge their results (later keys win).

        ``answer``: how to answer the caller before this returns (the endpoint's early answer),
        handed to the last component with a listener if it ``answers_early``, merged with what
        the components before it answered (an early answer must carry their parts too)."""
        ctx = self.session(session_id)
        merged: dict[str, Any] = {}
        listeners = self._listeners
        for component in listeners:
            assert component.on_event is not None
            if answer is not None and component is listeners[-1] and component.answers_early:
                listener = cast(AnsweringEventListener, component.on_event)  # answers_early: it takes answer=
                result = listener(ctx, event, data, answer=_merged_answer(dict(merged), answer))
            else:
                result = component.on_event(ctx, event, data)
            if result:
                merged.update(result)
        return merged

    # -- lifecycle -------------------------------------------------------------
    def shutdown(self, timeout: float = 30.0) -> bool:
        """Close every session (casts stay resumable), end running utility commands gently
        (SIGTERM to each tree, SIGKILL after a second: after the casts, so none re-dispatches),
        then stop every actor.

        Called from inside one of the runtime's actors (which that shutdown must stop, once the
        handler that calls has returned), it runs on a thread of its own and returns False at
        once instead of waiting for its caller. A second call finds nothing left to stop."""
        from castor.actors.materia.utility_pool import UTILITY_STOP_GRACE_S, terminate_running

        here = running_actor()
        if here is not None and here.registry is self.system.registry:
            start_thread(self.shutdown, args=(timeout,), name="runtime-shutdown", owner="/root",
                         purpose="shuts the runtime down for one of its actors, which cannot wait for its own stop")
            return False

        self.close_sessions(timeout)
        terminate_running(self.system.registry, grace_s=UTILITY_STOP_GRACE_S)
        self.memory_return.stop()
        return self.system.shutdown(timeout)

    def close_sessions(self, timeout: float = 30.0, *, say_casts_left: bool = False) -> None:
        """Close every open session (casts stay resumable; a turn a harness runs for one is stopped
        with ``agent.abort_turn {reason: cast_stopped}``), each given ``timeout``. A session whose
        close fails is logged and the rest are closed all the same; one closed meanwhile by its
        own harness (it disconnected as the runtime stopped) is no failure and is skipped.

        ``say_casts_left`` (a serve stopping: its log is all an operator has): each cast still
        active in a session is then one WARNING naming it, its session and project, where it was and
        what it did, and the ``castor status`` command that says how to go on with it."""
        for ctx in self.sessions():
            if say_casts_left:
                self._say_the_casts_left(ctx)
            closed = threading.Event()
            start_thread(self._say_a_slow_close, args=(ctx.info.session_id, closed),
                         name=f"closing-session-{ctx.info.session_id}", owner="/runtime",
                         purpose="says what a session slow to close waits on while castor stops")
            try:
                self.close_session(ctx.info.session_id, timeout=timeout)
            except NotFound:
                continue  # closed meanwhile (its connection went away): nothing left to close
            except Exception as exc:  # noqa: BLE001 - shutdown goes on whatever one component's close raises
                self.log.opt(exception=exc).error("closing session {sid} failed", sid=ctx.info.session_id)
            finally:
                closed.set()

    def _say_the_casts_left(self, ctx: SessionContext) -> None:
        """One WARNING per cast of ``ctx``'s session still active as the runtime stops it (read
        from its actor's activity: nothing is asked of the cast)."""
        import shlex

        sid, cwd = ctx.info.session_id, ctx.info.cwd
        for actor in self.system.snapshot_data(f"{SESSIONS_PATH}/{sid}/cast")["actors"]:
            activity = actor.get("activity") or {}
            data = activity.get("data") or {}
            cast_id = data.get("cast_id")
            if actor.get("kind") != "CastActor" or not isinstance(cast_id, str) or data.get("active") is False \
                    or activity.get("kind") == "ended":
                continue
            where = data.get("socket") or data.get("phase") or "its start"
            self.log.warning("stopping: cast {cid} of session {sid} ({cwd}) was left active at {where} ({doing}); "
                             "{command} says how to go on", cid=cast_id, sid=sid, cwd=cwd, where=where,
                             doing=activity.get("text") or "idle",
                             command=f"castor status {cast_id} --cwd {shlex.quote(cwd)}")

    def _say_a_slow_close(self, session_id: str, closed: threading.Event) -> None:
        """While castor stops, a session that has not closed after ``SLOW_CLOSE_NOTE_S`` (and every
        ``SLOW_CLOSE_REPEAT_S`` after) is one WARNING naming it and what its actors do (their
        activities: a worker call and its deadline, a command; never a prompt): its socket is gone
        by then, so the log is the one place an operator learns what the stop waits on."""
        wait, waited = SLOW_CLOSE_NOTE_S, 0.0
        while not closed.wait(wait):
            waited += wait
            wait = SLOW_CLOSE_REPEAT_S
            doing = []
            for actor in self.system.snapshot_data(f"{SESSIONS_PATH}/{session_id}")["actors"]:
                activity = actor.get("activity") or {}
                if activity.get("kind") in (None, "idle"):
                    continue
                left = activity.get("deadline_in_s")
                bound = f" (deadline in {left:.1f}s)" if isinstance(left, (int, float)) and left >= 0 else ""
                doing.append(f"{actor['path']}: {activity.get('text')}{bound}")
            self.log.warning("stopping: still closing session {sid} after {s:.0f} s; it waits on: {doing}",
                             sid=session_id, s=waited, doing="; ".join(doing) or "nothing an actor reports")

    def artifact_root_for(self, cwd: str, configured: str | None) -> Path:
        """Where a session's casts write artifacts.

        The runtime's own override (CLI/environment) is taken as given. A
        configured ``artifactDir`` is user data: relative to the project and
        never outside it (``forbidden`` otherwise), so a hostile config cannot
        make a cast write into ``/etc`` or a sibling checkout.
        """
        if self.settings.artifact_root:
            return Path(self.settings.artifact_root).resolve()
        return project_artifact_root(cwd, configured)


def _label_session(handle: ActorHandle | None, info: SessionInfo) -> None:
    """What an operator sees for a session besides its id: its project directory and a label."""
    if handle is not None:
        label = info.flags.get("label") if isinstance(info.flags.get("label"), str) else None
        handle.labels = {"project": info.cwd, "label": (label or Path(info.cwd).name or info.cwd)[:200]}


def _utility_children(settings: RuntimeSettings) -> list[ChildSpec]:
    from castor.actors.materia.utility_pool import utility_pool_spec
    from castor.adapters.materia.local_utilities import LOCAL_UTILITY_RUNNER

    return [utility_pool_spec(settings, LOCAL_UTILITY_RUNNER)]


__all__ = [
    "SESSIONS_PATH", "UTILITY_PATH", "EventListener", "HarnessLink", "Runtime", "RuntimeSettings", "SessionComponent",
    "SessionContext", "SessionInfo", "check_project_dir", "project_artifact_root",
]
