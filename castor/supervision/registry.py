"""Actor paths and the registry that maps them to live handles.

Paths look like ``/root/session/<id>/cast/<id>``. A path names the *slot*,
not an incarnation: restarts keep the path. Each segment satisfies the safe-id rule
(``castor.messages.ids``: 1-128 ASCII letters, digits, ``.``, ``_``, ``-``, starting with a
letter or digit) so ids from clients cannot forge paths.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Generic, Protocol, TypeVar

from castor.messages.errors import NotFound
from castor.messages.ids import check_safe_id
from castor.messages.inspection import TreeSnapshot, at_or_under
from castor.supervision.meters import Meters
from castor.supervision.threads import running_threads

PACE_EVERY = 64
"""A paced tree snapshot sleeps after this many actors (see ``Registry.snapshot_data``)."""
WATCH_PACE_S = 0.001
"""The pace of the snapshots watchers take (``ops.actors``, the web console, /metrics)."""


def check_segment(segment: str) -> str:
    """Return ``segment`` if it satisfies the safe-id rule, else raise ``Forbidden``."""
    return check_safe_id(segment, "segment")


def child_path(parent: str, child_id: str) -> str:
    return f"{parent}/{check_segment(child_id)}"


class Registered(Protocol):
    """What the registry needs of a handle: its path, and its snapshot as plain data."""

    @property
    def path(self) -> str: ...

    def snapshot_data(self) -> dict[str, Any]: ...


ActorHandle = TypeVar("ActorHandle", bound=Registered)
"""The handle type a registry holds (``castor.supervision.handle.ActorHandle``; a type variable so
that this module, below the handle, does not import it)."""


class Registry(Generic[ActorHandle]):
    """Thread-safe map of path -> handle for one actor system."""

    def __init__(self) -> None:
        self.meters = Meters()  # counters and latencies by actor kind, for /metrics
        self._lock = threading.Lock()
        self._by_path: dict[str, ActorHandle] = {}
        self._by_parent: dict[str, dict[str, ActorHandle]] = {}  # parent path -> its children by path

    def register(self, handle: ActorHandle) -> None:
        path = handle.path
        with self._lock:
            self._by_path[path] = handle
            self._by_parent.setdefault(path.rpartition("/")[0], {})[path] = handle

    def unregister(self, handle: ActorHandle) -> None:
        path = handle.path
        with self._lock:
            if self._by_path.get(path) is handle:
                del self._by_path[path]
                parent = path.rpartition("/")[0]
                siblings = self._by_parent.get(parent)
                if siblings is not None:
                    siblings.pop(path, None)
                    if not siblings:
                        del self._by_parent[parent]

    def children(self, parent: str) -> list[ActorHandle]:
        """The registered direct children of ``parent``, in path order (cost: its children only)."""
        with self._lock:
            siblings = self._by_parent.get(parent.rstrip("/"))
            items = sorted(siblings.items()) if siblings else []
        return [handle for _path, handle in items]

    def lookup(self, path: str) -> ActorHandle:
        with self._lock:
            handle = self._by_path.get(path)
        if handle is None:
            raise NotFound(f"no actor at {path}", data={"path": path})
        return handle

    def find(self, path: str) -> ActorHandle | None:
        with self._lock:
            return self._by_path.get(path)

    def handles(self, prefix: str = "") -> list[ActorHandle]:
        with self._lock:
            items = sorted(self._by_path.items())
        return [h for p, h in items if at_or_under(p, prefix)]

    def snapshot(self, prefix: str = "") -> TreeSnapshot:
        """Every actor under ``prefix`` (all when empty), parents before children."""
        return TreeSnapshot.model_validate(self.snapshot_data(prefix))

    def snapshot_data(self, prefix: str = "", *, pace_s: float = 0.0) -> dict[str, Any]:
        """:meth:`snapshot` as plain data (``TreeSnapshot.model_dump(mode="json")``'s shape), cheap.

        ``pace_s`` > 0: sleep that long after every :data:`PACE_EVERY` actors. A watcher that
        snapshots a big tree in one go holds the interpreter lock for its whole run, and every
        actor thread woken meanwhile waits for it (CPython hands the lock over only every few
        ms): paced, its bursts stay short and the actors run between them.
        """
        if pace_s <= 0:
            return {"actors": [h.snapshot_data() for h in self.handles(prefix)], "threads": running_threads(prefix)}
        actors = []
        for n, handle in enumerate(self.handles(prefix), 1):
            actors.append(handle.snapshot_data())
            if n % PACE_EVERY == 0:
                time.sleep(pace_s)
        return {"actors": actors, "threads": running_threads(prefix)}
