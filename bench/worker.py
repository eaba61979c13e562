"""Icarus worker bridge benchmark (one run, a few minutes at most on 2 cores).

Measures, against the same child (castor's worker program loading the
reference backend, ``examples/icarus_reference/icarus``):

1. ``bridge_rt_us`` — one small call round trip through ``WorkerProcess.call``
   (request id, deadline, poll on stdout + wake pipe, id matching).
2. ``raw_rt_us`` — the same request written to a plain JSON-lines pipe and read
   back with ``readline`` (the floor: no bridge bookkeeping).
3. ``cold_start_ms`` — spawn + package import + first reply through
   ``WorkerProcess`` (what the first call of a session pays).
4. ``timeout_drain_ms`` — through a supervised ``IcarusWorkerActor``: one call
   (``hooks.sleep``) runs past its deadline with ``--queued`` calls queued
   behind it; the figure is the time from the deadline to the moment the last
   queued call was rejected (kill the tree, fail the call ``timeout``, retire,
   reject the queue ``worker_retired``). Median of ``--drain-runs`` runs, each
   on a fresh, warmed worker.

Runs are interleaved (raw, bridge, raw, bridge, ...) so machine noise hits both;
each run's value is the mean over ``--calls`` round trips; medians of the runs
are reported, and the ratio is the median of the per-pair (adjacent raw/bridge
runs) ratios, which cancels most of the load drift of a shared machine. Ends with ``RESULT <name> <value> target<=<target>`` lines.

Usage: ``python bench/worker.py [--runs 9] [--calls 1000] [--cold 7] [--queued 1000] [--drain-runs 5]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from castor.adapters.icarus.launch import WorkerLaunch, build_launch  # noqa: E402
from castor.actors.icarus_worker import WorkerCall, icarus_worker_spec  # noqa: E402
from castor.adapters.icarus.worker_process import WorkerProcess, next_request_id, worker_factory  # noqa: E402
from castor.domain.icarus.settings import IcarusSettings  # noqa: E402
from castor.logs import configure_logging  # noqa: E402
from castor.messages.errors import Timeout, WorkerRetired  # noqa: E402
from castor.supervision import ActorSystem  # noqa: E402

REFERENCE = REPO / "examples" / "icarus_reference" / "icarus"
RATIO_TARGET = 1.3
COLD_START_TARGET_MS = 250.0
DRAIN_TARGET_MS = 20.0
DRAIN_DEADLINE_S = 0.5  # how long the blocking call runs before its deadline fires


def make_launch(workdir: str) -> WorkerLaunch:
    settings = IcarusSettings(icarus_dir=str(REFERENCE), fabric_dir=f"{workdir}/fabric", python=sys.executable)
    return build_launch(settings, cwd=workdir)


def bridge_run(launch: WorkerLaunch, calls: int) -> float:
    worker = WorkerProcess(launch)
    try:
        worker.call(next_request_id(), "hooks", "identity", [0], {}, time.monotonic() + 30)  # warm: spawn + import
        started = time.perf_counter()
        for i in range(calls):
            reply = worker.call(next_request_id(), "hooks", "identity", [i], {}, time.monotonic() + 30)
            assert reply["result"] == i
        return (time.perf_counter() - started) / calls * 1e6
    finally:
        worker.kill_tree("bench done")


def raw_run(launch: WorkerLaunch, calls: int) -> float:
    proc = subprocess.Popen(list(launch.argv), cwd=launch.cwd, env=launch.env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        def one(i: int) -> None:
            line = json.dumps({"id": i, "module": "hooks", "function": "identity", "args": [i], "kwargs": {}})
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()
            reply = json.loads(proc.stdout.readline())
            assert reply["result"] == i

        one(0)  # warm: spawn + import
        started = time.perf_counter()
        for i in range(1, calls + 1):
            one(i)
        return (time.perf_counter() - started) / calls * 1e6
    finally:
        proc.kill()
        proc.wait()


def cold_start_ms(launch: WorkerLaunch) -> float:
    started = time.perf_counter()
    worker = WorkerProcess(launch)
    try:
        worker.call(next_request_id(), "hooks", "counter", [], {}, time.monotonic() + 30)
        return (time.perf_counter() - started) * 1e3
    finally:
        worker.kill_tree("bench done")


def timeout_drain_ms(launch: WorkerLaunch, queued: int) -> float:
    """Deadline of a running call -> last of ``queued`` calls behind it rejected (ms)."""
    system = ActorSystem([icarus_worker_spec("bench-worker", worker_factory(launch), next_request_id)])
    try:
        handle = system.lookup("/root/bench-worker")
        assert handle.ask(WorkerCall(module="hooks", function="identity", args=[1]), timeout=30) == 1  # warm
        deadline = time.monotonic() + DRAIN_DEADLINE_S
        blocker = handle.ask_pending(WorkerCall(module="hooks", function="sleep", kwargs={"seconds": 30},
                                                deadline=deadline), timeout=30)
        while handle.snapshot().mailbox.in_flight is None:  # the call is running in the worker
            time.sleep(0.001)
        behind = [handle.ask_pending(WorkerCall(module="hooks", function="identity", args=[i],
                                                deadline=time.monotonic() + 60), timeout=60)
                  for i in range(queued)]
        assert time.monotonic() < deadline, "queueing took longer than the deadline; raise DRAIN_DEADLINE_S"
        try:
            blocker.result()
            raise AssertionError("the blocking call did not time out")
        except Timeout:
            pass
        for pending in behind:
            try:
                pending.result()
                raise AssertionError("a queued call ran after the timeout")
            except WorkerRetired:
                pass
        return (time.monotonic() - deadline) * 1e3
    finally:
        system.shutdown(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--cold", type=int, default=7)
    parser.add_argument("--queued", type=int, default=1000)
    parser.add_argument("--drain-runs", type=int, default=5)
    args = parser.parse_args()
    configure_logging("ERROR")  # the retirements below log warnings by design

    with tempfile.TemporaryDirectory(prefix="castor-bench-worker-") as workdir:
        launch = make_launch(workdir)
        raw, bridge = [], []
        for run in range(args.runs):
            raw.append(raw_run(launch, args.calls))
            bridge.append(bridge_run(launch, args.calls))
            print(f"run {run + 1}/{args.runs}: raw {raw[-1]:.1f} us  bridge {bridge[-1]:.1f} us", flush=True)
        cold = [cold_start_ms(launch) for _ in range(args.cold)]
        drain = [timeout_drain_ms(launch, args.queued) for _ in range(args.drain_runs)]

    raw_med, bridge_med = statistics.median(raw), statistics.median(bridge)
    # Adjacent runs share the machine's load, so the per-pair ratio is the robust figure.
    ratio = statistics.median(b / r for b, r in zip(bridge, raw))
    cold_med = statistics.median(cold)
    print(f"raw JSON-lines round trip   median {raw_med:.1f} us  [{min(raw):.1f}..{max(raw):.1f}]")
    print(f"WorkerProcess.call round trip median {bridge_med:.1f} us  [{min(bridge):.1f}..{max(bridge):.1f}]")
    print(f"worker cold start (spawn+import+first reply) median {cold_med:.1f} ms  "
          f"[{min(cold):.1f}..{max(cold):.1f}]")
    print(f"bridge/raw: median of per-pair ratios {ratio:.3f}; ratio of medians {bridge_med / raw_med:.3f}")
    print(f"RESULT worker_bridge_vs_raw_ratio {ratio:.3f} target<={RATIO_TARGET}")
    drain_med = statistics.median(drain)
    print(f"timeout -> all {args.queued} queued calls rejected: median {drain_med:.2f} ms  "
          f"[{min(drain):.2f}..{max(drain):.2f}]")
    print(f"RESULT worker_cold_start_ms {cold_med:.1f} target<={COLD_START_TARGET_MS}")
    print(f"RESULT worker_timeout_drain_{args.queued}_ms {drain_med:.2f} target<={DRAIN_TARGET_MS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
