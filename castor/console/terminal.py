"""The actor tree, the casts of each session, a mailbox and the cast hosts of a runtime snapshot
(``ops.actors``' JSON), as rich renderables for a terminal: what ``castor inspect`` and the demo
print. Guarantees: pure functions of the data they get (they fetch nothing, change nothing); a
console made by :func:`terminal_console` never wraps or cuts a line on a pipe."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from castor.messages.inspection import at_or_under
from castor.shown import one_line

SORT_KEYS = ("path", "oldest", "depth", "age", "restarts")


# -- selecting and sorting -----------------------------------------------------------
def _oldest(actor: dict[str, Any]) -> float:
    return actor["mailbox"].get("oldest_age_s") or 0.0


def shown(value: object) -> str:
    """``value`` as text an operator's terminal shows as it is: rich markup escaped, and every
    control character (a line break, an ESC a model put in a work item's title) written as its
    escape (castor.shown.one_line), so no name can forge a line or drive the terminal."""
    return escape(one_line(str(value)))


def duration(seconds: float) -> str:
    """A duration as an operator reads it: under a minute in tenths of a second (``40.0s``), then
    in minutes, hours and days (``12m05s``, ``5h02m``, ``2d3h``), never thousands of seconds."""
    if not abs(seconds) >= 60:
        return f"{seconds:.1f}s"
    whole, sign = int(abs(seconds)), "-" if seconds < 0 else ""
    if whole < 3600:
        return f"{sign}{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{sign}{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{sign}{whole // 86400}d{whole % 86400 // 3600}h"


def deadline_words(activity: dict[str, Any] | None) -> str:
    """``deadline in 5.2s`` / ``deadline passed 2.0s ago`` for an activity a bound ends (a
    worker call's deadline, a command's timeoutMs...), ``""`` for one nothing bounds."""
    left = (activity or {}).get("deadline_in_s")
    if not isinstance(left, (int, float)):
        return ""
    return f"deadline in {duration(left)}" if left >= 0 else f"deadline passed {duration(-left)} ago"


def queued_words(entry: dict[str, Any]) -> str:
    """One waiting message as an operator reads it: what it is for (a worker call's target, a
    hook), how long it has waited, its deadline -- ``icarus.worker.call hooks.pre_llm_call, waited
    2.3s, deadline in 27.7s``. Only what its type says of itself; never a payload."""
    detail = dict(entry.get("detail") or {})
    what = [str(detail.pop(key)) for key in ("target", "hook", "completion") if detail.get(key) is not None]
    words = [" ".join([str(entry.get("message_type")), *what]), f"waited {duration(entry.get('age_s') or 0)}"]
    bound = deadline_words({"deadline_in_s": detail.pop("deadline_in_s", None)})
    if bound:
        words.append(bound)
    words += [f"{key} {value}" if value is not True else key for key, value in sorted(detail.items())]
    return ", ".join(words)


def budget_words(actor: dict[str, Any]) -> str:
    """How much of its restart limit an actor's window has used, ``""`` while nothing of it is:
    ``3/5 restarts in 30s before it is given up`` (a child with a limit of its own: a cast), or
    ``children: 4/10 restarts in 10s before it fails`` (a supervisor's intensity)."""
    budget = actor.get("restart_budget") or {}
    if not budget.get("restarts"):
        return ""
    used = f"{budget['restarts']}/{budget['max_restarts']} restarts in {budget['within_s']:g}s"
    if budget.get("applies_to") == "children":
        return f"children: {used} before it fails"
    return f"{used} before it is given up"


def _activity_age(actor: dict[str, Any]) -> float:
    activity = actor.get("activity") or {}
    if activity.get("kind") in (None, "idle"):
        return 0.0  # being idle for long is not "stuck"
    return float(activity.get("age_s") or 0.0)


SORTERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "oldest": _oldest,
    "depth": lambda a: a["mailbox"].get("depth") or 0,
    "age": _activity_age,
    "restarts": lambda a: a.get("restarts") or 0,
}


def select(actors: list[dict[str, Any]], *, prefix: str | None = None, text: str | None = None,
           sort: str = "path") -> list[dict[str, Any]]:
    """The actors at or under ``prefix`` whose path, kind or activity holds ``text``, sorted
    by path, or worst first by ``sort`` (ties by path)."""
    chosen = actors
    if prefix:
        chosen = [a for a in chosen if at_or_under(a["path"], prefix)]
    if text:
        needle = text.lower()
        chosen = [a for a in chosen if needle in a["path"].lower() or needle in str(a.get("kind", "")).lower()
                  or needle in str((a.get("activity") or {}).get("text", "")).lower()
                  or any(needle in str(v).lower() for v in (a.get("labels") or {}).values())]
    if sort == "path":
        return sorted(chosen, key=lambda a: a["path"])
    key = SORTERS[sort]
    return sorted(chosen, key=lambda a: (-key(a), a["path"]))


def select_threads(threads: list[dict[str, Any]], *, prefix: str | None = None,
                   text: str | None = None) -> list[dict[str, Any]]:
    """The threads (``ops.actors``' ``threads`` rows) ``--prefix`` and ``--filter`` keep, as
    :func:`select` keeps actors: an owner at or under ``prefix``, and ``text`` in the name, owner or
    purpose (case-insensitive). Order kept (by owner, then name)."""
    chosen = threads
    if prefix:
        chosen = [t for t in chosen if at_or_under(str(t.get("owner", "")), prefix)]
    if text:
        needle = text.lower()
        chosen = [t for t in chosen
                  if any(needle in str(t.get(key, "")).lower() for key in ("name", "owner", "purpose"))]
    return chosen


def session_casts(actors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each session (id, label, project) with its casts, from an ``ops.actors`` snapshot.

    One pass over the actors files each under its session (casts) and its cast (socket actors,
    ``/root/session/<sid>/socket/<cast id>.<...>``): the console runs this on every push, and a
    scan of every actor per session and per cast took a quarter of a second at 1,000 casts."""
    by_path = {a["path"]: a for a in actors}  # the last of a path, as before
    session_actors: list[dict[str, Any]] = []
    casts_of: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    sockets_of: dict[tuple[str, str], list[str]] = {}
    for path, actor in by_path.items():
        parts = path.split("/")
        if len(parts) < 4 or parts[1:3] != ["root", "session"]:
            continue
        if len(parts) == 4:
            session_actors.append(actor)
        elif len(parts) == 6 and parts[4] == "cast":
            casts_of.setdefault(parts[3], []).append((parts[5], actor))
        elif len(parts) >= 6 and parts[4] == "socket":
            # every prefix of the segment that ends before a dot: a cast id may hold one itself
            segment = "/".join(parts[5:])
            at = segment.find(".")
            while at >= 0:
                sockets_of.setdefault((parts[3], segment[:at]), []).append(path)
                at = segment.find(".", at + 1)
    sessions: list[dict[str, Any]] = []
    for actor in sorted(session_actors, key=lambda a: a["path"]):
        sid = actor["path"].split("/")[3]
        casts = []
        for cast_id, cast in casts_of.get(sid, []):
            activity = cast.get("activity") or {}
            data = activity.get("data") or {}
            casts.append({
                "cast_id": cast_id, "path": cast["path"], "state": cast["state"],
                "phase": data.get("phase"), "socket": data.get("socket"), "materia": data.get("materia"),
                "item": data.get("item"), "item_number": data.get("item_number"), "items": data.get("items"),
                "visit": data.get("visit"), "pending": data.get("pending"),
                # what would move it on: the outside work it awaits (an agent's turn, a command), or
                # the user (interrupted: continue, recast or abort; paused: the refinement)
                "waiting_for": data.get("waiting_for"),
                "activity": activity.get("text"), "waiting_s": activity.get("age_s"),
                "deadline_in_s": activity.get("deadline_in_s"),
                "age_s": data.get("cast_age_s"), "restarts": cast.get("restarts", 0),
                "socket_actors": sockets_of.get((sid, cast_id), []),
            })
        labels = actor.get("labels") or {}
        sessions.append({"session_id": sid, "label": labels.get("label"), "project": labels.get("project"),
                         "path": actor["path"], "state": actor["state"], "restarts": actor.get("restarts", 0),
                         "casts": sorted(casts, key=lambda c: c["cast_id"])})
    return sessions


# -- text rendering -----------------------------------------------------------------------
def actor_tree(snapshot: dict[str, Any]) -> Tree:
    """Render ``ops.actors`` as a tree: what each actor does now and its mailbox figures."""
    root = Tree("[bold]castor actors[/bold]")
    nodes: dict[str, Tree] = {}
    for actor in snapshot.get("actors", []):
        path = actor["path"]
        parent_path = path.rsplit("/", 1)[0]
        parent = nodes.get(parent_path, root)
        nodes[path] = parent.add(_actor_line(actor))
    threads = snapshot.get("threads") or []
    if threads:  # the threads castor runs that are not actor loops (castor.supervision.threads)
        branch = root.add(f"[bold]threads[/bold] ({len(threads)})")
        for row in threads:
            branch.add(shown(f"{row['name']}  for {row['owner']}: {row['purpose']}  ({row['age_s']:.0f}s)"))
    return root


def actor_list(actors: list[dict[str, Any]], sort: str) -> Table:
    """A flat table of actors in the given (worst-first) order."""
    table = Table(title=f"castor actors by {sort}, worst first")
    for column in ("path", "kind", "state", "depth", "oldest", "doing", "for", "deadline", "restarts",
                   "last failure"):
        table.add_column(column)
    for actor in actors:
        box = actor["mailbox"]
        activity = actor.get("activity") or {}
        failure = actor.get("last_failure")
        # a retired actor does nothing: why it retired is what it does (as the tree says)
        doing = f"retired: {actor['retired_reason']}" if actor.get("retired_reason") else activity.get("text", "-")
        table.add_row(shown(actor["path"]), shown(str(actor["kind"])), _state(actor["state"]), str(box["depth"]),
                      _seconds(box.get("oldest_age_s")), shown(str(doing)),
                      _seconds(activity.get("age_s")), _deadline(activity.get("deadline_in_s")),
                      _restarts(actor),
                      shown(f"{failure['error_type']} {duration(failure['age_s'])} ago") if failure else "-")
    return table


def casts_table(sessions: list[dict[str, Any]]) -> Table:
    """Each session's casts, one row each (a session without casts: one row saying so); with no
    session open at all, the table's caption says that, rather than an empty table."""
    table = Table(title="castor casts by session",
                  caption=None if sessions else "no open sessions: no harness has opened one on this castor")
    for column in ("session", "cast", "phase", "socket", "item", "visit", "doing", "for", "deadline", "age",
                   "restarts"):
        table.add_column(column)
    for session in sessions:
        name = f"{session['session_id']} ({session.get('label') or '-'}) {session.get('project') or ''}".strip()
        if not session["casts"]:
            table.add_row(shown(name), "-", "", "", "", "", "no casts", "", "", "", "")
        for cast in session["casts"]:
            socket = cast.get("socket") or "-"
            if cast.get("materia"):
                socket += f" ({cast['materia']})"
            phase = str(cast.get("phase") or "-")
            if cast.get("waiting_for"):
                phase = f"{phase}, waiting for {cast['waiting_for']}"
            item = str(cast.get("item") or "-")
            if cast.get("item_number") and cast.get("items"):  # how far the loop is
                item += f" ({cast['item_number']} of {cast['items']})"
            table.add_row(shown(name), shown(cast["cast_id"]), shown(phase),
                          shown(socket), shown(item), str(cast.get("visit") or "-"),
                          shown(str(cast.get("activity") or "-")), _seconds(cast.get("waiting_s")),
                          _deadline(cast.get("deadline_in_s")), _seconds(cast.get("age_s")),
                          str(cast.get("restarts", 0)))
    return table


def _restarts(actor: dict[str, Any]) -> str:
    """A table cell: the restarts, and how much of the restart limit the window holds now."""
    words = budget_words(actor)
    return f"{actor.get('restarts', 0)}" + (f" ({words})" if words else "")


def _deadline(left: Any) -> str:
    """A table cell: how far off an activity's deadline is, ``passed Ns ago``, or ``-`` (none)."""
    if not isinstance(left, (int, float)):
        return "-"
    return _seconds(left) if left >= 0 else f"passed {duration(-left)} ago"


def _seconds(value: Any) -> str:
    return duration(value) if isinstance(value, (int, float)) else "-"


def _actor_line(actor: dict[str, Any]) -> str:
    box = actor["mailbox"]
    name = shown(actor["path"].rsplit("/", 1)[1])
    age = box.get("oldest_age_s")
    flight = box.get("in_flight")
    parts = [
        f"[cyan]{name}[/cyan] {shown(str(actor['kind']))}",
        _state(actor["state"]),
        f"#{actor['incarnation']}",
        f"depth={box['depth']}",
        # a minute or more in minutes, hours and days: a message queued since yesterday is not 90000.000s
        (f"oldest={age:.3f}s" if age < 60 else f"oldest={duration(age)}") if age is not None else "oldest=-",
        f"done={box['processed']}",
    ]
    labels = actor.get("labels") or {}
    if labels.get("label") or labels.get("project"):
        parts.append(
            f"[bold]{shown(str(labels.get('label') or '-'))}[/bold] {shown(str(labels.get('project') or ''))}"
        )
    if box.get("failed"):
        parts.append(f"[red]failed={box['failed']}[/red]")
    budget = budget_words(actor)
    if actor.get("restarts") or budget:
        parts.append(f"[yellow]restarts={actor.get('restarts', 0)}{f' ({budget})' if budget else ''}[/yellow]")
    activity = actor.get("activity")
    if activity and activity.get("kind") not in (None, "idle", "handling"):
        bound = deadline_words(activity)
        parts.append(f"[blue]{shown(str(activity['text']))} for {duration(activity['age_s'])}"
                     f"{', ' + bound if bound else ''}[/blue]")
    elif activity and activity.get("kind") == "idle":
        parts.append(f"[dim]idle {duration(activity['age_s'])}[/dim]")
    if flight:
        since = flight["since_s"]
        parts.append(f"busy={shown(str(flight['message_type']))} "
                     f"{f'{since:.2f}s' if since < 60 else duration(since)}")
    failure = actor.get("last_failure")
    if failure:
        parts.append(f"[red]last failure {shown(str(failure['error_type']))} {duration(failure['age_s'])} ago[/red]")
    if actor.get("retired_reason"):  # runtime data, shown as text: never rich markup
        parts.append(f"[magenta]retired: {shown(str(actor['retired_reason']))}[/magenta]")
    return "  ".join(parts)


def _doing_words(actor: dict[str, Any]) -> str:
    """What ``actor`` does now, for how long and the deadline that ends it, if one does (the
    message it handles when it says nothing of its own; ``idle`` and for how long): the words of
    its tree line's activity, without the rest of that line (kind, state, mailbox), which the
    table that shows them has rows of its own for."""
    activity = actor.get("activity") or {}
    flight = (actor.get("mailbox") or {}).get("in_flight")
    if activity.get("kind") not in (None, "idle", "handling"):
        bound = deadline_words(activity)
        return f"{shown(str(activity['text']))} for {duration(activity['age_s'])}{', ' + bound if bound else ''}"
    if flight:
        return f"handling {shown(str(flight['message_type']))} for {duration(flight['since_s'])}"
    if activity.get("kind") == "idle":
        return f"idle {duration(activity['age_s'])}"
    return "idle"


def _state(state: str) -> str:
    color = {"running": "green", "retired": "magenta", "crashed": "red", "stopped": "dim"}.get(state, "yellow")
    return f"[{color}]{state}[/{color}]"


def mailbox_table(actor: dict[str, Any]) -> Table:
    box = actor["mailbox"]
    table = Table(title=f"mailbox of {shown(actor['path'])}")
    table.add_column("field")
    table.add_column("value")
    for key in ("depth", "capacity", "oldest_age_s", "processed", "failed", "rejected", "dead_letters"):
        table.add_row(key, str(box.get(key)))
    table.add_row("in_flight", shown(json.dumps(box.get("in_flight"))))
    activity = actor.get("activity")
    if activity:
        bound = deadline_words(activity)  # the bound that ends it, as the tree says it
        table.add_row("activity", shown(f"{activity.get('text')} for {duration(activity.get('age_s', 0))}"
                                        f"{', ' + bound if bound else ''}"))
    if actor.get("retired_reason"):
        table.add_row("retired", shown(str(actor["retired_reason"])))
    for type_name, count in sorted(box.get("by_type", {}).items()):
        table.add_row(f"queued {shown(type_name)}", str(count))
    queued = box.get("queued") or []
    for n, entry in enumerate(queued, 1):
        table.add_row(f"waiting #{n}", shown(queued_words(entry)))
    if queued and box.get("depth", 0) > len(queued):
        table.add_row("waiting", f"... and {box['depth'] - len(queued)} more")
    return table


def hosts_table(data: dict[str, Any]) -> Table:
    """``ops.hosts``: where casts run (the Ray backend's cast hosts, their nodes and casts)."""
    table = Table(title=f"cast hosts ({data.get('backend')})")
    for column in ("host", "node", "pid", "alive", "sessions", "casts"):
        table.add_column(column)
    for host in data.get("hosts", []):
        # A live host that did not answer (its node cut off, say) is not shown as alive with no casts.
        alive = "no" if not host["alive"] else f"not answering: {shown(str(host['error']))}" if host.get("error") \
            else "yes"
        table.add_row(host["host_id"], str(host["node_id"])[:12], str(host["pid"]), alive,
                      ", ".join(host["sessions"]), "\n".join(c.rsplit("/", 1)[-1] for c in host["casts"]) or "-")
    if data.get("backend") == "local" and not data.get("hosts"):  # an empty table said nothing of where
        table.add_row("local", "-", "-", "yes", "all", "in the castor serve process itself (the local backend)")
    return table


def _mib(value: Any) -> str:
    return f"{value / 2**20:.1f} MiB" if isinstance(value, (int, float)) else "-"


def _process_rows(table: Table, who: str, proc: dict[str, Any]) -> None:
    cpu = [proc.get("cpu_user_s"), proc.get("cpu_system_s")]
    files = proc.get("open_files")
    table.add_row(f"{who} pid", shown(proc.get("pid")) + ("" if proc.get("alive", True) else " (not running)"))
    table.add_row(f"{who} memory (RSS)", _mib(proc.get("rss_bytes")))
    if all(isinstance(c, (int, float)) for c in cpu):
        table.add_row(f"{who} CPU", f"{cpu[0]:.2f} s user, {cpu[1]:.2f} s system")
    for key, label in (("threads", "threads"), ("num_fds", "descriptors"), ("calls", "calls served"),
                       ("state", "process state")):
        if proc.get(key) is not None:
            table.add_row(f"{who} {label}", shown(proc[key]))
    if files is not None:
        table.add_row(f"{who} open files", shown(len(files) if isinstance(files, list) else files))
    children = proc.get("children")
    if children:
        table.add_row(f"{who} children", shown(len(children) if isinstance(children, list) else children))


def worker_table(data: dict[str, Any]) -> Table:
    """``ops.worker``: the runtime's process, and with a session, its Icarus worker (actor and process)."""
    table = Table(title="castor process" + (" and Icarus worker" if data.get("worker") else ""), show_header=False)
    table.add_column("what")
    table.add_column("value")
    _process_rows(table, "castor", data.get("runtime") or {})
    worker = data.get("worker")
    if isinstance(worker, dict) and worker.get("state") == "unavailable":  # no worker ever starts here
        table.add_row("session", shown(worker.get("session_id")))
        why = shown(worker.get("reason"))
        if worker.get("reason") == "icarus_dir_missing":
            why += f": no Icarus package at {shown(worker.get('icarus_dir'))}"
        table.add_row("icarus", f"unavailable ({why}); no worker starts in this session (icarusDir in the "
                                "piIcarusHook settings names the package)")
    elif isinstance(worker, dict):
        actor = worker.get("actor") or {}
        table.add_row("session", shown(worker.get("session_id")))
        table.add_row("worker actor", f"{shown(worker.get('path') or actor.get('path'))} ({shown(actor.get('state'))})")
        if actor.get("retired_reason"):
            table.add_row("retired", shown(actor["retired_reason"]))
        table.add_row("doing now", _doing_words(actor))
        box = actor.get("mailbox") or {}
        table.add_row("mailbox depth", shown(box.get("depth", 0)))
        queued = box.get("queued") or []
        if queued:  # the calls waiting behind the running one: what each is for and how long it waits
            more = box.get("depth", 0) - len(queued)
            table.add_row("queued calls", shown("; ".join(queued_words(entry) for entry in queued)
                                                + (f"; ... and {more} more" if more > 0 else "")))
        table.add_row("restarts", _restarts(actor))
        table.add_row("workers started", shown(worker.get("workers_started")))
        crash_loop = worker.get("crash_loop")
        if isinstance(crash_loop, dict) and crash_loop.get("text"):
            table.add_row("crash loop", shown(crash_loop["text"]))
        process = worker.get("process")
        if isinstance(process, dict):
            _process_rows(table, "worker", process)
        else:
            table.add_row("worker process", "none yet (it starts with the first call)")
    return table


class PipeConsole(Console):
    """A rich console whose broken pipe is the caller's to handle: rich's own answer exits the
    process with status 1 and no word, where the ``castor`` command ends quietly with 0 when the
    reader went away (``| head``) and says what failed otherwise."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more is written through it
        raise BrokenPipeError(32, "Broken pipe")


def terminal_console(stream: Any = None) -> Console:
    """rich on a terminal; on a pipe or file, a console that never wraps or cuts a line."""
    stream = stream if stream is not None else sys.stdout
    if getattr(stream, "isatty", lambda: False)():
        return PipeConsole(file=stream)
    return PipeConsole(file=stream, width=100_000, soft_wrap=True, no_color=True)
