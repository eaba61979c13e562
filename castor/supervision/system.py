"""ActorSystem: one root supervisor, one registry, one runtime.

The root supervisor lives at ``/root``. If it fails (its restart intensity is
exhausted by failures escalating from below) the system is *fatally failed*:
``fatal`` is set, the failure is logged, and every actor is already stopped.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

from castor._log import logger
from castor.messages.errors import ActorStopped, InvalidParams
from castor.messages.inspection import ActorSnapshot, TreeSnapshot, at_or_under
from castor.supervision.actor import error_text, running_actor
from castor.supervision.handle import ActorHandle
from castor.supervision.kinds import ExitKind, StopChild, Strategy, WhichChildren
from castor.supervision.registry import Registry
from castor.supervision.supervisor import (
    DEFAULT_MAX_RESTARTS,
    DEFAULT_WITHIN_SECONDS,
    ChildSpec,
    StartChild,
    Supervisor,
)

ROOT_PATH = "/root"


class ActorSystem:
    """Owns the root supervisor and the path registry of one runtime."""

    def __init__(
        self,
        children: Sequence[ChildSpec] = (),
        *,
        strategy: Strategy = Strategy.ONE_FOR_ONE,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        within_seconds: float = DEFAULT_WITHIN_SECONDS,
    ) -> None:
        self.registry: Registry[ActorHandle] = Registry()
        #: Set once :meth:`shutdown` began (or the root failed): from then on nothing is started.
        self.stopping = threading.Event()
        self.fatal = threading.Event()
        self.fatal_error: BaseException | None = None
        self.root = ActorHandle(
            ROOT_PATH,
            factory=lambda: Supervisor(
                strategy=strategy, max_restarts=max_restarts, within_seconds=within_seconds, children=children
            ),
            supervisor=None,
            registry=self.registry,
            revive_on_demand=False,
        )
        self.root.on_exit = self._root_exited
        self.root.launch()
        # on_start of the root starts the initial children; this ask returns after it.
        self.root.ask(WhichChildren(), timeout=30.0)

    def _root_exited(self, root: ActorHandle, _incarnation: int, kind: ExitKind) -> None:
        if kind is not ExitKind.STOPPED:
            self.fatal_error = root.last_error
            err = error_text(root.last_error, as_repr=True) if root.last_error is not None else "None"
            logger.bind(actor=ROOT_PATH).critical("root supervisor {kind}: {err}", kind=kind, err=err)
            self.fatal.set()
        self.stopping.set()
        root.close(f"root {kind}")

    # -- children --------------------------------------------------------
    def spawn(self, spec: ChildSpec, *, under: str = ROOT_PATH, timeout: float = 10.0) -> ActorHandle:
        """Start a dynamic child under the supervisor at ``under``.

        A ``direct_start`` child is started on the calling thread when the supervisor is
        running (:meth:`Supervisor.start_direct`: no round trip through the supervisor's
        mailbox); otherwise, and for every other child, this is a ``StartChild`` ask. Once the
        system is shutting down (or its root failed) it is ``actor_stopped`` whatever ``under`` is:
        nothing starts again (the supervisor it names is gone or going, which is no ``not_found``).
        """
        if self.stopping.is_set():
            raise self.stopped_error(under)
        supervisor = self._supervisor_at(under)
        if spec.direct_start:
            current = supervisor.actor
            if isinstance(current, Supervisor):
                handle = current.start_direct(spec, start_timeout=timeout)
                if handle is not None:
                    return handle
        started = supervisor.ask(StartChild(spec=spec), timeout=timeout)
        assert isinstance(started, ActorHandle)  # a supervisor answers StartChild with the child's handle
        return started

    def stop_child(self, path: str, *, timeout: float = 30.0) -> None:
        """Stop the child at ``path`` and remove it (its queued asks fail ``actor_stopped``);
        returns once it is gone. Called from inside that child (or an actor under it), whose
        stop waits for the very handler that asks, it asks for the stop and returns at once:
        the stop happens when that handler has returned."""
        parent, _, child_id = path.rpartition("/")
        supervisor = self._supervisor_at(parent)
        if self._inside(path):
            supervisor.tell(StopChild(id=child_id))
            return
        supervisor.ask(StopChild(id=child_id), timeout=timeout)

    def _inside(self, path: str) -> bool:
        """Whether the calling thread runs the loop of an actor of this system at or under ``path``."""
        here = running_actor()
        return here is not None and here.registry is self.registry and at_or_under(here.path, path)

    def _supervisor_at(self, path: str) -> ActorHandle:
        """The handle of the supervisor at ``path``: ``not_found`` when nothing is there,
        ``invalid_params`` when the actor there is no supervisor (a worker sent a supervisor's
        message would crash on it, for a caller's mistake)."""
        handle = self.registry.lookup(path)
        current = handle.actor
        if current is not None and not isinstance(current, Supervisor):
            raise InvalidParams(f"{path} is not a supervisor", data={"path": path})
        return handle

    def stopped_error(self, path: str) -> ActorStopped:
        """What a spawn answers once the system is shutting down (:meth:`spawn`)."""
        return ActorStopped(f"the runtime is shut down: nothing is started under {path} any more",
                            data={"path": path, "state": "shut_down"})

    def lookup(self, path: str) -> ActorHandle:
        return self.registry.lookup(path)

    def find(self, path: str) -> ActorHandle | None:
        return self.registry.find(path)

    # -- inspection -------------------------------------------------------
    def snapshot(self, prefix: str = "") -> TreeSnapshot:
        return self.registry.snapshot(prefix)

    def snapshot_data(self, prefix: str = "", *, pace_s: float = 0.0) -> dict[str, Any]:
        """:meth:`snapshot` as plain JSON/msgpack-ready data, without building models (cheap);
        ``pace_s``: see :meth:`Registry.snapshot_data` (watchers pass ``WATCH_PACE_S``)."""
        return self.registry.snapshot_data(prefix, pace_s=pace_s)

    def mailbox(self, path: str) -> ActorSnapshot:
        return self.registry.lookup(path).snapshot()

    # -- shutdown ---------------------------------------------------------
    def shutdown(self, timeout: float = 30.0) -> bool:
        """Stop every actor, children before parents; True if all stopped in time.

        Called from inside one of this system's actors (whose stop waits for the handler that
        calls), it starts the shutdown and returns False at once: the calling actor stops, like
        every other, once that handler has returned. A second call finds nothing left to stop."""
        self.stopping.set()
        if self._inside(ROOT_PATH):
            self.root.stop(0)
            return False
        clean = self.root.stop(timeout)
        if not clean:
            self.root.abandon()
        self.root.close("runtime shut down")
        return clean

    def __enter__(self) -> ActorSystem:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


__all__ = ["ActorSystem", "ROOT_PATH", "ActorStopped"]
