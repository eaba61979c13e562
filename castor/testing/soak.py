"""``castor soak``: many casts and worker calls under random fault injection, then invariants.

One process, one :class:`~castor.runtime.Runtime` with the materia and Icarus components.
N harness sessions (each its own project directory, a trusted one) run M casts each of the
bundled ``build`` loadout, with ``Socket-6`` turned into a real command (:data:`VISIT_RECORDER`)
and the scripted agent answering with small random delays (a rework loop on the first item).
Beside the casts, every session calls the Icarus worker (the reference backend,
``examples/icarus_reference``, a stand-in for the private plugin) with ``fabric_write``
calls that each carry a unique id. A fault injector picks, at random intervals, one of:

===================  ===============================================================
fault kind           what it does (``castor.supervision.faults``)
===================  ===============================================================
kill_cast            ``kill`` a CastActor (restart resumes from state.json)
crash_cast           ``crash_next(cast, "materia.cast.outcome")``: the next outcome crashes it
kill_socket          ``kill`` a SocketActor mid-turn (``WorkLost`` → re-dispatch)
kill_utility         ``kill`` a utility slot (a running command's tree dies too)
kill_utility_process ``kill_process`` on a busy utility slot (only counted if a pid died)
crash_utility        ``crash_next(slot, "materia.utility.job")``
kill_worker          ``kill`` an Icarus worker actor (its process dies)
kill_worker_process  ``kill_process`` on a worker actor (only counted if a pid died)
delay                ``delay_next`` (0.05–0.5 s) on a cast, socket, slot or worker
===================  ===============================================================

for ``--seconds`` (or until every cast has ended, if sooner). Then it stops injecting,
waits for quiescence, recasts every resumable cast (failed, aborted or orphaned) and checks:

==================================  =====================================================  ========
figure                              how it is measured                                     must be
==================================  =====================================================  ========
stranded asks                       every ask the soak made (materia verbs, worker           0
                                    calls) returned by its deadline + 1 s, and none ended
                                    in an ask-level ``timeout`` (nobody answered)
utility visits executed twice       the command appends ``$CASTOR_VISIT_ID`` to a log;         0
                                    any id there more than once
worker calls replayed               the backend's own call log: a call id started twice,       0
                                    a call rejected ``may_have_started=False`` that ran,
                                    or one that started after its rejection
unparseable events.jsonl lines      every line of every cast's events.jsonl is a JSON          0
                                    object with a ``type``
unreadable state files              every cast directory's state.json loads (a start           0
                                    killed before its first save is not a cast)
casts neither terminal nor          after quiescence: status not complete/failed/aborted       0
resumable                           and not resumable (e.g. stuck ``active``)
casts not terminal after recast     after the recast round                                     0
==================================  =====================================================  ========

Exit 0 only when every must-be-zero figure is zero. The fault schedule, agent delays and
plans come from ``random.Random(seed)``; thread timing is not deterministic, so two runs with
one seed inject the same sequence of fault kinds but may hit different targets.

The invariant checks are plain functions over files and records (``count_*``) so that tests
can feed them doctored inputs and see each violation counted.
"""

from __future__ import annotations

import copy
import json
import os
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from castor.adapters.fs import atomic_write_text, make_dirs
from castor.domain.materia.defaults import default_config
from castor.messages.errors import CastorError
from castor.testing.faults import fault_targets, inject_into

TERMINAL = ("complete", "failed", "aborted")
SETTLED = (*TERMINAL, "orphaned")
"""Statuses that will not change without a new command: ``orphaned`` is a cast whose actor
was given up (crash-looping past its restart intensity) — resumable by ``recast``."""
ASK_TIMEOUT_S = 30.0
#: An ask that returns later than its deadline plus this is counted as stranded.
ASK_GRACE_S = 1.0
WORKER_TIMEOUT_MS = 5000
#: The reference backend sleeps this long in every fabric_write (so process kills land mid-call).
WORKER_CALL_SLEEP_MS = 30
SOAK_SUMMARY_PREFIX = "soak-call-"

#: Socket-6's command: read the cast input, append this dispatch's visit id to argv[1], sleep argv[2] s.
VISIT_RECORDER = (
    "import os, sys, time\n"
    "sys.stdin.read()\n"
    "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)\n"
    "os.write(fd, (os.environ.get('CASTOR_VISIT_ID', 'missing') + '\\n').encode())\n"
    "os.close(fd)\n"
    "time.sleep(float(sys.argv[2]))\n"
    "print('{\"recorded\": true}')\n"
)


# =========================================================================== the workload
def build_loadout_config(visit_log: Path, *, command_sleep_s: float = 0.0) -> dict[str, Any]:
    """A project config layer: the bundled ``build`` loadout with Socket-6 running a real command.

    The bundled Socket-6 is a ``noop`` that advances the work-item cursor; here it is the
    :data:`VISIT_RECORDER` command with the same edges, so every item runs a real process.
    """
    build = copy.deepcopy(default_config()["loadouts"]["build"])
    noop = build["sockets"]["Socket-6"]
    build["sockets"]["Socket-6"] = {
        "type": "utility", "command": [sys.executable, "-c", VISIT_RECORDER, str(visit_log), f"{command_sleep_s:.3f}"],
        "timeoutMs": 20_000, "edges": noop["edges"],
    }
    return {"activeLoadout": "build", "loadouts": {"build": build}}


def write_project(project: Path, visit_log: Path, *, command_sleep_s: float = 0.0) -> None:
    make_dirs(project / ".pi")
    config = build_loadout_config(visit_log, command_sleep_s=command_sleep_s)
    atomic_write_text(project / ".pi" / "pi-materia.json", json.dumps(config, indent=2))  # an error names the file


def plan_text(items: int) -> str:
    return json.dumps({"summary": "plan", "workItems": [
        {"id": f"item-{n}", "title": f"item {n}", "description": f"change {n}", "acceptance": [f"{n} works"]}
        for n in range(1, items + 1)]})


def verdict_text(satisfied: bool) -> str:
    feedback = "" if satisfied else "the acceptance check fails; fix it"
    return json.dumps({"satisfied": satisfied, "feedback": feedback, "missing": [] if satisfied else ["check"]})


def build_script(*, items: int, delay_ms: Callable[[], int], spare: int = 40,
                 slow_builder_ms: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """The scripted agent's answers for one build cast (every cast replays its own cursor).

    The reviewer rejects the first attempt of item 1 once (the rework loop), then accepts
    everything. ``spare`` extra answers per socket absorb turns lost to faults (a lost turn
    consumes an answer; every builder/planner answer is interchangeable, and any extra
    reviewer answer is an accept, so a fault never changes where the cast goes).
    """
    def answer(text: str, delay: int | None = None) -> dict[str, Any]:
        return {"text": text, "delay_ms": delay_ms() if delay is None else delay}

    builders = [answer("built the item; checks pass") for _ in range(items + 1 + spare)]
    if slow_builder_ms is not None:
        builders[0] = answer("built the item; checks pass", slow_builder_ms)
    reviewers = [answer(verdict_text(False))] + [answer(verdict_text(True)) for _ in range(items + spare)]
    return {"Socket-3": [answer(plan_text(items)) for _ in range(1 + spare)],
            "Socket-4": builders, "Socket-5": reviewers,
            "Socket-7": [answer("summary: every item done") for _ in range(1 + spare)]}


def expected_sequence(items: int) -> list[str]:
    """The sockets a build cast with this script completes, in order (item 1 reworked once)."""
    seq = ["Socket-1", "Socket-2", "Socket-3", "Socket-4", "Socket-5"]
    for n in range(items):
        if n > 0:
            seq += ["Socket-4", "Socket-5"]
        if n == 0:
            seq += ["Socket-4", "Socket-5"]  # the rework: rejected once, built and reviewed again
        seq.append("Socket-6")
    return seq + ["Socket-7"]


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The parseable events of a cast (unparseable lines are counted by :func:`count_bad_event_lines`)."""
    path = Path(run_dir) / "events.jsonl"
    out: list[dict[str, Any]] = []
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def socket_sequence(run_dir: Path) -> list[str]:
    """Socket ids in the order their visits completed (``socket_complete`` events)."""
    return [str((e.get("data") or {}).get("socket"))
            for e in read_events(run_dir) if e.get("type") == "socket_complete"]


# =========================================================================== invariant checks
def count_bad_event_lines(run_dirs: Iterable[Path]) -> int:
    """Lines of ``events.jsonl`` that are not a JSON object with a string ``type`` (blank lines too)."""
    bad = 0
    for run_dir in run_dirs:
        path = Path(run_dir) / "events.jsonl"
        if not path.exists():
            continue
        raw = path.read_bytes()
        if raw and not raw.endswith(b"\n"):
            bad += 1  # a torn last line: an append that did not finish
            raw = raw.rsplit(b"\n", 1)[0] if b"\n" in raw else b""
        for line in raw.split(b"\n") if raw else []:
            if not line:
                continue
            try:
                value = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                bad += 1
                continue
            if not isinstance(value, dict) or not isinstance(value.get("type"), str):
                bad += 1
    return bad


def cast_dirs(artifact_root: Path) -> list[Path]:
    root = Path(artifact_root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def count_unreadable_states(artifact_roots: Iterable[Path]) -> int:
    """Cast directories whose state.json is missing, unreadable or not a valid cast state. A start
    killed before its cast's first save (a cast host's ``kill -9``) is not one: it was never a cast
    (its caller got an error, no id), and castor's listings remove it once it is left alone."""
    from castor.adapters.materia.state_store import CastStateStore, is_abandoned_start
    from castor.domain.materia.state import CastState

    bad = 0
    for root in artifact_roots:
        store = CastStateStore(root)
        for run_dir in cast_dirs(root):
            if is_abandoned_start(root, run_dir.name, min_age_s=0.0):
                continue
            try:
                stored = store.load(run_dir.name)
                CastState.from_json(json.dumps(stored.state))
            except Exception:  # noqa: BLE001 - any failure to read is the figure itself
                bad += 1
    return bad


def count_duplicate_visits(visit_log: Path) -> tuple[int, int]:
    """(executions beyond the first per visit id, executions without a visit id) in the recorder log."""
    if not Path(visit_log).exists():
        return 0, 0
    lines = [line for line in Path(visit_log).read_text(encoding="utf-8").splitlines() if line.strip()]
    counts = Counter(lines)
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    return duplicates, counts.get("missing", 0)


class WorkerOutcome(BaseModel):
    """What the soak saw for one worker call (``call_id`` is in the call's summary)."""

    model_config = ConfigDict(frozen=True)

    call_id: str
    ok: bool
    code: str | None = None
    may_have_started: bool | None = None
    ended_at: float  # wall clock, like the backend's call log ``t``


def count_replayed_worker_calls(call_log: list[dict[str, Any]], outcomes: Iterable[WorkerOutcome]) -> int:
    """Violations of "never replayed" in the reference backend's own call log.

    Counted: every extra ``start`` of one call id; a ``start`` of a call the soak saw
    rejected with ``may_have_started=False``; a ``start`` after the call's rejection.
    """
    starts: dict[str, list[float]] = {}
    for record in call_log:
        if record.get("phase") != "start" or record.get("call") != "tools.fabric_write":
            continue
        args = record.get("args") or [{}]
        summary = args[0].get("summary") if args and isinstance(args[0], dict) else None
        if isinstance(summary, str) and summary.startswith(SOAK_SUMMARY_PREFIX):
            starts.setdefault(summary, []).append(float(record.get("t") or 0.0))
    violations = sum(len(times) - 1 for times in starts.values() if len(times) > 1)
    for outcome in outcomes:
        if outcome.ok:
            continue
        times = starts.get(outcome.call_id, [])
        if outcome.may_have_started is False and times:
            violations += 1
        elif any(t > outcome.ended_at for t in times):
            violations += 1
    return violations


def read_call_log(path: Path) -> list[dict[str, Any]]:
    """The backend's call log; a line that does not parse is kept as ``{"phase": "unparseable"}``."""
    if not Path(path).exists():
        return []
    out = []
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            out.append({"phase": "unparseable"})
    return out


@dataclass
class AskRecord:
    kind: str
    started: float
    deadline: float
    ended: float | None = None
    error: str | None = None
    ask_timeout: bool = False  # the supervision core's own "nobody answered" timeout


def is_ask_timeout(exc: BaseException) -> bool:
    """An ask-level timeout (``PendingAsk.result``): the addressee never answered in time."""
    return isinstance(exc, CastorError) and str(exc.code) == "timeout" and "message_type" in (exc.data or {})


def count_stranded(asks: Iterable[AskRecord], *, grace: float = ASK_GRACE_S) -> int:
    return sum(1 for a in asks if a.ended is None or a.ask_timeout or a.ended > a.deadline + grace)


class AskLedger:
    """Every ask the soak makes, with its deadline and how it ended (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: list[AskRecord] = []

    def run(self, kind: str, timeout: float, fn: Callable[[], Any]) -> tuple[Any, BaseException | None]:
        now = time.monotonic()
        record = AskRecord(kind=kind, started=now, deadline=now + timeout)
        with self._lock:
            self.records.append(record)
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - an answer that is an error is still an answer
            record.ended = time.monotonic()
            record.error = str(getattr(exc, "code", type(exc).__name__))
            record.ask_timeout = is_ask_timeout(exc)
            return None, exc
        record.ended = time.monotonic()
        return value, None

    def snapshot(self) -> list[AskRecord]:
        with self._lock:
            return list(self.records)


class MustBeZero(BaseModel):
    stranded_asks: int = 0
    utility_visits_executed_twice: int = 0
    utility_runs_without_visit_id: int = 0
    worker_calls_replayed: int = 0
    unparseable_event_lines: int = 0
    unreadable_state_files: int = 0
    casts_neither_terminal_nor_resumable: int = 0
    casts_not_terminal_after_recast: int = 0
    sessions_lost: int = 0

    def violations(self) -> dict[str, int]:
        return {k: v for k, v in self.model_dump().items() if v}


# =========================================================================== settings and report
class SoakSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    sessions: int = Field(default=2, ge=1, le=64)
    casts: int = Field(default=4, ge=1, le=10_000)
    seconds: float = Field(default=20.0, gt=0, le=24 * 3600)
    seed: int = 0
    concurrency: int = Field(default=3, ge=1, le=256, description="casts running at once per session")
    items_max: int = Field(default=3, ge=1, le=10)
    delay_ms_max: int = Field(default=150, ge=0, le=60_000)
    fault_interval_s: tuple[float, float] = (0.1, 0.5)
    icarus: bool = True
    workdir: str | None = None
    backend: Literal["local", "ray"] = "local"  # ray: casts on cast hosts of a cluster (castor.scaleout)
    ray_address: str | None = None  # None with the ray backend: the soak starts a 3-node cluster of its own
    ray_hosts: int | None = Field(default=None, ge=1, le=1024)  # cast hosts (None: SOAK_HOSTS, see soak_on_ray)


class SoakReport(BaseModel):
    command: str
    started_at: str
    settings: SoakSettings
    workdir: str
    elapsed_s: float = 0.0
    casts_planned: int = 0
    casts_started: int = 0
    casts_completed: int = 0
    casts_failed: int = 0
    casts_aborted: int = 0
    casts_failed_before_recast: int = 0
    casts_resumed_by_recast: int = 0
    casts_completed_after_recast: int = 0
    casts_recovered_in_flight: int = 0
    faults: dict[str, int] = Field(default_factory=dict)
    faults_skipped_no_target: int = 0
    utility_executions: int = 0
    worker_calls: dict[str, int] = Field(default_factory=dict)
    asks: int = 0
    must_be_zero: MustBeZero = Field(default_factory=MustBeZero)
    notes: list[str] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.must_be_zero.violations()


# =========================================================================== the run
@dataclass
class _Session:
    sid: str
    project: Path
    rng: random.Random
    cast_ids: list[str] = field(default_factory=list)
    icarus: Any = None  # IcarusSession | None


class Soak:
    """One soak run (see the module docstring). ``run()`` returns the report."""

    def __init__(self, settings: SoakSettings, *, command: str = "castor soak",
                 on_progress: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        self.command = command
        self.progress = on_progress or (lambda _line: None)
        self.rng = random.Random(settings.seed)
        self.asks = AskLedger()
        self.outcomes: list[WorkerOutcome] = []
        self._outcomes_lock = threading.Lock()
        self.faults: Counter[str] = Counter()
        self.skipped = 0
        self.stop_faults = threading.Event()
        self.stop_worker_load = threading.Event()
        self.sessions: list[_Session] = []
        self.notes: list[str] = []

    # -- set-up ----------------------------------------------------------------
    def _prepare(self, root: Path) -> Any:
        from castor.composition import materia_component
        from castor.runtime import Runtime, RuntimeSettings

        s = self.settings
        self.root = root
        self.visit_log = root / "utility-visits.log"
        self.call_log = root / "icarus" / "backend-calls.jsonl"
        for stale in (self.visit_log, self.call_log):
            stale.unlink(missing_ok=True)
        components = [materia_component()]
        self.scaleout: Any = None
        self.cluster: Any = None
        if s.backend == "ray":
            from castor.testing.soak_on_ray import ClusterPacing, start_cluster_backend

            self.cluster, self.scaleout = start_cluster_backend(s.ray_address, s.ray_hosts)
            self.cluster_pacing = ClusterPacing()
            from castor.scaleout.options import materia_component_for

            components = [materia_component_for(self.scaleout)]
        if s.icarus:
            component = self._icarus_component(root)
            if component is not None:
                components.append(component)
        # The soak kills workers under calls on purpose, faster than any real package dies: the
        # crash-loop limit (docs/icarus.md "Crash loop") would give them up and refuse the very
        # calls whose outcomes it checks, so it is set out of reach here.
        self.runtime = Runtime(RuntimeSettings(allow_faults=True, max_casts_per_session=max(s.casts, s.concurrency),
                                               utility_slots=4, icarus_worker_max_deaths=10_000),
                               components=components, scaleout=self.scaleout)
        return self.runtime

    def _icarus_component(self, root: Path) -> Any:
        from castor.composition import icarus_component
        from castor.testing.reference_backend import reference_backend

        backend = reference_backend()
        if not (backend / "__init__.py").is_file():
            self.notes.append(f"no reference Icarus backend at {backend}: worker faults not injected")
            return None
        base = root / "icarus"
        agent_dir = base / "agent"
        make_dirs(agent_dir)
        section = {"icarusDir": str(backend), "python": sys.executable, "fabricDir": str(base / "fabric"),
                   "timeoutMs": WORKER_TIMEOUT_MS, "hooks": False}
        atomic_write_text(agent_dir / "settings.json", json.dumps({"piIcarusHook": section}, indent=2))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PI_CODING_AGENT_DIR": str(agent_dir),
               "ICARUS_REF_CALL_LOG": str(self.call_log),
               "ICARUS_REF_CONTROLS": json.dumps({"tools.fabric_write": {"sleep_ms": WORKER_CALL_SLEEP_MS}})}
        return icarus_component(env=env, home=str(base))

    def _open_sessions(self) -> None:
        from castor.actors.icarus.component import session_of
        from castor.adapters.agents.scripted import ScriptedAgent, parse_script
        from castor.runtime import HarnessLink, SessionInfo

        s = self.settings
        for n in range(s.sessions):
            sid = f"soak-{n}"
            rng = random.Random(self.rng.random())
            project = self.root / "projects" / sid
            make_dirs(project)
            write_project(project, self.visit_log, command_sleep_s=0.2)
            session = _Session(sid=sid, project=project, rng=rng)
            # One agent per session; its cursors are per cast, so every cast replays the script.
            items = rng.randint(1, s.items_max)
            script = build_script(items=items, delay_ms=lambda: rng.randint(0, s.delay_ms_max))
            agent = ScriptedAgent(parse_script(script), max_workers=4)
            ctx = self.runtime.open_session(SessionInfo(session_id=sid, cwd=str(project), trusted=True),
                                            HarnessLink(agent=agent, session_log=None, ui=None))
            try:
                session.icarus = session_of(ctx) if s.icarus else None
            except CastorError:
                session.icarus = None
            self.sessions.append(session)

    # -- asks --------------------------------------------------------------------
    def call(self, sid: str, verb: str, params: dict[str, Any] | None = None) -> tuple[Any, BaseException | None]:
        from castor.actors.materia.api import materia_call

        return self.asks.run(f"materia.{verb}", ASK_TIMEOUT_S,
                             lambda: materia_call(self.runtime, sid, verb, params, timeout=ASK_TIMEOUT_S))

    # -- casts -------------------------------------------------------------------
    def _drive_session(self, session: _Session, deadline: float) -> None:
        """Start this session's casts (at most ``concurrency`` at once) until done or the deadline."""
        s = self.settings
        running: set[str] = set()
        to_start = s.casts
        while time.monotonic() < deadline and (to_start or running):
            while to_start and len(running) < s.concurrency and time.monotonic() < deadline:
                view, err = self.call(session.sid, "start", {"request": f"soak cast {len(session.cast_ids) + 1}"})
                if err is not None:
                    break  # e.g. a crash in the SessionActor: try again on the next round
                session.cast_ids.append(view["cast_id"])
                running.add(view["cast_id"])
                to_start -= 1
            for cast_id in sorted(running):
                view, err = self.call(session.sid, "status", {"cast_id": cast_id})
                if err is None and view["status"] in SETTLED:
                    running.discard(cast_id)
            time.sleep(0.05)

    def _worker_load(self, session: _Session, lane: int) -> None:
        from castor.actors.icarus.worker import ASK_GRACE_S as WORKER_GRACE_S

        n = 0
        while not self.stop_worker_load.is_set():
            n += 1
            call_id = f"{SOAK_SUMMARY_PREFIX}{session.sid}-{lane}-{n}"
            params = {"type": "note", "summary": call_id, "content": "soak"}
            value, err = self.asks.run("icarus.tool", WORKER_TIMEOUT_MS / 1000 + WORKER_GRACE_S,
                                       lambda: session.icarus.tool("fabric_write", params))
            ok = err is None and not (isinstance(value, dict) and "error" in value)
            code = None if err is None else str(getattr(err, "code", type(err).__name__))
            outcome = WorkerOutcome(call_id=call_id, ok=ok,
                                    code=code if err is not None else ("ok" if ok else "tool_error"),
                                    may_have_started=getattr(err, "may_have_started", None), ended_at=time.time())
            with self._outcomes_lock:
                self.outcomes.append(outcome)
            self.stop_worker_load.wait(0.02)

    # -- faults ------------------------------------------------------------------
    FAULT_WEIGHTS = (("kill_cast", 3), ("crash_cast", 2), ("kill_socket", 4), ("kill_utility", 2),
                     ("kill_utility_process", 2), ("crash_utility", 1), ("kill_worker", 2),
                     ("kill_worker_process", 3), ("delay", 3))

    def inject_one(self, rng: random.Random) -> str | None:
        """Inject one random fault; returns its kind, or None if it found no target."""
        kinds, weights = zip(*self.FAULT_WEIGHTS, strict=True)
        kind = rng.choices(kinds, weights)[0]
        pick = rng.random()
        family = {"kill_cast": "cast", "crash_cast": "cast", "kill_socket": "socket", "kill_utility": "utility",
                  "kill_utility_process": "utility", "crash_utility": "utility", "kill_worker": "worker",
                  "kill_worker_process": "worker"}.get(kind) or rng.choice(["cast", "socket", "utility", "worker"])
        def delay_s() -> float:
            return round(0.05 + 0.45 * rng.random(), 3)

        if self.scaleout is not None:
            from castor.testing.soak_on_ray import inject_on_cluster

            return inject_on_cluster(self, rng, kind, family, pick, delay_s)
        return inject_into(self.runtime.system.registry, kind, family, pick, delay_s)

    def _targets(self, prefix_kind: str) -> list[Any]:
        return fault_targets(self.runtime.system.registry, prefix_kind)


    def _inject(self) -> None:
        rng = random.Random(self.rng.random())
        low, high = self.settings.fault_interval_s
        while not self.stop_faults.wait(low + (high - low) * rng.random()):
            kind = self.inject_one(rng)
            if kind is None:
                self.skipped += 1
            else:
                self.faults[kind] += 1

    # -- the phases ----------------------------------------------------------------
    def run(self) -> SoakReport:
        import tempfile

        s = self.settings
        started = time.monotonic()
        report = SoakReport(command=self.command, settings=s, workdir="",
                            started_at=time.strftime("%Y-%m-%d %H:%M:%S %Z"))
        with tempfile.TemporaryDirectory(prefix="castor-soak-") as tmp:
            root = Path(s.workdir or tmp).resolve()
            make_dirs(root)
            report.workdir = str(root)
            self._prepare(root)
            try:
                self._open_sessions()
                self._load_and_faults(report)
                self._quiesce_and_recast(report)
            finally:
                self.stop_faults.set()
                self.stop_worker_load.set()
                self.runtime.shutdown(30)
                if self.scaleout is not None:
                    from castor.testing.soak_on_ray import stop_cluster_backend

                    stop_cluster_backend(self.cluster, self.scaleout)
            self._check_files(report)
            report.elapsed_s = round(time.monotonic() - started, 1)
            report.notes = self.notes
        return report

    def _load_and_faults(self, report: SoakReport) -> None:
        s = self.settings
        deadline = time.monotonic() + s.seconds
        drivers = [threading.Thread(target=self._drive_session, args=(sess, deadline), name=f"soak-{sess.sid}",
                                    daemon=True) for sess in self.sessions]
        workers = [threading.Thread(target=self._worker_load, args=(sess, lane), name=f"soak-worker-{sess.sid}-{lane}",
                                    daemon=True)
                   for sess in self.sessions if sess.icarus is not None and sess.icarus.available for lane in (1, 2)]
        injector = threading.Thread(target=self._inject, name="soak-faults", daemon=True)
        for t in [*drivers, *workers, injector]:
            t.start()
        last = 0.0
        while any(t.is_alive() for t in drivers):
            time.sleep(0.2)
            if time.monotonic() - last > 5:
                last = time.monotonic()
                self.progress(f"casts started {sum(len(x.cast_ids) for x in self.sessions)}, "
                              f"faults {sum(self.faults.values())}, worker calls {len(self.outcomes)}")
        self.stop_faults.set()
        injector.join(5)
        self.stop_worker_load.set()
        bound = WORKER_TIMEOUT_MS / 1000 + 10
        for t in workers:
            t.join(bound)
        stuck_threads = sum(1 for t in workers if t.is_alive())
        if stuck_threads:
            self.notes.append(f"{stuck_threads} worker-load threads still blocked after {bound:.0f} s")
        report.casts_planned = s.sessions * s.casts
        report.faults = dict(sorted(self.faults.items()))
        report.faults_skipped_no_target = self.skipped

    def _rows(self, session: _Session) -> dict[str, dict[str, Any]]:
        """Every cast row of the session's project (``list`` is paged: all pages, 1,000 a page)."""
        rows: dict[str, dict[str, Any]] = {}
        cursor = None
        while True:
            view, err = self.call(session.sid, "list", {"limit": 1000, "cursor": cursor})
            if err is not None:
                return rows
            rows.update((r["cast_id"], r) for r in view["casts"] if r["cast_id"] in set(session.cast_ids))
            cursor = view.get("next_cursor")
            if not cursor:
                return rows

    def _wait_terminal(self, session: _Session, cast_ids: Iterable[str], timeout: float,
                       settled: tuple[str, ...] = SETTLED) -> None:
        pending = set(cast_ids)
        end = time.monotonic() + timeout
        while pending and time.monotonic() < end:
            for cast_id in sorted(pending):
                view, err = self.call(session.sid, "status", {"cast_id": cast_id})
                if err is None and view["status"] in settled:
                    pending.discard(cast_id)
            time.sleep(0.1)

    def _quiesce_and_recast(self, report: SoakReport) -> None:
        from castor.runtime import SESSIONS_PATH

        # Quiescence: every started cast has ended (or is not going anywhere).
        quiet_bound = 60.0 + 5 * self.settings.concurrency
        lost = 0
        for session in self.sessions:
            if self.runtime.system.find(f"{SESSIONS_PATH}/{session.sid}") is None:
                lost += 1
                continue
            self._wait_terminal(session, session.cast_ids, quiet_bound)
        report.must_be_zero.sessions_lost = lost
        neither = 0
        resumable: dict[str, list[str]] = {}
        for session in self.sessions:
            rows = self._rows(session)
            for cast_id in session.cast_ids:
                row = rows.get(cast_id)
                status = row["status"] if row else "missing"
                if status in ("failed", "aborted", "orphaned") and row and row["resumable"]:
                    resumable.setdefault(session.sid, []).append(cast_id)
                elif status not in TERMINAL:
                    neither += 1
            report.casts_started += len(session.cast_ids)
            report.casts_recovered_in_flight += sum(
                1 for cid in session.cast_ids
                if "cast_recast" in {e.get("type") for e in read_events(self._run_dir(session, cid))})
        report.must_be_zero.casts_neither_terminal_nor_resumable = neither
        report.casts_failed_before_recast = sum(len(v) for v in resumable.values())
        self.progress(f"quiescent: {report.casts_failed_before_recast} casts to recast")
        # Recast what is resumable (no faults any more), up to three rounds per cast.
        recast: set[str] = set()
        refused: dict[str, str] = {}  # cast id -> why its last recast was refused (one note a cast)
        for _round in range(3):
            for session in self.sessions:
                ids = resumable.get(session.sid, [])
                running = []
                for cast_id in ids:
                    _view, err = self.call(session.sid, "recast", {"cast_id": cast_id})
                    if err is None:
                        recast.add(cast_id)
                        running.append(cast_id)
                    else:  # e.g. storage_unavailable on a full disk: nothing runs, nothing to wait for
                        code = getattr(err, "code", None)
                        refused[cast_id] = (f"recast of {cast_id} refused: {code if code else type(err).__name__}: "
                                            f"{getattr(err, 'message', err)}")
                self._wait_terminal(session, running, quiet_bound, settled=TERMINAL)
                rows = self._rows(session)
                resumable[session.sid] = [cid for cid in ids if rows.get(cid, {}).get("status") != "complete"
                                          and rows.get(cid, {}).get("resumable")]
            if not any(resumable.values()):
                break
        self.notes.extend(note for cast_id, note in refused.items()
                          if any(cast_id in v for v in resumable.values()))
        report.casts_resumed_by_recast = len(recast)
        not_terminal = 0
        for session in self.sessions:
            rows = self._rows(session)
            for cast_id in session.cast_ids:
                status = rows.get(cast_id, {}).get("status", "missing")
                report.casts_completed += status == "complete"
                report.casts_failed += status == "failed"
                report.casts_aborted += status == "aborted"
                report.casts_completed_after_recast += status == "complete" and cast_id in recast
                not_terminal += status not in TERMINAL
        report.must_be_zero.casts_not_terminal_after_recast = not_terminal

    def _run_dir(self, session: _Session, cast_id: str) -> Path:
        return session.project / ".pi" / "pi-materia" / cast_id

    def _check_files(self, report: SoakReport) -> None:
        zero = report.must_be_zero
        roots = [session.project / ".pi" / "pi-materia" for session in self.sessions]
        zero.unparseable_event_lines = count_bad_event_lines(d for r in roots for d in cast_dirs(r))
        zero.unreadable_state_files = count_unreadable_states(roots)
        zero.utility_visits_executed_twice, zero.utility_runs_without_visit_id = count_duplicate_visits(self.visit_log)
        report.utility_executions = (sum(1 for line in self.visit_log.read_text().splitlines() if line.strip())
                                     if self.visit_log.exists() else 0)
        zero.worker_calls_replayed = count_replayed_worker_calls(read_call_log(self.call_log), self.outcomes)
        report.worker_calls = dict(sorted(Counter(o.code or "ok" for o in self.outcomes).items()))
        asks = self.asks.snapshot()
        zero.stranded_asks = count_stranded(asks)
        report.asks = len(asks)


def run_soak(settings: SoakSettings, *, command: str = "castor soak",
             on_progress: Callable[[str], None] | None = None) -> SoakReport:
    """Run one soak and return its report (``report.ok`` is the verdict)."""
    return Soak(settings, command=command, on_progress=on_progress).run()
