"""Read-only views of casts and loadouts, shared by the SessionActor, the endpoint and the CLI.

Everything here reads through the cast-storage port (state store, lease, index; see
:mod:`castor.ports.cast_storage`), passed in by the caller, and formats plain dicts/strings;
nothing writes.

Cast status (``status`` field), first match wins:

| persisted state | live here | lease | status | resumable |
|---|---|---|---|---|
| active, awaiting_user_refinement | any | any | ``awaiting_refinement`` | no |
| active, interrupted (its turn was stopped: Esc) | yes, or lease held elsewhere | held | ``interrupted`` | no: ``continue`` (or ``recast``) re-runs the turn |
| active | yes, or lease held elsewhere | held | ``active`` | no |
| active | no | free | ``orphaned`` (its runtime died) | yes: ``recast`` resumes it |
| complete | | | ``complete`` | no |
| failed, aborted by user | | | ``aborted`` | yes |
| failed | | | ``failed`` | yes (``revivable`` if recovery was exhausted) |

A cast stopped because its state outgrew the bound castor saves (its log's last event the
``storage_unavailable`` of ``data.reason: state_too_large``) is not resumable, whatever its status:
a recast or continue would meet the same bound. It has ``outgrown: {message, path}``, and its
status and listing row say what does help (``cast REQUEST`` starts a new cast) instead.

An ended cast whose last transition's file effects may not all be on disk (its runtime died
between saving the state and finishing the writes) has ``artifacts_pending: true``: ``recast``
writes them from the outbox saved with the state, and then answers as for any ended cast.
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from castor.domain.jsontext import js_string
from castor.domain.materia.budget import usage_caveats
from castor.domain.materia.engine import BUDGET_LIMIT_REACHED, BUDGET_RECAST_NOTE
from castor.domain.materia.state import CastState, interrupted_document, short_label
from castor.domain.materia.surface import NO_AGENT_REMEMBERED, command
from castor.messages.errors import CastorError, InvalidMessage, InvalidParams, NotFound
from castor.ports.cast_storage import (
    DEFAULT_PAGE,
    STATE_TOO_LARGE,
    CastStorage,
    CastSummaryView,
    StateCorrupt,
    UnreadableCastView,
)
from castor.shown import one_line


def _status_of(state: CastState) -> str:
    if state.active:
        if state.socket_state == "interrupted":
            return "interrupted"
        return "awaiting_refinement" if state.socket_state == "awaiting_user_refinement" else "active"
    if state.complete:
        return "complete"
    if state.aborted or state.failed_reason == "aborted by user":
        return "aborted"
    if state.failed:
        return "failed"
    return "idle"


def revivable(state: CastState) -> bool:
    ex = state.recovery_exhaustion
    return bool(state.resumable and ex is not None and ex.failed_reason == state.failed_reason)


def status_view(state: CastState, *, live: bool, orphaned: bool = False) -> dict[str, Any]:
    """The structured status of one cast (the ``cast.status`` result without ``text``)."""
    # An interrupted cast lost nothing when its runtime ended: it still waits for continue.
    status = "orphaned" if orphaned and state.active and not state.interrupted else _status_of(state)
    pending = state.pending
    return {
        "cast_id": state.cast_id,
        "status": status,
        "active": state.active,
        "live": live,
        "phase": state.phase,
        "socket_state": state.socket_state,
        "current_socket": state.current_socket_id or None,
        "current_materia": state.current_materia,
        "item_key": state.current_item_key,
        "item_label": short_label(state.current_item_label),
        "visits": dict(state.visits),
        "pending": (pending.model_dump(include={"kind", "visit_id", "socket_id", "visit", "mode", "user_driven"})
                    if pending else None),
        "paused": state.paused,
        "resumable": state.resumable or (orphaned and state.active),
        "revivable": revivable(state),
        "failed_reason": state.failed_reason,
        "request": state.request,
        "loadout": state.config.pipeline.loadout_name,
        "run_dir": state.run_dir,
        "started_at": state.started_at,
        "updated_at": state.updated_at,
        "ended_at": state.ended_at,
        "usage": {"tokens": state.usage.tokens.total, "cost_usd": state.usage.cost.total,
                  "caveats": usage_caveats(state.usage).strip(" ()") or None},
        "last_message": state.last_message,
    }


#: The verbs that run a cast again: on the CLI they take the backend flags the cast last ran with.
RESUMING_VERBS = frozenset({"recast", "revive", "continue"})


def resuming_command(surface: str, verb: str, view: dict[str, Any], *, cli_flags: str = "") -> str:
    """:func:`command` for the cast of ``view``; on the CLI a resuming verb names the backend flags
    the cast last ran with (``backend_flags``: ``--backend ray --ray-address ...``), so a cast that
    ran on a cluster is resumed there (without them, ``castor recast`` runs it on this machine);
    ``cli_flags``: how the CLI's name the project (:func:`command`), before the backend flags."""
    text = command(surface, verb, view["cast_id"], cli_flags=cli_flags)
    flags = view.get("backend_flags")
    if surface == "cli" and verb in RESUMING_VERBS and isinstance(flags, list) and flags:
        import shlex

        text += " " + shlex.join(str(flag) for flag in flags)
    return text


def status_text(view: dict[str, Any], surface: str = "harness", *, cli_flags: str = "") -> str:
    """One readable block for ``/materia status`` and ``castor status`` (``surface``: whose commands it
    names; ``cli_flags``: how the CLI's name the project, see :func:`command`)."""

    def named(verb: str) -> str:
        return resuming_command(surface, verb, view, cli_flags=cli_flags)

    lines = [f"cast {view['cast_id']} [{view['status']}] loadout {view['loadout']}"]
    if view.get("current_socket"):
        where = f"socket {view['current_socket']}"
        if view.get("current_materia"):
            where += f" ({view['current_materia']})"
        if view.get("item_label") or view.get("item_key"):
            where += f" item {view.get('item_label') or view.get('item_key')}"
        lines.append(where)
    visits = view.get("visits") or {}
    if visits:
        lines.append("visits: " + ", ".join(f"{k}×{v}" for k, v in visits.items()))
    usage = view.get("usage")
    if isinstance(usage, dict) and visits:
        caveats = usage.get("caveats")
        lines.append(f"usage: {js_string(usage.get('tokens') or 0)} tokens, ${usage.get('cost_usd') or 0:.4f}"
                     + (f" ({caveats})" if caveats else ""))
    if view.get("paused"):
        lines.append(f"› waiting for refinement; {named('continue')} to finalize "
                     "(reply to refine the draft)")
    outgrown = view.get("outgrown")
    if isinstance(outgrown, dict):  # a recast or continue would meet the same bound: never named
        lines.append(f"stopped: {one_line(str(outgrown.get('message') or 'its state outgrew what castor saves'))}")
        lines.append(f"cannot be resumed (a recast or continue meets the same bound): "
                     f"{command(surface, 'cast', cli_flags=cli_flags)} REQUEST starts a new cast")
    elif view.get("status") == "interrupted":
        lines.append(f"interrupted: run {named('continue')} to run the turn again, or "
                     f"{named('abort')} to stop the cast")
    if view.get("failed_reason"):
        lines.append(f"reason: {view['failed_reason']}")
    fault = view.get("storage_fault")
    if isinstance(fault, dict):
        where = f" on {one_line(str(fault.get('path')))}" if fault.get("path") else ""
        lines.append(f"stopped: storage unavailable ({one_line(str(fault.get('errno')))}{where}); fix the storage "
                     f"(free space, permissions, a read-only mount), then {named('recast')}")
    unwritable = view.get("not_writable")
    if isinstance(unwritable, dict):  # a resume would fail on it at once: say so before naming one
        lines.append(f"cannot be resumed now: {one_line(str(unwritable.get('path')))} cannot be written "
                     f"({one_line(str(unwritable.get('errno')))}); make it writable (remount it read-write, or give "
                     f"this user write permission), then {named('recast')}")
    given_up = view.get("given_up")
    if isinstance(given_up, dict):
        lines.append(f"given up: its actor crashed more than {given_up.get('max_restarts')} times within "
                     f"{given_up.get('within_seconds')} s ({one_line(str(given_up.get('reason')))}); the runtime "
                     "stopped restarting it")
    if view.get("failed_reason") == BUDGET_LIMIT_REACHED:
        lines.append(f"budget: {BUDGET_RECAST_NOTE}")
    if view.get("resumable"):
        verb = "revive" if view.get("revivable") else "recast"
        lines.append(f"↻ RECAST TARGET: {named(verb)}")
    if view.get("artifacts_pending"):
        lines.append(f"! the artifacts of its last step are not all written: {named('recast')} "
                     "writes them")
    lines.append(f"artifacts: {one_line(str(view['run_dir']))}")  # a path may hold a line break
    return "\n".join(lines)


def _load_saved(storage: CastStorage, artifact_root: Path, cast_id: str) -> tuple[CastState, dict[str, Any]]:
    """The persisted state of a cast and its raw document (NotFound if none was saved yet)."""
    stored = storage.store(artifact_root).load(cast_id)
    if stored.revision == 0:
        raise NotFound(f"cast {cast_id} has no saved state yet", data={"cast_id": cast_id})
    return saved_state(stored.state, cast_id, artifact_root), stored.state


def saved_state(document: dict[str, Any], cast_id: str, artifact_root: Path | str) -> CastState:
    """The cast state in a saved ``state.json``'s document, or ``state_corrupt`` naming the file:
    a state castor cannot read (a field with a wrong value, a damaged file), or one that is another
    cast's (a ``state.json`` copied from another cast's directory: never taken for this cast)."""
    path = f"{artifact_root}/{cast_id}/state.json"
    try:
        state = CastState.from_json(json.dumps(document))
    except InvalidMessage as exc:
        errors = (exc.data or {}).get("errors") or []
        fields = sorted({".".join(str(p) for p in e.get("loc", ())) for e in errors if isinstance(e, dict)})[:5]
        where = f" (fields: {', '.join(fields)})" if fields else ""
        raise StateCorrupt(f"{path} is not a cast state castor can read: {exc.message}{where}; "
                           "restore it, or remove the cast's directory", data={"cast_id": cast_id, "path": path,
                                                                              "fields": fields}) from None
    if state.cast_id != cast_id:
        raise StateCorrupt(f"{path} holds cast {state.cast_id!r}'s state, not {cast_id!r}'s (copied from another "
                           "cast's directory?)", data={"cast_id": cast_id, "found": state.cast_id, "path": path})
    return state


def load_state(storage: CastStorage, artifact_root: Path, cast_id: str) -> CastState:
    """The persisted state of a cast (NotFound if none was saved yet)."""
    return _load_saved(storage, artifact_root, cast_id)[0]


def load_state_and_writer(storage: CastStorage, artifact_root: Path, cast_id: str) -> tuple[CastState, str | None]:
    """:func:`load_state`, with why another user may have written the saved document (its file is
    theirs, or every user may write it: ``StoredDocument.foreign``), else None."""
    stored = storage.store(artifact_root).load(cast_id)
    if stored.revision == 0:
        raise NotFound(f"cast {cast_id} has no saved state yet", data={"cast_id": cast_id})
    return saved_state(stored.state, cast_id, artifact_root), stored.foreign


def persisted_view(storage: CastStorage, artifact_root: Path, cast_id: str, *, live: bool) -> dict[str, Any]:
    state, document = _load_saved(storage, artifact_root, cast_id)
    orphaned = state.active and not live and not storage.lease_held(artifact_root, cast_id)
    view = status_view(state, live=live, orphaned=orphaned)
    if orphaned:
        try:
            records = storage.event_lines(artifact_root, cast_id)
        except (CastorError, OSError):
            records = []
        stopped = _storage_fault(records)
        if stopped is not None and stopped.get("reason") == STATE_TOO_LARGE:
            _mark_outgrown(view, stopped)
        elif stopped is not None:
            view["storage_fault"] = stopped
        given_up = _given_up(records)
        if given_up is not None:
            view["given_up"] = given_up
    if not state.active and not live:
        # Not while a runtime holds the cast: it may be writing them right now.
        view["artifacts_pending"] = (not outbox_on_disk(storage, artifact_root, cast_id, document.get("outbox") or [])
                                     and not storage.lease_held(artifact_root, cast_id))
    return view


def _storage_fault(records: list[Any]) -> dict[str, Any] | None:
    """Why an orphaned cast stopped, when its storage refused a transition (its state, or its
    artifacts) and no failed state could be saved: its log's last event is then ``storage_unavailable``
    (``{errno, path}``, written if the log still took it; a recast appends after it). ``None``
    otherwise: a runtime that died leaves none, nor does a disk too full for the event."""
    last = records[-1] if records else None
    if not isinstance(last, dict) or last.get("type") != "storage_unavailable" \
            or not isinstance(last.get("data"), dict):
        return None
    data = last["data"]
    fault = {"errno": str(data.get("errno") or "EUNKNOWN"), "path": str(data.get("path") or ""),
             "at_ms": last.get("ts")}
    if data.get("reason") == STATE_TOO_LARGE:
        fault |= {"reason": STATE_TOO_LARGE, "message": str(data.get("message") or "")}
    return fault


def _mark_outgrown(view: dict[str, Any], fault: dict[str, Any]) -> None:
    """``view`` (a status or a listing row) of a cast whose state outgrew the bound castor saves
    (``fault``: :func:`_storage_fault`'s): not resumable nor revivable -- a recast or continue would
    stop at once on the same bound -- and ``outgrown`` says why, with the stop's own message."""
    view["resumable"] = False
    view["revivable"] = False
    view["outgrown"] = {"message": fault.get("message") or "", "path": fault.get("path") or ""}


def _outgrown_fault(storage: CastStorage, artifact_root: Path, cast_id: str) -> dict[str, Any] | None:
    """The ``state_too_large`` stop its log ends on (:func:`_storage_fault`), else None: its last
    line only (a listing reads no whole log)."""
    try:
        last = storage.last_event(artifact_root, cast_id)
    except (CastorError, OSError, ValueError):
        return None
    fault = _storage_fault([last] if last is not None else [])
    return fault if fault is not None and fault.get("reason") == STATE_TOO_LARGE else None


def _given_up(records: list[Any]) -> dict[str, Any] | None:
    """Why an orphaned cast stopped, when its runtime gave it up after a crash loop: its log's last
    event is then ``cast_given_up`` (written as it was given up; a recast appends after it). An
    orphaned cast whose runtime died or shut down has none: ``None``."""
    records = list(records)
    while records and isinstance(records[-1], dict) and records[-1].get("type") == "storage_unavailable":
        records.pop()
    last = records[-1] if records else None
    if not isinstance(last, dict) or last.get("type") != "cast_given_up" or not isinstance(last.get("data"), dict):
        return None
    data = last["data"]
    return {"reason": str(data.get("reason") or ""), "max_restarts": data.get("maxRestarts"),
            "within_seconds": data.get("withinSeconds"), "at_ms": last.get("ts")}


def outbox_on_disk(storage: CastStorage, artifact_root: Path, cast_id: str, outbox: list[dict[str, Any]]) -> bool:
    """Whether the file effects saved with a cast's last state were all performed.

    A transition appends its events last, in one write, after its whole files and manifest
    entries; so its effects are on disk exactly when its last event is the log's last line.
    """
    events = [e for e in outbox if e.get("kind") == "emit_event"]
    if not events:
        return True
    last = events[-1]
    try:
        records = storage.event_lines(artifact_root, cast_id)
    except (CastorError, OSError):
        return False
    while records and isinstance(records[-1], dict) and records[-1].get("type") == "storage_unavailable":
        records.pop()  # a note of a storage fault, appended after the outbox's events (cast_actor.py)
    if not records:
        return False
    tail = records[-1]
    return (isinstance(tail, dict) and tail.get("type") == last.get("type") and tail.get("ts") == last.get("ts_ms")
            and tail.get("data") == json.loads(json.dumps(last.get("data"))))


def _cast_row(
    storage: CastStorage, summary: CastSummaryView, artifact_root: Path, live_ids: set[str]
) -> dict[str, Any]:
    row = {"cast_id": summary.cast_id, "status": summary.status, "current_socket": summary.current_socket,
           "updated_at": summary.updated_at, "resumable": summary.resumable, "request": summary.request,
           "failed_reason": summary.failed_reason, "live": summary.cast_id in live_ids,
           "revivable": bool(summary.revivable and summary.resumable and summary.status == "failed")}
    if summary.status == "active":
        try:  # an interrupted cast says so, live or not (nothing of it was lost)
            if interrupted_document(storage.store(artifact_root).load(summary.cast_id).state):
                row["status"] = "interrupted"
        except (CastorError, OSError):
            pass
    if summary.status in ("active", "awaiting_refinement") and summary.cast_id not in live_ids:
        try:
            if not storage.lease_held(artifact_root, summary.cast_id):
                row["resumable"] = True
                if row["status"] != "interrupted":
                    row["status"] = "orphaned"
                # Its runtime gone: it may have stopped on a state too large to save (only then
                # is its log read).
                outgrown = _outgrown_fault(storage, artifact_root, summary.cast_id)
                if outgrown is not None:
                    _mark_outgrown(row, outgrown)
        except (CastorError, OSError):
            pass
    return row


def held_elsewhere(row: dict[str, Any]) -> bool:
    """A listing row (:func:`find_cast`, with no live ids) of a cast another live session runs:
    still going, and its lease held, so it is not ``resumable`` here."""
    return (row["status"] in ("active", "awaiting_refinement", "interrupted") and not row["resumable"]
            and not row.get("outgrown"))


def _problem_row(problem: UnreadableCastView, live_ids: set[str]) -> dict[str, Any]:
    return {"cast_id": problem.cast_id, "status": "unreadable", "current_socket": problem.current_socket,
            "updated_at": None, "resumable": False, "revivable": False, "request": problem.request,
            "failed_reason": problem.reason,
            "live": problem.cast_id in live_ids}


def cast_page(storage: CastStorage, artifact_root: Path, live_ids: set[str], *, limit: int | None = DEFAULT_PAGE,
              cursor: str | None = None) -> dict[str, Any]:
    """One page of casts under ``artifact_root`` (see table): ``{casts, next_cursor, total}``, casts
    newest id first, then unreadable directories. From the cast index: ``O(limit)``."""
    page = storage.list_page(artifact_root, limit=limit, cursor=cursor)
    rows = [_cast_row(storage, summary, artifact_root, live_ids) for summary in page.casts]
    rows += [_problem_row(problem, live_ids) for problem in page.problems]
    return {"casts": rows, "next_cursor": page.next_cursor, "total": page.total}


def cast_rows(storage: CastStorage, artifact_root: Path, live_ids: set[str], *, limit: int | None = None,
              cursor: str | None = None) -> list[dict[str, Any]]:
    """Every cast under ``artifact_root`` (or one page: ``limit``/``cursor``), newest first, with
    status/resumable (see table)."""
    rows: list[dict[str, Any]] = cast_page(storage, artifact_root, live_ids, limit=limit, cursor=cursor)["casts"]
    return rows


def find_cast(storage: CastStorage, artifact_root: Path, live_ids: set[str], where: str,
              accept: Any = lambda row: True) -> dict[str, Any] | None:
    """The newest cast row that ``accept``s, among those the index says may match ``where``
    (``readable``, ``candidate``: resumable or active, ``revivable``); None if there is none.
    Reads the index newest first and stops at the first match (no state.json read per cast)."""
    for summary in storage.newest(artifact_root, where):
        row = _cast_row(storage, summary, artifact_root, live_ids)
        if accept(row):
            return row
    return None


def casts_text(rows: list[dict[str, Any]], artifact_root: Path, surface: str = "harness", *, more: int = 0,
               cli_flags: str = "") -> str:
    """``more``: how many further casts the listing holds beyond these rows (paged); commands are
    named for ``surface`` (the CLI's or the harness's; ``cli_flags``: see :func:`command`)."""

    def named(verb: str, row: dict[str, Any]) -> str:
        return resuming_command(surface, verb, row, cli_flags=cli_flags)

    if not rows:
        return f"No pi-materia casts under {one_line(str(artifact_root))}."
    lines = [f"casts under {one_line(str(artifact_root))}:"]  # a path may hold a line break
    for row in rows:
        request = one_line((row.get("request") or "")[:72])  # a listing row is one line
        where = f" at {row['current_socket']}" if row.get("current_socket") else ""
        if row["status"] == "unreadable" and row.get("failed_reason"):
            # why: a damaged file reads differently from a start in progress, or pi-materia's own run
            # (whose reason names its socket already)
            where, request = "", f"({one_line(row['failed_reason'])})" + (f"  {request}" if request else "")
        lines.append(f"  {row['cast_id']}  {row['status']}{where}  {request}")
        if row.get("outgrown"):  # a recast or continue would stop at once on the same bound (as status says)
            lines.append(f"    ✗ its state outgrew what castor saves: cannot be resumed; "
                         f"{command(surface, 'cast', cli_flags=cli_flags)} REQUEST starts a new cast")
        elif row["status"] == "interrupted":  # an Esc stopped its turn: continue runs it again (as status says)
            lines.append(f"    › interrupted — continue: {named('continue', row)} (or abort: "
                         f"{named('abort', row)})")
        if row.get("resumable"):  # every resumable cast can be recast; a revivable one revived as well
            line = f"    ↻ RECAST TARGET — recast: {named('recast', row)}"
            if row.get("revivable"):
                line += f" (or revive: {named('revive', row)})"
            lines.append(line)
        if row.get("needs_agent") and surface == "cli":  # the command named above would stop on `no agent`
            lines.append(f"    ! {NO_AGENT_REMEMBERED}")
    if more > 0:
        lines.append(f"  … {more} more (next page: its cursor)")
    return "\n".join(lines)


def loadout_line(active: str | None, names: list[str]) -> str:
    """``⌘ <active> (<first 4 names, active marked *> +N)``."""
    shown = [f"{n}*" if n == active else n for n in names[:4]]
    more = f" +{len(names) - 4}" if len(names) > 4 else ""
    return f"⌘ {active} ({', '.join(shown)}{more})"


LATEST = "latest"
#: How many candidates an ambiguous id prefix lists.
MAX_CANDIDATES = 10


def _not_a_directory(path: Path) -> bool:
    """Something other than a directory (or a link) is at ``path``."""
    return not path.is_symlink() and path.exists() and not path.is_dir()


def resolve_cast_id(storage: CastStorage, artifact_root: Path, ref: str, live_ids: set[str] | None = None) -> str:
    """The cast a user means by ``ref``: its exact id, ``latest`` (the newest cast), or a unique prefix.

    Raises ``NotFound`` (no such cast; no casts at all for ``latest``) or ``InvalidParams``
    (``data.reason: ambiguous_cast_id``, ``data.candidates``: the matching ids, newest first) —
    never a guess. ``ref`` must be a safe path segment (``Forbidden`` otherwise).
    """
    storage.validate_cast_id(ref)
    if ref != LATEST and ((artifact_root / ref / "state.json").is_file() or _not_a_directory(artifact_root / ref)):
        return ref  # a run directory replaced by a file is that cast's: its reader says it is damaged
    rows = cast_rows(storage, artifact_root, set())
    ids: set[str] = {row["cast_id"] for row in rows if row["status"] != "unreadable"}
    ids |= set(live_ids or ())
    newest_first = sorted(ids, reverse=True)
    if ref == LATEST:
        if not newest_first:
            damaged = sorted((row for row in rows if row["status"] == "unreadable"), key=lambda row: row["cast_id"],
                             reverse=True)
            if damaged:  # there are casts, none of which can be read: say so, never "no casts"
                newest = damaged[0]
                raise NotFound(f"No readable pi-materia casts under {artifact_root}: {len(damaged)} unreadable "
                               f"(newest {newest['cast_id']}: {newest['failed_reason']}); `castor casts` lists them",
                               data={"reason": "no_casts", "unreadable": [r["cast_id"] for r in damaged]
                                     [:MAX_CANDIDATES]})
            raise NotFound(f"No pi-materia casts under {artifact_root}.", data={"reason": "no_casts"})
        return newest_first[0]
    # A prefix is matched against the unreadable directories too: one it also names makes it
    # ambiguous (never a silent pick of the readable one), and one it names alone is that
    # directory (whose reader then says what is wrong with it).
    unreadable = {row["cast_id"] for row in rows if row["status"] == "unreadable"} - ids
    matches = [cast_id for cast_id in sorted(ids | unreadable, reverse=True) if cast_id.startswith(ref)]
    if ref in matches:
        return ref
    if not matches:
        raise NotFound(f"Unknown pi-materia cast id \"{ref}\" under {artifact_root}.", data={"cast_id": ref})
    if len(matches) > 1:
        shown = ", ".join(matches[:MAX_CANDIDATES]) + (f" (+{len(matches) - MAX_CANDIDATES} more)"
                                                       if len(matches) > MAX_CANDIDATES else "")
        raise InvalidParams(f"cast id prefix \"{ref}\" is ambiguous: it matches {len(matches)} casts: {shown}",
                            data={"reason": "ambiguous_cast_id", "candidates": matches[:MAX_CANDIDATES]})
    return matches[0]
