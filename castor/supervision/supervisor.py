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

Strategies: ``one_for_one`` restarts only the exited child; ``one_for_all``
stops the other children (reverse order) and restarts all (start order);
``rest_for_one`` does that for the exited child and those started after it.
Children start in list order and stop in reverse order, each within its
``shutdown_timeout``; a child that overruns is killed brutally (its owned
processes are killed and its thread abandoned).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable, Sequence


from castor.messages.base import LocalMessage
from castor.messages.errors import CastorError, Conflict, NotFound
from castor.supervision.actor import Actor, handles
from castor.supervision.handle import ActorHandle
from castor.supervision.registry import child_path

DEFAULT_MAX_RESTARTS = 3
"""Restart intensity R: at most this many restarts ..."""
DEFAULT_WITHIN_SECONDS = 5.0
"""... within this many seconds (T), else the supervisor fails to its parent."""
DEFAULT_SHUTDOWN_TIMEOUT = 5.0
"""Seconds a worker child gets to stop before it is killed brutally."""
SUPERVISOR_SHUTDOWN_TIMEOUT = 30.0
"""Seconds a supervisor child gets (it must first stop its own children)."""


class Strategy(StrEnum):
    ONE_FOR_ONE = "one_for_one"
    ONE_FOR_ALL = "one_for_all"
    REST_FOR_ONE = "rest_for_one"


class Restart(StrEnum):
    PERMANENT = "permanent"
    TRANSIENT = "transient"
    TEMPORARY = "temporary"


class RestartIntensityExceeded(Exception):
    """A supervisor saw more than R restarts in T seconds; it fails to its parent."""


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
    """Called (on the supervisor's thread, with the reason) when the supervisor removes
    this child instead of restarting it: a temporary/transient exit, a give-up past
    ``max_restarts``. Lets a child's owner release what outlives incarnations (a lease)."""


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


# -- messages the supervisor handles (local only: they carry callables) -------
_Local = LocalMessage


class StartChild(_Local, type_name="supervisor.start_child"):
    spec: Any  # ChildSpec


class StopChild(_Local, type_name="supervisor.stop_child"):
    id: str


class ChildExited(_Local, type_name="supervisor.child_exited"):
    path: str
    incarnation: int
    kind: str  # stopped | crashed | retired
    error: str | None = None


class ReviveChild(_Local, type_name="supervisor.revive_child"):
    path: str


class WhichChildren(_Local, type_name="supervisor.which_children"):
    pass


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

    # -- lifecycle ---------------------------------------------------------
    def on_start(self) -> None:
        for spec in self._initial:
            self._start(spec)

    def on_terminate(self, cause: str) -> None:
        for slot in reversed(list(self._slots.values())):
            self._shutdown(slot, close=True, reason=f"supervisor {self.path} {cause}")
        self._slots.clear()

    # -- handlers ------------------------------------------------------------
    @handles(StartChild)
    def _on_start_child(self, message: StartChild) -> ActorHandle:
        return self._start(message.spec)

    @handles(StopChild)
    def _on_stop_child(self, message: StopChild) -> bool:
        slot = self._find(child_path(self.path, message.id))
        if slot is None:
            raise NotFound(f"no child {message.id!r} under {self.path}")
        self._shutdown(slot, close=True, reason="stopped by request")
        self._slots.pop(slot.handle.path, None)
        return True

    @handles(WhichChildren)
    def _on_which_children(self, _message: WhichChildren) -> list[str]:
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
        if message.kind == "retired":
            if not slot.handle.revive_on_demand:
                self._remove(slot, "retired")
            elif slot.handle.has_new_demand:
                # A send arrived between the mailbox closing and the old incarnation
                # exiting; its ReviveChild was ignored then (still alive). Serve it now.
                self._launch_or_escalate(slot)
            return
        if message.kind == "crashed":
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
            self.log.info("restarting {path} ({strategy})", path=slot.handle.path, strategy=self.strategy)
            self._launch_or_escalate(slot)

    def _launch_or_escalate(self, slot: _Slot) -> None:
        while True:
            try:
                slot.handle.launch()
                return
            except Exception as exc:  # noqa: BLE001 - a factory that raises is a failed start
                self.log.opt(exception=exc).error("child {path} failed to start", path=slot.handle.path)
                if not self._intensity.allow():
                    raise RestartIntensityExceeded(f"{slot.handle.path} cannot start: {exc!r}") from exc

    # -- mechanics -------------------------------------------------------------
    def _start(self, spec: ChildSpec) -> ActorHandle:
        path = child_path(self.path, spec.id)
        if self._find(path) is not None:
            raise Conflict(f"child {spec.id!r} already exists under {self.path}", data={"path": path})
        handle = ActorHandle(
            path,
            factory=spec.factory,
            supervisor=self.handle,
            registry=self.handle.registry,
            mailbox_capacity=spec.mailbox_capacity,
            revive_on_demand=spec.revive_on_demand and spec.restart is not Restart.TEMPORARY,
        )
        handle._on_exit = _report_exit_to(self.handle)
        slot = _Slot(spec, handle, intensity=(
            _Intensity(spec.max_restarts, spec.within_seconds) if spec.max_restarts is not None else None))
        self._slots[path] = slot
        try:
            handle.launch()
        except Exception:
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
        slot.handle.close(reason)
        self._slots.pop(slot.handle.path, None)
        if slot.spec.on_removed is not None:
            try:
                slot.spec.on_removed(reason)
            except Exception as exc:  # noqa: BLE001 - a hook must not break the supervisor
                self.log.opt(exception=exc).error("on_removed of {path} failed", path=slot.handle.path)

    def _find(self, path: str) -> _Slot | None:
        return self._slots.get(path)


def _report_exit_to(supervisor: ActorHandle) -> Callable[[ActorHandle, int, str], None]:
    def report(child: ActorHandle, incarnation: int, kind: str) -> None:
        error = repr(child.last_error) if kind == "crashed" and child.last_error is not None else None
        try:
            supervisor.tell(ChildExited(path=child.path, incarnation=incarnation, kind=kind, error=error))
        except CastorError:
            child.close("supervisor gone")  # nobody will restart it: reject what is queued

    return report
