"""``castor demo`` section 2: concurrent build casts, a rework loop, real commands, a killed SocketActor.

One :class:`~castor.runtime.Runtime` with the materia component. A simulated harness — the
scripted agent (:mod:`castor.adapters.agents.scripted`, no model) — drives three sessions with
two concurrent casts each of the bundled ``build`` loadout, whose ``Socket-6`` runs a real
command here (it records ``$CASTOR_VISIT_ID``; see :func:`castor.testing.soak.build_loadout_config`),
and whose ``vcs.detect`` / ``project.ensureIgnored`` built-ins touch the real project. The
reviewer rejects item 1 once, so every cast goes round the rework loop.

One cast's first builder turn is slow; while it is in flight its ``SocketActor`` is killed
(``castor.supervision.faults.kill``). The cast hears ``WorkLost``, re-dispatches the turn
under a new visit id and completes like the others.

What is checked (each a ``report.check``; the demo exits 0 only if all pass):

======================  ====================================================================
check                   evidence
======================  ====================================================================
concurrency             all casts were active at the same time (live status polls)
fault recovery          the killed SocketActor's cast has a ``cast_recast`` event, the agent
                        saw the killed turn and a new turn id, and the cast completed
every cast complete     ``status == "complete"`` for all of them
events.jsonl parses     every line of every cast's events.jsonl is a JSON event
socket sequence         the ``socket_complete`` order is the expected build loop including
                        the rework (S1 S2 S3 S4 S5 S4 S5 S6 S4 S5 S6 S7 for two items)
real commands, once     the command's visit log has one line per (cast, item), no duplicate
state files             every cast's state.json loads
======================  ====================================================================

Failure behaviour: a cast that does not end within :data:`CAST_DEADLINE_S` fails its checks
(the section never hangs); the runtime is always shut down.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.live import Live
from rich.table import Table

from castor.actors.materia.api import materia_call
from castor.adapters.agents.scripted import ScriptedAgent, parse_script
from castor.adapters.fs import make_dirs
from castor.composition import materia_component
from castor.console.terminal import actor_tree
from castor.messages.errors import CastorError
from castor.ports.host_context import NoHostContext
from castor.runtime import HarnessLink, Runtime, RuntimeSettings, SessionInfo
from castor.supervision import faults
from castor.testing.soak import (
    TERMINAL,
    build_script,
    cast_dirs,
    count_bad_event_lines,
    count_duplicate_visits,
    count_unreadable_states,
    expected_sequence,
    read_events,
    socket_sequence,
    write_project,
)

if TYPE_CHECKING:
    from castor.testing.report import DemoReport

SECTION = "casts"
SESSIONS = ("demo-a", "demo-b", "demo-c")
CASTS_PER_SESSION = 2
ITEMS = 2
TURN_DELAY_MS = 60
#: The victim session's first builder turn takes this long, so the kill lands mid-turn.
SLOW_TURN_MS = 2500
VICTIM_SESSION = "demo-b"
CAST_DEADLINE_S = 20.0
POLL_S = 0.1


@dataclass
class _Cast:
    sid: str
    cast_id: str
    run_dir: Path
    view: dict[str, Any] = field(default_factory=dict)
    note: str = ""


class _Scene:
    def __init__(self, root: Path) -> None:
        self.dir = root / "casts"
        self.visit_log = self.dir / "utility-visits.log"
        make_dirs(self.dir)
        self.visit_log.unlink(missing_ok=True)
        self.runtime = Runtime(RuntimeSettings(allow_faults=True, max_casts_per_session=CASTS_PER_SESSION),
                               components=[materia_component()])
        self.agents: dict[str, ScriptedAgent] = {}
        self.casts: list[_Cast] = []

    def project(self, sid: str) -> Path:
        return self.dir / sid

    def open_sessions(self) -> None:
        for sid in SESSIONS:
            project = self.project(sid)
            make_dirs(project)
            write_project(project, self.visit_log, command_sleep_s=0.0)
            slow = SLOW_TURN_MS if sid == VICTIM_SESSION else None
            script = build_script(items=ITEMS, delay_ms=lambda: TURN_DELAY_MS, spare=4, slow_builder_ms=slow)
            agent = ScriptedAgent(parse_script(script), max_workers=4)
            self.agents[sid] = agent
            self.runtime.open_session(SessionInfo(session_id=sid, cwd=str(project), trusted=True),
                                      HarnessLink(agent=agent, session_log=None, ui=None,
                                                  host_context=NoHostContext()))

    def start_casts(self) -> None:
        for n in range(CASTS_PER_SESSION):
            for sid in SESSIONS:
                view = materia_call(self.runtime, sid, "start", {"request": f"demo build {sid} #{n + 1}"})
                self.casts.append(_Cast(sid=sid, cast_id=view["cast_id"], run_dir=Path(view["run_dir"]), view=view))

    def poll(self) -> int:
        """Refresh every cast's status; returns how many are active now."""
        active = 0
        for cast in self.casts:
            if cast.view.get("status") in TERMINAL:
                continue
            try:
                cast.view = materia_call(self.runtime, cast.sid, "status", {"cast_id": cast.cast_id})
            except CastorError as exc:
                cast.note = f"status failed: {exc.code}"
                continue
            active += cast.view.get("status") == "active"
        return active

    def socket_handle(self, cast: _Cast) -> Any:
        supervisor = f"/root/session/{cast.sid}/socket"
        prefix = f"{supervisor}/{cast.cast_id}."
        found = [h for h in self.runtime.system.registry.handles(supervisor) if h.path.startswith(prefix) and h.alive]
        return found[0] if found else None


def _table(casts: list[_Cast]) -> Table:
    table = Table(title="casts (live)", expand=False)
    for column in ("session", "cast", "status", "socket", "item", "visits", "note"):
        table.add_column(column)
    for cast in casts:
        v = cast.view
        status = v.get("status", "?")
        color = {"complete": "green", "failed": "red", "aborted": "red", "active": "yellow"}.get(status, "white")
        materia = f" ({v['current_materia']})" if v.get("current_materia") else ""
        socket = f"{v.get('current_socket') or '-'}" + materia
        visits = sum((v.get("visits") or {}).values())
        table.add_row(cast.sid, cast.cast_id, f"[{color}]{status}[/{color}]", socket, str(v.get("item_key") or "-"),
                      str(visits), cast.note)
    return table


def _run_live(report: DemoReport, scene: _Scene) -> tuple[int, dict[str, Any]]:
    """Drive the casts to the end under a live view; kill the victim's SocketActor mid-turn."""
    victim = next(c for c in scene.casts if c.sid == VICTIM_SESSION)
    fault: dict[str, Any] = {}
    max_active = 0
    deadline = time.monotonic() + CAST_DEADLINE_S
    with Live(_table(scene.casts), console=report.console, refresh_per_second=10, transient=False) as live:
        while time.monotonic() < deadline:
            max_active = max(max_active, scene.poll())
            if not fault and victim.view.get("current_socket") == "Socket-4":
                handle = scene.socket_handle(victim)
                pending = victim.view.get("pending") or {}
                if handle is not None and scene.agents[VICTIM_SESSION].in_flight():
                    fault = {"path": handle.path, "visit_id": pending.get("visit_id")}
                    faults.kill(handle, "demo: SocketActor killed mid-turn")
                    victim.note = f"SocketActor {handle.path.rsplit('/', 1)[1]} killed mid-turn"
            live.update(_table(scene.casts))
            if all(c.view.get("status") in TERMINAL for c in scene.casts):
                break
            time.sleep(POLL_S)
    report.console.print()
    return max_active, fault


def _check(report: DemoReport, scene: _Scene, max_active: int, fault: dict[str, Any]) -> None:
    check = report.check
    total = len(scene.casts)
    check(SECTION, f"{len(SESSIONS)} sessions × {CASTS_PER_SESSION} casts of the build loadout ran concurrently",
          max_active >= len(SESSIONS), f"{max_active} of {total} casts active at once")
    victim = next(c for c in scene.casts if c.sid == VICTIM_SESSION)
    victim_types = [e.get("type") for e in read_events(victim.run_dir)]
    turn_ids = [r.turn_id for r in scene.agents[VICTIM_SESSION].requests() if r.cast_id == victim.cast_id]
    killed_visit = fault.get("visit_id")
    check(SECTION, "killed SocketActor: its turn was re-dispatched under a new visit id and the cast completed",
          bool(fault) and victim.view.get("status") == "complete" and "cast_recast" in victim_types
          and killed_visit in turn_ids and turn_ids.count(killed_visit) == 1,
          f"{fault.get('path', 'no SocketActor was killed')}")
    statuses = {c.cast_id: c.view.get("status") for c in scene.casts}
    check(SECTION, "every cast ended complete", all(s == "complete" for s in statuses.values()),
          ", ".join(f"{s}" for s in sorted(set(map(str, statuses.values())))))
    bad_lines = count_bad_event_lines(c.run_dir for c in scene.casts)
    ends = sum(1 for c in scene.casts if [e.get("type") for e in read_events(c.run_dir)][-1:] == ["cast_end"])
    check(SECTION, "every events.jsonl parses and ends with cast_end", bad_lines == 0 and ends == total,
          f"{bad_lines} bad lines, {ends}/{total} end with cast_end")
    want = expected_sequence(ITEMS)
    wrong = [c.cast_id for c in scene.casts if socket_sequence(c.run_dir) != want]
    check(SECTION, "socket sequence is the build loop with the rework", not wrong,
          " ".join(s.replace("Socket-", "S") for s in want) + (f"; wrong: {wrong}" if wrong else ""))
    duplicates, missing = count_duplicate_visits(scene.visit_log)
    lines = scene.visit_log.read_text().splitlines() if scene.visit_log.exists() else []
    check(SECTION, "utility Socket-6 ran a real command once per item visit",
          len(lines) == total * ITEMS and duplicates == 0 and missing == 0,
          f"{len(lines)} runs, {duplicates} duplicate visit ids")
    roots = [scene.project(sid) / ".pi" / "pi-materia" for sid in SESSIONS]
    unreadable = count_unreadable_states(roots)
    dirs = sum(len(cast_dirs(r)) for r in roots)
    check(SECTION, "every state.json loads", unreadable == 0 and dirs == total,
          f"{dirs} casts, {unreadable} unreadable")


def _artifacts(scene: _Scene) -> Table:
    table = Table(title="where the artifacts are")
    table.add_column("cast")
    table.add_column("run dir")
    table.add_column("files")
    for cast in scene.casts:
        table.add_row(f"{cast.sid}/{cast.cast_id}", str(cast.run_dir),
                      str(sum(1 for p in cast.run_dir.rglob("*") if p.is_file())))
    table.add_row("utility visit log", str(scene.visit_log), "")
    return table


def section_casts(report: DemoReport, root: Path) -> None:
    """Run the casts section under ``root / "casts"``; every outcome is a ``report.check``."""
    from castor.testing.report import section_header

    console = report.console
    section_header(console, "2. casts: concurrent build loops, rework, real commands, a killed SocketActor")
    scene = _Scene(root)
    try:
        scene.open_sessions()
        scene.start_casts()
        max_active, fault = _run_live(report, scene)
        _check(report, scene, max_active, fault)
        console.print(_artifacts(scene))
        console.print(actor_tree(scene.runtime.system.snapshot().model_dump(mode="json")))
    finally:
        scene.runtime.shutdown(10)


__all__ = ["section_casts"]
