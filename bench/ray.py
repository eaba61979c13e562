"""The Ray backend's costs, in one run (inside a private network namespace it makes itself):

    python bench/ray.py [--quick]

(a) **Cost per cast transition on a Ray host** against the in-process runtime. The same casts —
    one zero-latency scripted agent turn, then 20 ``noop`` utility sockets (inline transitions,
    each persisted like any other) — run one at a time through a runtime whose materia component
    is the Ray backend (1 node, 1 host; the agent stays in the serving process, so its turn
    crosses the relay both ways) and through a plain in-process runtime, alternating cast by
    cast. A cast's time runs from its ``start`` call until the harness is told it is complete
    (the ``ui.notify`` that ends every cast, relayed on the Ray side). Ratio = median Ray cast /
    median local cast (same transitions): the hop to a host is paid per dispatch and per harness
    call, not per transition. Target <= 1.5.
(b) **Throughput of CPU-bound utility work**: 16 casts (8 with ``--quick``) whose one utility command burns ~0.5 s of
    CPU (``resources.cpus: 1``), all started at once, on a 2-node cluster with 1 CPU per node
    against a 1-node cluster with 1 CPU; commands per second, ratio 2-node / 1-node. Target >= 1.7
    on this 2-core machine.
(c) **Recovery**: 2 nodes, 2 hosts, 4 sessions with a cast each whose agent turns take 300 ms; a
    host holding casts is SIGKILLed; the time from the kill until every cast it held runs again on
    another host (re-opened and recast from its persisted state). Median of the kills (3, or 2
    with ``--quick``). Reported; no target.

Everything runs on this machine's loopback inside ``unshare -n`` (root): Ray binds to the
machine's interface otherwise. Ends with ``RESULT <name> <value> target<op><target>`` lines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# This file is named like the package it measures: its own directory must not shadow ``ray``.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO))

BURN = ("import sys, time, json\nsys.stdin.readline()\nend = time.process_time() + 0.5\n"
        "while time.process_time() < end: pass\nprint(json.dumps({'ok': True}))\n")


def _reexec_in_netns() -> None:
    if os.environ.get("CASTOR_BENCH_NETNS") == "1":
        return
    env = {**os.environ, "CASTOR_BENCH_NETNS": "1", "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    argv = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", sys.executable, *sys.argv]
    sys.exit(subprocess.call(argv, env=env))


def _project(root: Path, name: str, sockets: dict[str, Any], answers: list[Any]) -> Path:
    proj = root / name
    (proj / ".pi").mkdir(parents=True, exist_ok=True)
    (proj / ".pi" / "pi-materia.json").write_text(json.dumps({
        "activeLoadout": "bench", "loadouts": {"bench": {"entry": "Socket-1", "sockets": sockets}}}))
    (proj / "answers.json").write_text(json.dumps({"*": answers}))
    return proj


def _chain_sockets(noops: int) -> dict[str, Any]:
    sockets: dict[str, Any] = {"Socket-1": {"type": "agent", "materia": "greeter",
                                            "edges": [{"when": "always", "to": "Socket-2"}]}}
    for n in range(2, noops + 2):
        nxt = [{"when": "always", "to": f"Socket-{n + 1}"}] if n < noops + 1 else []
        sockets[f"Socket-{n}"] = {"type": "utility", "utility": "noop", "edges": nxt}
    return sockets


class _Session:
    """One session of ``runtime`` with a scripted agent and a UI that signals each cast's end."""

    def __init__(self, runtime: Any, sid: str, proj: Path) -> None:
        from castor.adapters.agents.scripted import ScriptedAgent
        from castor.adapters.session_jsonl import JsonlSessionLog
        from castor.adapters.stderr_ui import StderrUi
        from castor.ports.host_context import NoHostContext
        from castor.runtime import HarnessLink, SessionInfo

        self.runtime, self.sid = runtime, sid
        self.ended: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        runtime.open_session(SessionInfo(session_id=sid, cwd=str(proj), trusted=True),
                             HarnessLink(agent=ScriptedAgent(str(proj / "answers.json")),
                                         session_log=JsonlSessionLog(proj / "session.jsonl"),
                                         ui=StderrUi(self._line), host_context=NoHostContext()))

    def _line(self, line: str) -> None:
        if " complete" in line or " failed" in line:
            cast_id = line.split("cast ", 1)[1].split(" ", 1)[0]
            self.event_for(cast_id).set()

    def event_for(self, cast_id: str) -> threading.Event:
        with self._lock:
            return self.ended.setdefault(cast_id, threading.Event())

    def start(self) -> str:
        from castor.actors.materia.api import materia_call

        cast_id = materia_call(self.runtime, self.sid, "start", {"request": "bench"})["cast_id"]
        self.event_for(cast_id)
        return cast_id

    def run(self, timeout_s: float = 60.0) -> float:
        t0 = time.perf_counter()
        cast_id = self.start()
        if not self.event_for(cast_id).wait(timeout_s):
            raise RuntimeError(f"cast {cast_id} did not end within {timeout_s}s")
        return time.perf_counter() - t0


def _cluster(nodes: int, cpus: int) -> Any:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus, "object_store_memory": 80 << 20})
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=cpus, object_store_memory=80 << 20)
    cluster.wait_for_nodes()
    return cluster


def _ray_runtime(cluster: Any, hosts: int, casts_per_session: int = 1) -> tuple[Any, Any]:
    import ray

    from castor.runtime import Runtime, RuntimeSettings
    from castor.scaleout.ray_backend import RayBackend, RayBackendSettings, ray_materia_component

    ray.init(address=cluster.address, namespace="castor", log_to_driver=False, configure_logging=False)
    backend = RayBackend(RayBackendSettings(address=cluster.address, hosts=hosts),
                         host_runtime={"max_casts_per_session": casts_per_session})
    runtime = Runtime(RuntimeSettings(max_casts_per_session=casts_per_session),
                      components=[ray_materia_component(backend)], scaleout=backend)
    return runtime, backend


def _close(runtime: Any, backend: Any, cluster: Any) -> None:
    import ray

    runtime.shutdown(30.0)
    backend.shutdown()
    ray.shutdown()
    cluster.shutdown()


def bench_transition(root: Path, casts: int) -> dict[str, float]:
    from castor.composition import materia_component
    from castor.runtime import Runtime, RuntimeSettings

    noops = 20
    cluster = _cluster(1, 1)
    ray_rt, backend = _ray_runtime(cluster, hosts=1)
    local_rt = Runtime(RuntimeSettings(), components=[materia_component()])
    try:
        answers = [{"text": "ok"}] * (casts + 2)
        remote = _Session(ray_rt, "r", _project(root, "ray", _chain_sockets(noops), answers))
        local = _Session(local_rt, "l", _project(root, "local", _chain_sockets(noops), answers))
        remote.run()
        local.run()  # untimed: first config loads, imports
        times_r, times_l = [], []
        for _ in range(casts):
            times_r.append(remote.run())
            times_l.append(local.run())
    finally:
        local_rt.shutdown(30.0)
        _close(ray_rt, backend, cluster)
    r, loc = statistics.median(times_r), statistics.median(times_l)
    return {"ray_ms": r * 1000, "local_ms": loc * 1000, "transitions": noops + 1, "ratio": r / loc}


def bench_utility_throughput(root: Path, casts: int) -> dict[str, float]:
    sockets = {"Socket-1": {"type": "utility", "command": [sys.executable, "-c", BURN], "parse": "json",
                            "resources": {"cpus": 1}, "timeoutMs": 120000}}
    rates = {}
    for nodes in (1, 2):
        cluster = _cluster(nodes, 1)
        runtime, backend = _ray_runtime(cluster, hosts=nodes, casts_per_session=casts)
        try:
            session = _Session(runtime, f"u{nodes}", _project(root, f"burn{nodes}", sockets, []))
            warm = [session.start() for _ in range(2 * nodes)]  # Ray's task workers started on every node
            for cast_id in warm:
                session.event_for(cast_id).wait(300)
            t0 = time.perf_counter()
            ids = [session.start() for _ in range(casts)]
            for cast_id in ids:
                if not session.event_for(cast_id).wait(300):
                    raise RuntimeError("a burn cast did not end")
            rates[nodes] = casts / (time.perf_counter() - t0)
        finally:
            _close(runtime, backend, cluster)
    return {"one_node_per_s": rates[1], "two_nodes_per_s": rates[2], "ratio": rates[2] / rates[1]}


def bench_recovery(root: Path, kills: int) -> dict[str, Any]:
    sockets = {f"Socket-{n}": {"type": "agent", "materia": "greeter",
                               "edges": [{"when": "always", "to": f"Socket-{n + 1}"}] if n < 8 else []}
               for n in range(1, 9)}
    cluster = _cluster(2, 1)
    runtime, backend = _ray_runtime(cluster, hosts=2)
    seconds = []
    try:
        answers = [{"text": "ok", "delay_ms": 300}] * 200
        sessions = [_Session(runtime, f"k{n}", _project(root, f"kill{n}", sockets, answers)) for n in range(4)]
        for _ in range(kills):
            for s in sessions:
                s.start()
            time.sleep(0.5)
            victim = next(h for h in backend.live_hosts() if h.sessions)
            before = len(backend.recoveries)
            t0 = time.monotonic()
            backend.kill_host(victim.host_id)
            deadline = t0 + 120
            while len(backend.recoveries) == before and time.monotonic() < deadline:
                time.sleep(0.01)
            if len(backend.recoveries) == before:
                raise RuntimeError("no recovery within 120 s")
            seconds.append(backend.recoveries[-1]["finished_at"] - t0)
            for s in sessions:  # let every cast end before the next kill
                for event in list(s.ended.values()):
                    event.wait(120)
    finally:
        _close(runtime, backend, cluster)
    return {"median_s": statistics.median(seconds), "all_s": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    _reexec_in_netns()
    with tempfile.TemporaryDirectory(prefix="castor-bench-ray-") as tmp:
        root = Path(tmp)
        a = bench_transition(root / "a", 8 if args.quick else 30)
        print(f"(a) cast of {a['transitions']} transitions: ray host {a['ray_ms']:.1f} ms, "
              f"in-process {a['local_ms']:.1f} ms", flush=True)
        b = bench_utility_throughput(root / "b", 8 if args.quick else 16)
        print(f"(b) CPU-bound utility commands: 1 node {b['one_node_per_s']:.2f}/s, "
              f"2 nodes {b['two_nodes_per_s']:.2f}/s", flush=True)
        c = bench_recovery(root / "c", 2 if args.quick else 3)
        print(f"(c) recovery after a host kill: {', '.join(f'{s:.2f}' for s in c['all_s'])} s", flush=True)
    print(f"RESULT ray_transition_vs_in_process_ratio {a['ratio']:.2f} target<=1.5")
    print(f"RESULT ray_utility_throughput_2_nodes_vs_1_ratio {b['ratio']:.2f} target>=1.7")
    print(f"RESULT ray_recovery_median_s {c['median_s']:.2f} target<=inf")


if __name__ == "__main__":
    main()
