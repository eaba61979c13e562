"""The soak's faults: which live actors of a registry a fault family targets, and injecting one
fault into one of them. Used in the serving process and, over Ray, inside a cast host's runtime
(the scale-out host runs the function it is handed; it imports nothing of the soak).
Guarantees: a fault with no target injects nothing and says so (None); a target that dies
meanwhile is no error."""

from __future__ import annotations

from typing import Any, Callable

from castor.messages.errors import CastorError


def fault_targets(registry: Any, prefix_kind: str) -> list[Any]:
    """The live actors of one fault family (cast, socket, utility, worker) in ``registry``."""
    out = []
    for handle in registry.handles("/root"):
        path = handle.path
        parts = path.split("/")
        if prefix_kind == "cast" and len(parts) == 6 and parts[2] == "session" and parts[4] == "cast":
            out.append(handle)
        elif prefix_kind == "socket" and len(parts) == 6 and parts[2] == "session" and parts[4] == "socket":
            out.append(handle)
        elif prefix_kind == "utility" and path.startswith("/root/utility/slot-"):
            out.append(handle)
        elif prefix_kind == "worker" and len(parts) == 6 and parts[4] == "icarus" and parts[5] == "worker":
            out.append(handle)
    return sorted((h for h in out if h.alive), key=lambda h: h.path)


def inject_into(registry: Any, kind: str, family: str, pick: float, delay_s: Callable[[], float]) -> str | None:
    """Inject one fault of ``kind`` into the ``pick``-th target of ``family`` in ``registry`` (the
    soak's own runtime, or a cast host's); returns the kind injected, None without a target."""
    from castor.supervision import faults

    targets = fault_targets(registry, family)
    if kind in ("kill_utility_process", "kill_utility", "kill_worker_process"):
        busy = [h for h in targets if h.actor is not None and h.actor.owned_pids()]
        targets = busy or ([] if kind != "kill_utility" else targets)
    if not targets:
        return None
    handle = targets[int(pick * len(targets)) % len(targets)]
    try:
        if kind in ("kill_cast", "kill_socket", "kill_utility", "kill_worker"):
            faults.kill(handle, f"soak: {kind}")
        elif kind == "crash_cast":
            faults.crash_next(handle, "materia.cast.outcome")
        elif kind == "crash_utility":
            faults.crash_next(handle, "materia.utility.job")
        elif kind in ("kill_utility_process", "kill_worker_process"):
            if not faults.kill_process(handle):
                return None
        else:
            faults.delay_next(handle, delay_s())
            kind = f"delay_{family}"
    except CastorError:
        return None
    return kind
