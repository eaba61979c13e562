"""What watching costs: 1,000 busy casts, with and without an operator snapshotting them.

    python bench/snapshot.py [--quick] [--interval SECONDS]

1,000 concurrent casts of the 10-socket text loadout of ``bench/casts.py`` across 10 sessions
(tmpfs, a scripted agent answering each turn after 3 s, so all of them are in flight at once
while the runtime stays CPU-bound) run to the end, once **unwatched** and once **watched**: a thread takes
the whole tree's snapshot — every actor's activity, mailbox, last failure and labels, some
2,000 actors here — as ``ops.actors`` and the console take it (``snapshot_data()``) and
serialises it to JSON, every ``--interval`` seconds (default 1.0: as often as ``castor inspect --follow`` and the
web console push). Figure: the transition rate watched / unwatched. Each run is a fresh
Python process (no run inherits another's heap); the two kinds alternate, so machine noise
hits them alike; the figure is the median of the per-pair ratios. The same run prints the
snapshot's own cost (median ms per snapshot of the whole tree, taken while the casts run).

Ends with ``RESULT snapshot_slowdown_ratio <unwatched/watched rate> target<=1.05`` (1.05: the
casts' transitions slow by at most 5 % while watched) and ``RESULT snapshot_ms_per_1000_actors``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
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


#: The scripted agent's latency per turn: long enough that every cast is in flight at once
#: (11 transitions each), short enough that the runtime stays CPU-bound (the worst case for
#: the watcher: its CPU is taken from the casts').
DELAY_MS = 3000


def run(base: Path, casts: int, sessions: int, interval: float | None) -> dict:
    """One run: ``casts`` casts to the end; watched every ``interval`` s unless None."""
    project = castbench.make_project(base, f"s-{time.monotonic_ns()}")
    per_session = casts // sessions
    rt = Runtime(RuntimeSettings(max_casts_per_session=per_session), components=[materia_component()])
    snaps: list[tuple[float, int]] = []
    stop = threading.Event()

    def watch() -> None:
        assert interval is not None
        while not stop.wait(interval):
            t0 = time.perf_counter()
            tree = rt.system.snapshot_data()  # what ops.actors and the console send
            json.dumps(tree)
            snaps.append((time.perf_counter() - t0, len(tree["actors"])))

    try:
        castbench.open_sessions(rt, project, sessions, {"text": "ok", "delay_ms": DELAY_MS})
        materia_call(rt, "bench-0", "list")
        watcher = threading.Thread(target=watch, daemon=True) if interval else None
        if watcher is not None:
            watcher.start()
        t0 = time.perf_counter()
        started = []
        for n in range(per_session):
            for s in range(sessions):
                sid = f"bench-{s}"
                started.append((sid, materia_call(rt, sid, "start", {"request": f"c{n}"}, timeout=300)["cast_id"]))
        castbench.wait_ended(rt, started, 600)
        elapsed = time.perf_counter() - t0
        stop.set()
        if watcher is not None:
            watcher.join(10)
        castbench.check_complete(rt, started)
        rate = casts * (castbench.SOCKETS + 1) / elapsed
        busy = [s for s in snaps if s[1] >= casts]  # taken while (nearly) every cast was in flight
        return {"rate": rate, "snapshots": len(snaps),
                "snapshot_s": statistics.median([s[0] for s in busy]) if busy else None,
                "actors": statistics.median([s[1] for s in busy]) if busy else None}
    finally:
        rt.shutdown(60)


def child(base: Path, casts: int, sessions: int, interval: float | None) -> dict:
    args = [sys.executable, __file__, "--child", str(base), str(casts), str(sessions), str(interval or 0)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=900)
    if done.returncode != 0 or not done.stdout.strip():
        raise SystemExit(f"bench/snapshot.py child failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 casts, 2 pairs")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between snapshots (default 1.0)")
    parser.add_argument("--child", nargs=4, metavar=("DIR", "CASTS", "SESSIONS", "INTERVAL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    configure_logging("ERROR")
    if args.child:
        where, casts, sessions, interval = args.child
        print(json.dumps(run(Path(where), int(casts), int(sessions), float(interval) or None)))
        return
    casts, pairs = (300, 2) if args.quick else (1000, 3)
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    ratios, costs = [], []
    with tempfile.TemporaryDirectory(prefix="castor-bench-snap-", dir=shm) as tmp:
        for pair in range(pairs):
            order = [None, args.interval] if pair % 2 == 0 else [args.interval, None]
            result = {}
            for interval in order:
                result[interval is not None] = child(Path(tmp), casts, 10, interval)
            plain, watched = result[False], result[True]
            ratios.append(plain["rate"] / watched["rate"])
            if watched["snapshot_s"] is not None:
                costs.append(watched["snapshot_s"] * 1000 / watched["actors"] * 1000)
            print(f"pair {pair + 1}: unwatched {plain['rate']:.0f} transitions/s, watched {watched['rate']:.0f} "
                  f"({watched['snapshots']} snapshots of ~{watched['actors'] or 0:.0f} actors, "
                  f"{(watched['snapshot_s'] or 0) * 1000:.1f} ms each) -> ratio {ratios[-1]:.3f}")
    print(f"RESULT snapshot_slowdown_ratio {statistics.median(ratios):.3f} target<=1.05")
    if costs:
        print(f"RESULT snapshot_ms_per_1000_actors {statistics.median(costs):.1f} target>=0")


if __name__ == "__main__":
    main()
