"""What watching costs: 1,000 busy casts, with and without an operator snapshotting them.

    python bench/snapshot.py [--quick] [--interval SECONDS] [--window SECONDS]

1,000 concurrent casts of the 10-socket text loadout of ``bench/casts.py`` across 10 sessions
(tmpfs; a scripted agent answering each turn after 5 s, so every cast is in flight at once and
the runtime stays CPU-bound — the worst case for a watcher, whose CPU is taken from the casts')
run while time is cut into short **windows**, alternately *unwatched* and *watched*. In a
watched window a thread takes the whole tree's snapshot as ``ops.actors`` and the web console
take it (``system.snapshot_data()``: every actor's activity, mailbox, last failure, labels —
some 2,000 actors here) and serialises it to JSON, every ``--interval`` seconds (default 0.25:
four times as often as ``castor inspect --follow`` and the console push, so the figure is an
upper bound). A window's figure is the casts' transitions in it (socket visits started,
counted by the runtime's own meters).

Why windows in one run instead of two runs: on a shared 2-CPU host, two runs of the same
workload differ by up to ±50 % (other tenants); adjacent one-second windows of one run differ
by a few percent. Windows are taken in pairs in alternating order (off/on, on/off, ...) so the
population's slow drift (casts ending) cancels; pairs are counted only while at least 80 % of
the casts are in flight. Figure: the median over pairs of rate(unwatched) / rate(watched).

Ends with ``RESULT snapshot_slowdown_ratio <value> target<=1.05`` (the casts' transitions slow
by at most 5 % while watched) and ``RESULT snapshot_ms_per_1000_actors <value>`` (one
snapshot's wall time while the casts run, per 1,000 actors).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import casts as castbench  # noqa: E402  (bench/casts.py: the loadout, sessions and waits)

from castor.actors.materia.api import materia_call  # noqa: E402
from castor.actors.materia.component import materia_component  # noqa: E402
from castor.logs import configure_logging  # noqa: E402
from castor.runtime import Runtime, RuntimeSettings  # noqa: E402

#: The scripted agent's latency per turn (see the module docstring).
DELAY_MS = 5000


def visits(rt: Runtime) -> int:
    counters, _ = rt.system.registry.meters.collect()
    return counters.get(("starts", "SocketActor"), 0)


def in_flight(rt: Runtime) -> int:
    return sum(1 for h in rt.system.registry.handles("/root/session") if h.kind == "CastActor" and h.alive)


def measure(base: Path, casts: int, sessions: int, interval: float, window: float) -> dict:
    project = castbench.make_project(base, f"s-{time.monotonic_ns()}")
    per_session = casts // sessions
    rt = Runtime(RuntimeSettings(max_casts_per_session=per_session), components=[materia_component()])
    watching = threading.Event()
    stop = threading.Event()
    costs: list[tuple[float, int]] = []

    def watch() -> None:
        while not stop.is_set():
            if not watching.wait(0.05):
                continue
            t0 = time.perf_counter()
            tree = rt.system.snapshot_data()
            json.dumps(tree)
            costs.append((time.perf_counter() - t0, len(tree["actors"])))
            stop.wait(interval)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        castbench.open_sessions(rt, project, sessions, {"text": "ok", "delay_ms": DELAY_MS})
        materia_call(rt, "bench-0", "list")
        started = []
        for n in range(per_session):
            for s in range(sessions):
                sid = f"bench-{s}"
                started.append((sid, materia_call(rt, sid, "start", {"request": f"c{n}"}, timeout=300)["cast_id"]))
        pairs: list[float] = []
        order = 0
        while True:
            if in_flight(rt) < 0.8 * casts:
                break
            rates: dict[bool, float] = {}
            for watched in ((False, True) if order % 2 == 0 else (True, False)):
                if watched:
                    watching.set()
                else:
                    watching.clear()
                before, t0 = visits(rt), time.perf_counter()
                time.sleep(window)  # a measurement window, not synchronisation
                rates[watched] = (visits(rt) - before) / (time.perf_counter() - t0)
            watching.clear()
            order += 1
            if in_flight(rt) >= 0.8 * casts and rates[True] > 0:
                pairs.append(rates[False] / rates[True])
        stop.set()
        castbench.wait_ended(rt, started, 900)
        castbench.check_complete(rt, started)
        busy = [c for c in costs if c[1] >= casts]
        return {"ratios": pairs, "snapshots": len(costs),
                "snapshot_ms_per_1000": statistics.median([c[0] * 1e6 / c[1] for c in busy]) if busy else None,
                "actors": statistics.median([c[1] for c in busy]) if busy else None}
    finally:
        stop.set()
        rt.shutdown(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 casts")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between snapshots (default 0.25)")
    parser.add_argument("--window", type=float, default=1.0, help="seconds per window (default 1.0)")
    args = parser.parse_args()
    configure_logging("ERROR")
    casts = 300 if args.quick else 1000
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(prefix="castor-bench-snap-", dir=shm) as tmp:
        result = measure(Path(tmp), casts, 10, args.interval, args.window)
    ratios = result["ratios"]
    if not ratios:
        raise SystemExit("bench/snapshot.py: no window pair while the casts were in flight (a too slow host?)")
    print(f"{casts} casts in flight, {len(ratios)} window pairs of {args.window:.1f} s; snapshots every "
          f"{args.interval:.2f} s of ~{result['actors'] or 0:.0f} actors ({result['snapshots']} taken)")
    print(f"pair ratios unwatched/watched: min {min(ratios):.3f} median {statistics.median(ratios):.3f} "
          f"max {max(ratios):.3f}")
    print(f"RESULT snapshot_slowdown_ratio {statistics.median(ratios):.3f} target<=1.05")
    if result["snapshot_ms_per_1000"] is not None:
        print(f"RESULT snapshot_ms_per_1000_actors {result['snapshot_ms_per_1000']:.1f} target>=0")


if __name__ == "__main__":
    main()
