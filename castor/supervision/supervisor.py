"""Supervisors: restart policy for a group of children, OTP-style.

A :class:`Supervisor` is itself an actor. Children report their exits to it
as ``ChildExited`` messages; it decides, on its own thread, what happens next.

Restart decision (trigger → what the supervisor does → what senders see):

=====================  ==============  ===============================================  ========================================
child exit             restart type    supervisor action                                senders of queued messages
=====================  ==============  ===============================================  ========================================
crashed                permanent,      restart per strategy (counts toward intensity)   handled by the new incarnation
                       transient
crashed                temporary       remove the child                                 ``ActorStopped(may_have_started=False)``
stopped (normal)       permanent       restart per strategy (counts toward intensity)   handled by the new incarnation
stopped (normal)       transient,      remove the child                                 ``ActorStopped(may_have_started=False)``
                       temporary
retired                any             never restarted, never replayed; the slot stays  already rejected by the retiring actor;
                                       dormant and a *new* send starts a fresh          later sends reach a fresh incarnation
                                       incarnation (temporary children are removed)
a child past its own    —              give up on that child only: remove it             ``ActorStopped`` for everything queued
``max_restarts``                       (the supervisor does not fail)
more than R restarts   —               stop every child (reverse start order), then      ``ActorStopped`` for everything queued
within T seconds                       crash itself: the parent applies *its* policy
=====================  ==============  ===============================================  ========================================

**Direct children are started without the supervisor's thread.** For a spec with
``direct_start`` (children started often: per-request workers, per-cast actors),
:meth:`Supervisor.start_direct` (any thread; ``ActorSystem.spawn`` uses it) adds the child to
the child table and starts it on the caller's thread: no round trip through the supervisor's
mailbox. The table is shared under one lock; once the supervisor begins to terminate, the
table is closed and a direct start is refused (``spawn`` then queues it for the next
incarnation like any ``StartChild``), so no child outlives its supervisor. Exits still follow
the table above: a permanent or transient direct child reports them as ``ChildExited``, and
the supervisor decides on its own thread. A TEMPORARY one is never restarted, so nothing about
its exit needs the supervisor: its own exit removes it from the table on the child's thread
(closing its handle, then ``on_removed``; an exit the supervisor caused is bookkept by the
supervisor, as before). A per-visit worker thus costs no supervisor round trip to start and
no message to end.

Strategies: ``one_for_one`` restarts only the exited child; ``one_for_all``
stops the other children (reverse order) and restarts all (start order);
``rest_for_one`` does that for the exited child and those started after it.
Children start in list order and stop in reverse order, each within its
``shutdown_timeout``; a child that overruns is killed brutally (its owned
processes are killed and its thread abandoned).
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

from castor.messages.base import LocalMessage
from castor.messages.errors import ActorCrashed, ActorStopped, CastorError, Conflict, NotFound
from castor.supervision.actor import Actor, error_text, handles
from castor.supervision.handle import START_TIMEOUT, ActorHandle
from castor.supervision.kinds import (
    ChildExited,
    ExitKind,
    Restart,
    RestartIntensityExceeded,
    ReviveChild,
    StopChild,
    Strategy,
    WhichChildren,
)
from castor.supervision.registry import child_path

DEFAULT_MAX_RESTARTS = 3
"""Restart intensity R: at most this many restarts ..."""
DEFAULT_WITHIN_SECONDS = 5.0
"""... within this many seconds (T), else the supervisor fails to its parent."""
DEFAULT_SHUTDOWN_TIMEOUT = 5.0
"""Seconds a worker child gets to stop before it is killed brutally."""
SUPERVISOR_SHUTDOWN_TIMEOUT = 30.0
"""Seconds a supervisor child gets (it must first stop its own children)."""


@dataclass(frozen=True)
class ChildSpec:
    """How to start and restart one child."""

    id: str
    factory: Callable[[], Actor]
    restart: Restart = Restart.PERMANENT
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    mailbox_capacity: int | None = None
    revive_on_demand: bool = True  # after retirement, a new send starts a fresh incarnation
    max_restarts: int | None = None
    """Child-level intensity: past this many restarts within ``within_seconds`` the
    supervisor gives up on *this child* (removes it) instead of failing itself.
    None: only the supervisor's own intensity applies (OTP semantics)."""
    within_seconds: float = DEFAULT_WITHIN_SECONDS
    on_removed: Callable[[str], None] | None = None
    """Called (with the reason) when the supervisor removes this child instead of restarting
    it: a temporary/transient exit, a give-up past ``max_restarts``. Runs on the supervisor's
    thread, except for a temporary child's own exit, which runs it on the child's thread.
    Lets a child's owner release what outlives incarnations (a lease)."""
    direct_start: bool = False
    """``ActorSystem.spawn`` starts it on the calling thread, with no supervisor round trip; a
    TEMPORARY one also bookkeeps its own exit (see the module doc). For children started often;
    others go through the supervisor's mailbox (so a delay fault on the supervisor delays their
    start)."""

    await_start: bool = True
    """TEMPORARY ``direct_start`` only. False: ``spawn`` returns once the child's loop is handed to
    a thread, without waiting for its ``on_start`` (which then runs concurrently; raising there is
    a crash like any other). For a child whose starter has nothing to order after its start."""

    def __post_init__(self) -> None:
        if self.mailbox_capacity is not None and (type(self.mailbox_capacity) is not int or self.mailbox_capacity < 1):
            raise ValueError(f"mailbox_capacity must be an int >= 1 or None, not {self.mailbox_capacity!r}")
        if not self.await_start and not (self.direct_start and self.restart is Restart.TEMPORARY):
            raise ValueError("await_start=False is for TEMPORARY direct_start children only")


def supervisor_spec(
    id: str,
    children: Sequence[ChildSpec] = (),
    *,
    strategy: Strategy = Strategy.ONE_FOR_ONE,
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    within_seconds: float = DEFAULT_WITHIN_SECONDS,
    restart: Restart = Restart.PERMANENT,
) -> ChildSpec:
    """A ChildSpec whose child is a supervisor of ``children``."""
    return ChildSpec(
        id=id,
        factory=lambda: Supervisor(
            strategy=strategy, max_restarts=max_restarts, within_seconds=within_seconds, children=children
        ),
        restart=restart,
        shutdown_timeout=SUPERVISOR_SHUTDOWN_TIMEOUT,
    )


# -- the supervisor's messages: StartChild carries a ChildSpec (callables), so it is defined
# here; the others are in castor.supervision.kinds (the handle and the system send them too).
class StartChild(LocalMessage, type_name="supervisor.start_child"):
    spec: ChildSpec


@dataclass
class _Intensity:
    max_restarts: int
    within_seconds: float
    times: deque[float] = field(default_factory=deque)

    def allow(self) -> bool:
        """Record one restart; False when it exceeds R within T."""
        now = time.monotonic()
        while self.times and now - self.times[0] > self.within_seconds:
            self.times.popleft()
        self.times.append(now)
        return len(self.times) <= self.max_restarts


@dataclass
class _Slot:
    spec: ChildSpec
    handle: ActorHandle
    stopping: bool = False
    intensity: _Intensity | None = None


class Supervisor(Actor):
    """Starts, watches and restarts its children; fails upward past its intensity."""

    def __init__(
        self,
        *,
        strategy: Strategy = Strategy.ONE_FOR_ONE,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        within_seconds: float = DEFAULT_WITHIN_SECONDS,
        children: Sequence[ChildSpec] = (),
    ) -> None:
        super().__init__()
        self.strategy = Strategy(strategy)
        self._intensity = _Intensity(max_restarts, within_seconds)
        self._initial = list(children)
        self._slots: dict[str, _Slot] = {}  # by path, in start order (O(1) find/remove with many children)
        # Guards _slots and _closed: direct children are added, and temporary ones removed, on
        # other threads.
        self._table = threading.Lock()
        self._closed = False

    # -- lifecycle ---------------------------------------------------------
    def on_start(self) -> None:
        self.handle.restart_budget = ("children", self._intensity)  # snapshots say how much is used
        for spec in self._initial:
            self._start(spec)

    def on_terminate(self, cause: ExitKind) -> None:
        self._stop_children(f"supervisor {self.path} {cause}")

    def after_cut_loose(self) -> None:
        """Cut loose in a handler that overran this supervisor's stop (a child slower to stop or
        start than its parent waits): once that handler returns, the children are stopped all the
        same, in reverse start order -- none outlives its supervisor."""
        self._stop_children(f"supervisor {self.path} cut loose")

    def _stop_children(self, reason: str) -> None:
        with self._table:
            self._closed = True  # no direct child can be added from now on
            slots = list(self._slots.values())
        for slot in reversed(slots):
            self._shutdown(slot, close=True, reason=reason)
        with self._table:
            self._slots.clear()

    # -- direct children (any thread) ----------------------------------------
    def start_direct(self, spec: ChildSpec, *, start_timeout: float) -> ActorHandle | None:
        """Start a ``direct_start`` child from the calling thread; None if this incarnation is ending.

        Same answers as a ``StartChild``: the handle once the child's ``on_start`` has finished
        (at most ``start_timeout``; at once with ``await_start=False``), ``Conflict`` for an id
        in use, the factory's error if it cannot start. A temporary child's exit is bookkept on
        its own thread; any other reports ``ChildExited`` (see the module doc).
        """
        if not spec.direct_start:
            raise ValueError("start_direct takes direct_start children only")
        path = child_path(self.path, spec.id)
        handle = self._new_handle(path, spec)
        slot = self._new_slot(spec, handle)
        handle.on_exit = self._temporary_exited if spec.restart is Restart.TEMPORARY else _report_exit_to(self.handle)
        with self._table:
            if self._closed:
                return None
            if path in self._slots:
                raise Conflict(f"child {spec.id!r} already exists under {self.path}", data={"path": path})
            self._slots[path] = slot
            try:
                # Under the table lock, so a terminating supervisor either sees this child
                # running (and stops it) or refuses it; the wait for on_start is outside.
                actor = handle.prepare_launch()
                if not actor.start_on_caller:
                    actor.begin_incarnation()
            except BaseException:  # even a KeyboardInterrupt: no slot may stay behind, holding the id
                self._slots.pop(path, None)
                handle.close("failed to start")
                raise
        if actor.start_on_caller:
            # Outside the lock: its on_start may end the incarnation, whose exit takes the lock.
            actor.begin_incarnation()
        started = actor.start_latch
        if started is not None and spec.await_start and not started.wait(start_timeout):
            handle.log_slow_start(start_timeout)
        return handle

    def _temporary_exited(self, child: ActorHandle, _incarnation: int, kind: ExitKind) -> None:
        """A temporary child ended (on the thread it ended on): it leaves the table, never restarted.

        An exit the supervisor caused (a stop by request, a sibling restart, its own
        shutdown: the slot is ``stopping``) is left to the stopper, as a ``ChildExited``
        would be: it removes the slot itself and ``on_removed`` is not called.
        """
        with self._table:
            slot = self._slots.get(child.path)
            if slot is None or slot.handle is not child or slot.stopping:
                return
            del self._slots[child.path]
        self._finish_removal(slot, f"exited ({kind}), restart=temporary")

    # -- handlers ------------------------------------------------------------
    @handles(StartChild)
    def _on_start_child(self, message: StartChild) -> ActorHandle:
        spec = message.spec
        try:
            if spec.direct_start:  # its exit is bookkept the direct way, wherever it was started
                handle = self.start_direct(spec, start_timeout=START_TIMEOUT)
                if handle is None:
                    raise ActorStopped(f"{self.path} is stopping", may_have_started=False)
                return handle
            return self._start(spec)
        except CastorError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the child's factory failed: the starter's answer, not this supervisor's crash
            # Even a KeyboardInterrupt, SystemExit or GeneratorExit: the factory ran on this
            # supervisor's thread, never the main one, so no signal raised it and no process exit
            # is at stake; it is the factory's own failure, as an Exception would be.
            failed = ActorCrashed(
                f"{child_path(self.path, spec.id)} failed to start: {type(exc).__name__}",
                data={"path": child_path(self.path, spec.id), "error_type": type(exc).__name__},
                may_have_started=False,
            )
            raise failed from exc

    @handles(StopChild)
    def _on_stop_child(self, message: StopChild) -> bool:
        slot = self._find(child_path(self.path, message.id))
        if slot is None:
            raise NotFound(f"no child {message.id!r} under {self.path}")
        self._shutdown(slot, close=True, reason="stopped by request")
        with self._table:
            if self._slots.get(slot.handle.path) is slot:
                del self._slots[slot.handle.path]
        return True

    @handles(WhichChildren)
    def _on_which_children(self, _message: WhichChildren) -> list[str]:
        with self._table:
            return list(self._slots)

    @handles(ReviveChild)
    def _on_revive(self, message: ReviveChild) -> None:
        slot = self._find(message.path)
        if slot is None or slot.handle.alive:
            return
        self.log.info("fresh incarnation on new demand: {path}", path=message.path)
        self._launch_or_escalate(slot)

    @handles(ChildExited)
    def _on_child_exited(self, message: ChildExited) -> None:
        slot = self._find(message.path)
        if slot is None or slot.stopping or slot.handle.incarnation != message.incarnation or slot.handle.alive:
            return  # stale: an exit we caused, or of an incarnation already replaced
        restart = slot.spec.restart
        if message.kind is ExitKind.RETIRED:
            if not slot.handle.revive_on_demand:
                self._remove(slot, "retired")
            elif slot.handle.has_new_demand:
                # A send arrived between the mailbox closing and the old incarnation
                # exiting; its ReviveChild was ignored then (still alive). Serve it now.
                self._launch_or_escalate(slot)
            return
        if message.kind is ExitKind.CRASHED:
            wanted = restart is not Restart.TEMPORARY
        else:
            wanted = restart is Restart.PERMANENT
        if not wanted:
            self._remove(slot, f"exited ({message.kind}), restart={restart}")
            return
        self._restart(slot, message)

    # -- policy ----------------------------------------------------------------
    def _restart(self, failed: _Slot, message: ChildExited) -> None:
        if failed.intensity is not None and not failed.intensity.allow():
            self.log.error("giving up on {path}: more than {r} restarts in {t}s", path=failed.handle.path,
                           r=failed.intensity.max_restarts, t=failed.intensity.within_seconds)
            self._remove(failed, "gave up: the child's own restart intensity was exceeded")
            return
        if not self._intensity.allow():
            raise RestartIntensityExceeded(
                f"{self.path}: more than {self._intensity.max_restarts} restarts in "
                f"{self._intensity.within_seconds}s (last: {message.path} {message.kind}: {message.error})"
            )
        with self._table:
            slots = list(self._slots.values())
        if self.strategy is Strategy.ONE_FOR_ONE:
            affected = [failed]
        elif self.strategy is Strategy.ONE_FOR_ALL:
            affected = slots
        else:
            affected = slots[slots.index(failed):]
        for slot in reversed(affected):
            if slot is not failed and slot.handle.alive:
                self._shutdown(slot, close=False, reason="sibling restart")
        for slot in affected:
            if slot is not failed and slot.spec.restart is Restart.TEMPORARY:
                self._remove(slot, "temporary sibling not restarted")
                continue
            slot.handle.restarts += 1
            slot.handle.registry.meters.count("restarts", slot.handle.kind)
            self.log.info("restarting {path} ({strategy})", path=slot.handle.path, strategy=self.strategy)
            self._launch_or_escalate(slot)

    def _launch_or_escalate(self, slot: _Slot) -> None:
        while True:
            try:
                slot.handle.launch()
                return
            except BaseException as exc:  # noqa: BLE001 - a factory that raises (anything) is a failed start
                self.log.opt(exception=exc).error("child {path} failed to start", path=slot.handle.path)
                if not self._intensity.allow():
                    raise RestartIntensityExceeded(f"{slot.handle.path} cannot start: {exc!r}") from exc

    # -- mechanics -------------------------------------------------------------
    def _new_handle(self, path: str, spec: ChildSpec) -> ActorHandle:
        return ActorHandle(
            path,
            factory=spec.factory,
            supervisor=self.handle,
            registry=self.handle.registry,
            mailbox_capacity=spec.mailbox_capacity,
            revive_on_demand=spec.revive_on_demand and spec.restart is not Restart.TEMPORARY,
        )

    @staticmethod
    def _new_slot(spec: ChildSpec, handle: ActorHandle) -> _Slot:
        slot = _Slot(spec, handle, intensity=(
            _Intensity(spec.max_restarts, spec.within_seconds) if spec.max_restarts is not None else None))
        if slot.intensity is not None:
            handle.restart_budget = ("self", slot.intensity)  # the child's own limit, in its snapshots
        return slot

    def _start(self, spec: ChildSpec) -> ActorHandle:
        path = child_path(self.path, spec.id)
        handle = self._new_handle(path, spec)
        handle.on_exit = _report_exit_to(self.handle)
        slot = self._new_slot(spec, handle)
        with self._table:
            if path in self._slots:
                raise Conflict(f"child {spec.id!r} already exists under {self.path}", data={"path": path})
            self._slots[path] = slot
        try:
            handle.launch()
        except BaseException:  # whatever the factory raised, no slot may stay behind holding the id
            with self._table:
                self._slots.pop(path, None)
            handle.close("failed to start")
            raise
        return handle

    def _shutdown(self, slot: _Slot, *, close: bool, reason: str) -> None:
        slot.stopping = True
        try:
            if slot.handle.alive and not slot.handle.stop(slot.spec.shutdown_timeout):
                self.log.warning("{path} overran its shutdown timeout; killed", path=slot.handle.path)
                slot.handle.abandon()
            if close:
                slot.handle.close(reason)
        finally:
            slot.stopping = False

    def _remove(self, slot: _Slot, reason: str) -> None:
        with self._table:
            if self._slots.get(slot.handle.path) is not slot:
                return  # a temporary child that already removed itself
            del self._slots[slot.handle.path]
        self._finish_removal(slot, reason)

    def _finish_removal(self, slot: _Slot, reason: str) -> None:
        slot.handle.close(reason)
        if slot.spec.on_removed is not None:
            try:
                slot.spec.on_removed(reason)
            except Exception as exc:  # noqa: BLE001 - a hook must not break the supervisor
                self.log.opt(exception=exc).error("on_removed of {path} failed", path=slot.handle.path)

    def _find(self, path: str) -> _Slot | None:
        return self._slots.get(path)  # a single dict read: atomic, no table lock needed


def _report_exit_to(supervisor: ActorHandle) -> Callable[[ActorHandle, int, ExitKind], None]:
    def report(child: ActorHandle, incarnation: int, kind: ExitKind) -> None:
        last = child.last_error
        error = error_text(last, as_repr=True) if kind is ExitKind.CRASHED and last is not None else None
        try:
            supervisor.tell(ChildExited(path=child.path, incarnation=incarnation, kind=kind, error=error))
        except CastorError:
            child.close("supervisor gone")  # nobody will restart it: reject what is queued

    return report


__all__ = [
    "DEFAULT_MAX_RESTARTS", "DEFAULT_SHUTDOWN_TIMEOUT", "DEFAULT_WITHIN_SECONDS", "SUPERVISOR_SHUTDOWN_TIMEOUT",
    "ChildExited", "ChildSpec", "Restart", "RestartIntensityExceeded", "ReviveChild", "StartChild", "StopChild",
    "Strategy", "Supervisor", "WhichChildren", "supervisor_spec",
]
