"""Materia cast costs, in one run:

    python bench/casts.py [--quick] [--dir DIR]

(a) **Engine cost per socket transition.** Casts of a 10-socket text loadout run through the
    real runtime (SessionActor, CastActor, SocketActor, CastStateStore, CastArtifacts) with a
    zero-latency scripted agent. The baseline writes *the same artifacts* — every file with its
    final content, every event line, every manifest rewrite, usage.json and state.json after
    each transition — with plain Python file writes of the same durability (temp + fsync +
    rename; fsynced appends), no actors and no engine. Ratio = runtime / baseline per socket.
(b) **1,000 concurrent casts** of the same loadout across 10 sessions (agent latency 200 ms so
    all of them are in flight at once): transitions per second, and peak RSS above the idle
    runtime (psutil, sampled every 20 ms) divided by the number of casts.

Figures are medians of the repetitions. Writes go to ``--dir`` (default: /dev/shm when it
exists, so the figures measure castor rather than the disk). Ends with
``RESULT <name> <value> target<=<target>`` lines.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import psutil

from castor.actors.materia.api import materia_call
from castor.actors.materia.component import materia_component
from castor.adapters.agents.scripted import ScriptedAgent, parse_script
from castor.logs import configure_logging
from castor.runtime import HarnessLink, Runtime, RuntimeSettings, SessionInfo

SOCKETS = 10


def ten_socket_config() -> dict:
    sockets = {}
    for n in range(1, SOCKETS + 1):
        socket = {"type": "agent", "materia": "step"}
        if n < SOCKETS:
            socket["edges"] = [{"when": "always", "to": f"Socket-{n + 1}"}]
        sockets[f"Socket-{n}"] = socket
    return {"activeLoadout": "ten", "limits": {"maxSocketVisits": 50, "maxEdgeTraversals": 50},
            "materia": {"step": {"prompt": "Do step {{request}}.", "tools": "none"}},
            "loadouts": {"ten": {"entry": "Socket-1", "sockets": sockets}}}


def make_project(base: Path, name: str) -> Path:
    project = base / name
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(ten_socket_config()))
    return project


def open_sessions(rt: Runtime, project: Path, count: int, answer: object) -> None:
    agent = ScriptedAgent(parse_script({"*": [answer] * SOCKETS}), max_workers=4)
    for n in range(count):
        rt.open_session(SessionInfo(session_id=f"bench-{n}", cwd=str(project), trusted=True),
                        HarnessLink(agent=agent, session_log=None, ui=None))


def wait_complete(rt: Runtime, started: list[tuple[str, str]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = list(started)
    while pending:
        sid, cast_id = pending[-1]
        view = materia_call(rt, sid, "status", {"cast_id": cast_id})
        if view["status"] in ("complete", "failed", "aborted"):
            if view["status"] != "complete":
                raise RuntimeError(f"cast {cast_id} ended {view['status']}: {view['failed_reason']}")
            pending.pop()
            continue
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(pending)} casts still running")
        time.sleep(0.005)


# --------------------------------------------------------------------------- (a)
def runtime_per_socket(base: Path, casts: int) -> tuple[float, list[Path]]:
    project = make_project(base, f"a-{time.monotonic_ns()}")
    rt = Runtime(RuntimeSettings(), components=[materia_component()])
    try:
        open_sessions(rt, project, 1, "ok")
        runs = []
        t0 = time.perf_counter()
        for _ in range(casts):  # one at a time: the per-transition cost, not concurrency
            started = materia_call(rt, "bench-0", "start", {"request": "bench"})
            wait_complete(rt, [("bench-0", started["cast_id"])], 60)
            runs.append(Path(started["run_dir"]))
        elapsed = time.perf_counter() - t0
    finally:
        rt.shutdown(30)
    return elapsed / (casts * SOCKETS), runs


def _atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def baseline_per_socket(base: Path, runs: list[Path]) -> float:
    """Write what the runtime wrote for ``runs``, with plain file writes of the same durability."""
    plans = []
    for run in runs:
        files = {p.relative_to(run): p.read_bytes() for p in run.rglob("*")
                 if p.is_file() and p.parent.name in ("contexts", "Socket-1", "Socket-2", "Socket-3", "Socket-4",
                                                      "Socket-5", "Socket-6", "Socket-7", "Socket-8", "Socket-9",
                                                      "Socket-10")}
        events = (run / "events.jsonl").read_bytes().splitlines(keepends=True)
        manifest = json.loads((run / "manifest.json").read_text())
        plans.append((files, events, manifest, (run / "config.resolved.json").read_bytes(),
                      (run / "usage.json").read_bytes(), (run / "state.json").read_bytes()))
    target = base / f"baseline-{time.monotonic_ns()}"
    t0 = time.perf_counter()
    for n, (files, events, manifest, config, usage, state) in enumerate(plans):
        run = target / str(n)
        (run / "contexts").mkdir(parents=True)
        _atomic(run / "config.resolved.json", config)
        entries = manifest["entries"]
        for i in range(len(entries) + 1):  # the manifest is rewritten on every entry
            _atomic(run / "manifest.json", json.dumps({**manifest, "entries": entries[:i]}, indent=2).encode())
        with open(run / "events.jsonl", "ab") as log:
            for line in events:  # one fsynced append per event
                log.write(line)
                log.flush()
                os.fsync(log.fileno())
        for rel, data in files.items():
            (run / rel).parent.mkdir(parents=True, exist_ok=True)
            _atomic(run / rel, data)
        for _ in range(SOCKETS + 1):  # usage.json and state.json after every transition
            _atomic(run / "usage.json", usage)
            _atomic(run / "state.json", state)
    return (time.perf_counter() - t0) / (len(plans) * SOCKETS)


# --------------------------------------------------------------------------- (b)
def concurrent(base: Path, casts: int, sessions: int) -> tuple[float, float]:
    project = make_project(base, f"b-{time.monotonic_ns()}")
    per_session = casts // sessions
    rt = Runtime(RuntimeSettings(max_casts_per_session=per_session), components=[materia_component()])
    proc = psutil.Process()
    try:
        open_sessions(rt, project, sessions, {"text": "ok", "delay_ms": 200})
        materia_call(rt, "bench-0", "list")  # warm imports and the config path
        gc.collect()
        time.sleep(0.3)
        idle = proc.memory_info().rss
        peak = [idle]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], proc.memory_info().rss)
                stop.wait(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        started = []
        for n in range(per_session):
            for s in range(sessions):
                sid = f"bench-{s}"
                started.append((sid, materia_call(rt, sid, "start", {"request": f"c{n}"})["cast_id"]))
        wait_complete(rt, started, 600)
        elapsed = time.perf_counter() - t0
        stop.set()
        sampler.join()
        transitions = casts * (SOCKETS + 1)
        return transitions / elapsed, (peak[0] - idle) / casts
    finally:
        rt.shutdown(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer casts and repetitions")
    parser.add_argument("--dir", help="where casts write (default /dev/shm if present, else a temp dir)")
    args = parser.parse_args()
    configure_logging("ERROR")
    root = Path(args.dir) if args.dir else Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    reps_a, casts_a = (3, 5) if args.quick else (5, 20)
    reps_b, casts_b = (1, 200) if args.quick else (3, 1000)
    with tempfile.TemporaryDirectory(prefix="castor-bench-", dir=root) as tmp:
        base = Path(tmp)
        ratios, runtime_us, baseline_us = [], [], []
        for _ in range(reps_a):
            per_socket, runs = runtime_per_socket(base, casts_a)
            plain = baseline_per_socket(base, runs)
            ratios.append(per_socket / plain)
            runtime_us.append(per_socket * 1e6)
            baseline_us.append(plain * 1e6)
        print(f"(a) per socket transition: runtime {statistics.median(runtime_us):.0f} us, "
              f"plain writes {statistics.median(baseline_us):.0f} us (median of {reps_a} x {casts_a} casts, {root})")
        rates, per_cast = [], []
        for _ in range(reps_b):
            rate, rss = concurrent(base, casts_b, 10)
            rates.append(rate)
            per_cast.append(rss)
            print(f"(b) {casts_b} concurrent casts: {rate:.0f} transitions/s, {rss / 1024:.1f} KiB peak RSS per cast")
    print(f"RESULT cast_transition_vs_plain_writes_ratio {statistics.median(ratios):.2f} target<=2")
    print(f"RESULT cast_transitions_per_second {statistics.median(rates):.0f} target>=0")
    print(f"RESULT cast_peak_rss_kib_per_cast {statistics.median(per_cast) / 1024:.1f} target<=64")


if __name__ == "__main__":
    main()
