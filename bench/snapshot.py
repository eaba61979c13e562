"""What watching costs: 1,000 busy casts, with and without an operator snapshotting them.

    python bench/snapshot.py [--quick] [--interval SECONDS] [--window SECONDS]

1,000 concurrent casts of the 10-socket text loadout of ``bench/casts.py`` across 10 sessions
(tmpfs; scripted agents answering each turn after 3 to 7 s, so every cast is in flight at once and
the runtime stays CPU-bound — the worst case for a watcher, whose CPU is taken from the casts')
run while time is cut into short **windows**, alternately *unwatched* and *watched*. In a
watched window a thread takes the whole tree's snapshot as ``ops.actors`` and the web console
take it (``system.snapshot_data()``: every actor's activity, mailbox, last failure, labels —
some 2,000 actors here) and serialises it to JSON, every ``--interval`` seconds (default 1.0:
as often as ``castor inspect --follow`` and the console push; ``--interval 0.25`` is a stress
figure, four watchers' worth). A window's figure is the casts' transitions in it (socket visits started,
counted by the runtime's own meters).

Why windows in one run instead of two runs: on a shared 2-CPU host, two runs of the same
workload differ by up to ±50 % (other tenants); adjacent one-second windows of one run differ
by a few percent. Windows are taken in pairs in alternating order (off/on, on/off, ...) so the
population's slow drift (casts ending) cancels; pairs are counted only while at least 60 % of
the casts are in flight. Every session's agent has its own latency (0.6x to 1.4x of 5 s), so the casts' turns never
move in waves that a window could catch or miss. Figure: the median over pairs of
rate(unwatched) / rate(watched) — the median, because a shared host now and then stalls the
whole process for a second (other tenants), which empties one window of a pair whichever it
is; the pooled ratio and the spread are printed too.

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

from castor.actors.materia.api import materia_call  # noqa: E402 - after the sys.path set-up above, on purpose
from castor.adapters.agents.scripted import ScriptedAgent, parse_script  # noqa: E402 - after the sys.path set-up above, on purpose
from castor.composition import materia_component  # noqa: E402 - after the sys.path set-up above, on purpose
from castor.logs import configure_logging  # noqa: E402 - after the sys.path set-up above, on purpose
from castor.runtime import HarnessLink, Runtime, RuntimeSettings, SessionInfo  # noqa: E402 - after the sys.path set-up above, on purpose
from castor.supervision.registry import WATCH_PACE_S  # noqa: E402 - after the sys.path set-up above, on purpose

#: The scripted agent's latency per turn (see the module docstring).
DELAY_MS = 5000
#: Window pairs count while at least this share of the casts is in flight.
MIN_IN_FLIGHT = 0.6


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
            tree = rt.system.snapshot_data(pace_s=WATCH_PACE_S)
            json.dumps(tree)
            costs.append((time.perf_counter() - t0, len(tree["actors"])))
            stop.wait(interval)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        for n in range(sessions):  # a different latency per session, so the casts' turns never move in waves
            delay = int(DELAY_MS * (0.6 + 0.8 * n / max(1, sessions - 1)))
            agent = ScriptedAgent(parse_script({"*": [{"text": "ok", "delay_ms": delay}] * castbench.SOCKETS}),
                                  max_workers=4)
            rt.open_session(SessionInfo(session_id=f"bench-{n}", cwd=str(project), trusted=True),
                            HarnessLink(agent=agent, session_log=None, ui=None))
        materia_call(rt, "bench-0", "list")
        started: list[tuple[str, str]] = []
        t_start = time.perf_counter()

        def start_all(sid: str) -> None:  # one starter per session, so 1,000 starts overlap
            for n in range(per_session):
                started.append((sid, materia_call(rt, sid, "start", {"request": f"c{n}"}, timeout=300)["cast_id"]))

        starters = [threading.Thread(target=start_all, args=(f"bench-{s}",)) for s in range(sessions)]
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        start_s, peak = time.perf_counter() - t_start, in_flight(rt)
        pairs: list[float] = []
        totals = {False: [0, 0.0], True: [0, 0.0]}  # visits, seconds
        order = 0
        while True:
            if in_flight(rt) < MIN_IN_FLIGHT * casts:
                break
            rates: dict[bool, float] = {}
            for watched in ((False, True) if order % 2 == 0 else (True, False)):
                if watched:
                    watching.set()
                else:
                    watching.clear()
                before, t0 = visits(rt), time.perf_counter()
                time.sleep(window)  # a measurement window, not synchronisation
                seen, took = visits(rt) - before, time.perf_counter() - t0
                rates[watched] = seen / took
                if in_flight(rt) >= MIN_IN_FLIGHT * casts:
                    totals[watched][0] += seen
                    totals[watched][1] += took
            watching.clear()
            order += 1
            if in_flight(rt) >= MIN_IN_FLIGHT * casts and rates[True] > 0:
                pairs.append(rates[False] / rates[True])
        stop.set()
        castbench.wait_ended(rt, started, 900)
        castbench.check_complete(rt, started)
        busy = [c for c in costs if c[1] >= casts]
        plain, watched_total = totals[False], totals[True]
        overall = (plain[0] / plain[1]) / (watched_total[0] / watched_total[1]) \
            if plain[1] and watched_total[0] else None
        return {"ratios": pairs, "overall": overall, "snapshots": len(costs), "start_s": start_s, "peak": peak,
                "snapshot_ms_per_1000": statistics.median([c[0] * 1e6 / c[1] for c in busy]) if busy else None,
                "actors": statistics.median([c[1] for c in busy]) if busy else None}
    finally:
        stop.set()
        rt.shutdown(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 casts")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between snapshots (default 1.0)")
    parser.add_argument("--window", type=float, default=1.0, help="seconds per window (default 1.0)")
    args = parser.parse_args()
    configure_logging("ERROR")
    casts = 300 if args.quick else 1000
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(prefix="castor-bench-snap-", dir=shm) as tmp:
        result = measure(Path(tmp), casts, 10, args.interval, args.window)
    ratios = result["ratios"]
    print(f"started {casts} casts in {result['start_s']:.1f} s; {result['peak']} in flight then")
    if not ratios:
        raise SystemExit("bench/snapshot.py: no window pair while the casts were in flight (a too slow host?)")
    print(f"{casts} casts in flight, {len(ratios)} window pairs of {args.window:.1f} s; snapshots every "
          f"{args.interval:.2f} s of ~{result['actors'] or 0:.0f} actors ({result['snapshots']} taken)")
    print(f"pair ratios unwatched/watched: min {min(ratios):.3f} median {statistics.median(ratios):.3f} "
          f"max {max(ratios):.3f}")
    if result["overall"] is not None:
        print(f"all watched windows against all unwatched ones: {result['overall']:.3f}")
    print(f"RESULT snapshot_slowdown_ratio {statistics.median(ratios):.3f} target<=1.05")
    if result["snapshot_ms_per_1000"] is not None:
        print(f"RESULT snapshot_ms_per_1000_actors {result['snapshot_ms_per_1000']:.1f} target>=0")


if __name__ == "__main__":
    main()
