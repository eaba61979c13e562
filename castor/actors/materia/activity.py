"""What materia actors say they are doing, for snapshots (``Actor.report_activity``).

Each function builds the ``(kind, text, data)`` of one activity, or the whole
``(kind, text, data, since)`` a cast's description returns when a snapshot is taken.
They only read: a description runs on the snapshotting thread.
"""

from __future__ import annotations

import shlex
import time
from typing import Any

from castor.domain.materia.engine import cast_of_visit
from castor.domain.materia.expressions import MISSING
from castor.domain.materia.loops import item_progress

_PENDING_WORDS = {"agent_turn": "awaiting the agent's turn for", "utility": "awaiting utility", "compaction":
                  "awaiting a compaction for"}


def _unsticks(pending: Any, compacting: bool) -> str:
    """What ends the outside work a cast waits for (``waiting_for``): an operator who finds a cast
    stuck learns what would move it on, and that ``abort`` (``castor abort ID``) always does."""
    if pending.kind == "utility":
        timeout_ms = getattr(pending, "timeout_ms", None)
        bound = f" (or its timeoutMs, {timeout_ms / 1000:g} s)" if timeout_ms else ""
        return f"the utility command to exit{bound}, or abort"
    if pending.kind == "compaction" or compacting:
        return "the host's compaction, then the agent's turn to end (the harness reports it), or abort"
    if getattr(pending, "user_driven", False):
        return "the user's own turn to end (the harness reports it), or abort"
    return "the agent's turn to end (the harness reports it), or abort"


def awaiting_turn(effect: Any, cast_id: str) -> tuple[str, str, dict[str, Any]]:
    """A SocketActor that sent its turn and waits for the agent's answer."""
    text = f"awaiting the agent's turn for {effect.socket_id} ({effect.materia}) of cast {cast_id}"
    return "awaiting_turn", text, {"cast_id": cast_id, "socket": effect.socket_id, "materia": effect.materia,
                                   "visit": effect.visit, "visit_id": effect.visit_id, "mode": effect.mode}


def compacting(effect: Any, cast_id: str, percent: float) -> tuple[str, str, dict[str, Any]]:
    """A SocketActor waiting for the host to compact its context before it sends its turn."""
    text = (f"waiting for the host's compaction before {effect.socket_id} ({effect.materia}) of cast {cast_id} "
            f"(context {percent:.0f}% full); the turn is not sent yet")
    return "compacting", text, {"cast_id": cast_id, "socket": effect.socket_id, "materia": effect.materia,
                                "visit": effect.visit, "visit_id": effect.visit_id, "percent": round(percent, 2)}


def running_utility(effect: Any, argv: list[str], pids: list[int]) -> tuple[str, str, dict[str, Any]]:
    """A utility slot whose command runs now."""
    command = shlex.join(argv)
    if len(command) > 200:
        command = command[:199] + "…"
    pid = pids[0] if pids else None
    socket = getattr(effect, "socket_id", None)
    cast_id = cast_of_visit(effect.visit_id)
    whose = f" for {socket} of cast {cast_id}" if socket and cast_id else ""
    return "utility", f"running utility {command} (pid {pid}){whose}", {
        "command": command, "pid": pid, "visit_id": effect.visit_id, "socket": socket, "cast_id": cast_id}


def _utility_progress(progress: Any, visit_id: str, data: dict[str, Any]) -> tuple[str, float | None]:
    """Whether the utility a cast awaits runs (its pid) or waits for a slot: a slow command and a
    full pool read alike otherwise; and, while it runs, the deadline its ``timeoutMs`` sets (the
    wait's own, as the slot shows it). ``progress(visit_id)`` gives ``(where, pid, slots,
    deadline)``, or None where this runtime has no pool (a cast host's commands): then ``("", None)``."""
    found = progress(visit_id) if progress is not None else None
    if found is None:
        return "", None
    where, pid, slots, deadline = found
    data["utility"] = where
    if where == "running":
        data["utility_pid"] = pid
        return f"; its command runs (pid {pid})", deadline
    if where == "queued":
        return f"; queued: every utility slot ({slots}) is busy", None
    if where == "waiting":
        return "; its command waits for the cast's previous one, given up, to end", None
    return "", None


def _item_progress(state: Any, socket: str | None) -> tuple[int, int] | None:
    """``(number, of)`` of the loop item the cast is at, or None. Read on the snapshotting thread
    while the cast may change its data: a value it cannot read now is simply left out."""
    try:
        last_json = state.last_json if state.last_json is not None else MISSING
        return item_progress(state.config.pipeline, socket or "", state.data, state.cursors, last_json)
    except Exception:  # noqa: BLE001 - a snapshot must never fail on what it only adds
        return None


def cast_activity(actor: Any, utility_progress: Any = None) -> tuple[Any, ...] | None:
    """A CastActor's phase, socket, work item, visit and age, read from its current state;
    ``utility_progress(visit_id) -> (where, pid, slots) | None`` tells where an awaited utility is.
    A running command adds the deadline its ``timeoutMs`` sets, and a user's own turn under the
    opt-in bound that bound's (a fifth element)."""
    state = actor.state
    if state is None:
        return "starting", "loading its state", {"cast_id": actor.env.cast_id}, time.monotonic()
    socket = state.current_socket_id or None
    item = state.current_item_label or state.current_item_key
    pending = state.pending
    data: dict[str, Any] = {"cast_id": state.cast_id, "phase": state.phase or None, "socket": socket,
                            "materia": state.current_materia, "item": item,
                            "visit": state.visits.get(socket or "", 0) if socket else None,
                            "socket_state": state.socket_state, "active": state.active,
                            "run_dir": state.run_dir or None,
                            "cast_age_s": round(max(0.0, time.time() - state.started_at), 3)
                            if state.started_at else None}
    progress = _item_progress(state, socket) if item else None
    if progress is not None:  # how far the loop is: the work left on a long cast
        data["item_number"], data["items"] = progress
        item = f"{item} ({progress[0]} of {progress[1]})"
    # The state's wall-clock time of its last transition, as a monotonic instant.
    since = time.monotonic() - max(0.0, time.time() - (state.updated_at or time.time()))
    where = f"{socket} ({state.current_materia})" if state.current_materia else str(socket or "-")
    if not state.active:
        return "ended", f"cast {state.cast_id} ended: {state.phase or 'done'}", data, since
    if pending is not None:
        data.update(pending=pending.kind, visit=pending.visit, visit_id=pending.visit_id)
        words = _PENDING_WORDS.get(pending.kind, f"awaiting {pending.kind} for")
        if pending.kind == "agent_turn" and getattr(actor, "compacting_visit", None) == pending.visit_id:
            words = "awaiting the host's compaction before the agent's turn for"  # the turn is not sent yet
            data["compacting"] = True
        data["waiting_for"] = _unsticks(pending, bool(data.get("compacting")))
        text = f"{words} {where} of cast {state.cast_id}"
        if item:
            text += f", item {item}"
        text += f", visit {pending.visit}"
        if pending.kind == "utility":
            said, deadline = _utility_progress(utility_progress, pending.visit_id, data)
            text += said
            if deadline is not None:
                return "cast", text, data, since, deadline
        bound = getattr(actor, "user_turn_deadline", None)  # the opt-in bound on a user's own turn
        if bound is not None and bound[0] == pending.visit_id:
            return "cast", text, data, since, bound[1]
        return "cast", text, data, since
    if state.interrupted:  # an Esc stopped its turn: nothing runs until continue, recast or abort
        data["waiting_for"] = "continue, recast or abort"
        return ("interrupted", f"cast {state.cast_id} interrupted at {where}: its turn was stopped; "
                               "waiting for continue, recast or abort", data, since)
    if state.socket_state == "awaiting_user_refinement":
        data["waiting_for"] = "the user's refinement, or continue"
        return ("paused", f"cast {state.cast_id} paused at {where} for the user's refinement; "
                          "waiting for the user, or continue", data, since)
    return "cast", f"cast {state.cast_id} at {where}, phase {state.phase or '-'}", data, since
