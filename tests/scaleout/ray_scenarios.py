"""Ray backend scenarios, run by tests/scaleout/test_ray_backend.py INSIDE a private network namespace.

``python ray_scenarios.py SCENARIO WORKDIR`` starts a multi-node ``ray.cluster_utils.Cluster`` on
this machine (every node binds 127.0.0.1: the namespace has nothing else), a castor runtime whose
materia component is the Ray backend (the serving process's side), and standalone harness links
(the scripted agent, here in the serving process: turns reach it through the relay). It prints one
``RESULT {json}`` line that the test asserts on.

Scenarios: ``complete`` (casts with utility commands complete across nodes), ``kill_host`` (a host
SIGKILLed mid-cast), ``remove_node`` (a whole node removed mid-cast), ``two_hosts`` (two hosts
try to advance one cast), ``stop_raylet`` (the raylet of a host's node stopped mid-cast, SIGSTOP:
the cluster takes the node for dead, as after a network partition, while the host's own process
lives on; the host must end itself, and its casts complete elsewhere), ``lease_to_stopped_node``
(a command whose lease request went to a node whose raylet is stopped comes back as lost work;
on the same cluster, a command asking for more CPUs than any node has, and commands whose Ray
worker, node's raylet or driver is killed under them), ``cut_off_stop_raylet`` (two casts'
commands run on a node whose raylet is then stopped, one cast on a host of a live node, one on a
host of that node: no command may run twice at once, see :func:`cut_off_node`), ``grant_keys``
(what lost hosts leave in the cluster's key-value store), ``killed_serving_process`` (what a
serving process killed outright leaves there, once the next one has started).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

SLOW_COMMAND = (
    "import os, sys, json, time\n"
    "sys.stdin.readline()\n"
    "log = os.environ['VISIT_LOG']\n"
    "with open(log, 'a') as f: "
    "f.write(os.environ['CASTOR_VISIT_ID'] + ' ' + os.environ.get('CASTOR_NODE_ID', '?') + '\\n')\n"
    "time.sleep(float(os.environ.get('SLOW_S', '0')))\n"
    "print(json.dumps({'visit': os.environ['CASTOR_VISIT_ID'], 'node': os.environ.get('CASTOR_NODE_ID', '?')}))\n"
)


def project(root: Path, name: str, visit_log: Path, command: str = SLOW_COMMAND) -> Path:
    proj = root / name
    (proj / ".pi").mkdir(parents=True)
    config = {
        "activeLoadout": "dist",
        "loadouts": {"dist": {"entry": "Socket-1", "sockets": {
            "Socket-1": {"type": "agent", "materia": "greeter", "edges": [{"when": "always", "to": "Socket-2"}]},
            "Socket-2": {"type": "utility", "command": [sys.executable, "-c", command], "parse": "json",
                         "resources": {"cpus": 1}, "timeoutMs": 60000, "assign": {"built": "$"},
                         "edges": [{"when": "always", "to": "Socket-3"}]},
            "Socket-3": {"type": "agent", "materia": "summarizer"}}}},
    }
    (proj / ".pi" / "pi-materia.json").write_text(json.dumps(config))
    (proj / "answers.json").write_text(json.dumps({"*": [{"text": "step done", "delay_ms": 200}] * 20}))
    return proj


def open_session(runtime: Any, sid: str, proj: Path) -> None:
    from castor.adapters.agents.scripted import ScriptedAgent
    from castor.adapters.session_jsonl import JsonlSessionLog
    from castor.adapters.stderr_ui import StderrUi
    from castor.ports.host_context import NoHostContext
    from castor.runtime import HarnessLink, SessionInfo

    runtime.open_session(SessionInfo(session_id=sid, cwd=str(proj), trusted=True),
                         HarnessLink(agent=ScriptedAgent(str(proj / "answers.json")),
                                     session_log=JsonlSessionLog(proj / "session.jsonl"),
                                     ui=StderrUi(lambda _line: None), host_context=NoHostContext()))


def wait_all(runtime: Any, started: list[tuple[str, str]], timeout_s: float) -> dict[str, str]:
    from castor.actors.materia.api import materia_call
    from castor.messages.errors import CastorError

    deadline = time.monotonic() + timeout_s
    status: dict[str, str] = {}
    while time.monotonic() < deadline:
        for sid, cast_id in started:
            try:
                status[cast_id] = materia_call(runtime, sid, "status", {"cast_id": cast_id})["status"]
            except CastorError as exc:
                status[cast_id] = f"error:{exc.code}"
        if all(v in ("complete", "failed", "aborted") for v in status.values()):
            break
        time.sleep(0.2)
    return status


def lease_to_stopped_node(workdir: Path) -> dict[str, Any]:
    """A command submitted while the head's CPU is taken goes to the worker node, whose raylet is
    stopped: Ray's lease request there is never answered (ray-project/ray#63405). The command must
    come back as lost work once the cluster declares the node dead, not wait for ever."""
    import psutil
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from castor.adapters.materia.process_runner import UtilityCommand
    from castor.scaleout.utility_tasks import RayUtilityRunner

    health = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3, "health_check_timeout_ms": 1000}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 80 << 20,
                                                            "_system_config": health})
    worker = cluster.add_node(num_cpus=1, object_store_memory=80 << 20)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="castor", log_to_driver=False, configure_logging=False)
    result: dict[str, Any] = {"scenario": "lease_to_stopped_node"}
    try:
        head_id = ray.get_runtime_context().get_node_id()

        @ray.remote(num_cpus=1)
        def hold(seconds: float) -> str:
            time.sleep(seconds)
            return "held"

        blocker = hold.options(scheduling_strategy=NodeAffinitySchedulingStrategy(head_id, soft=False)).remote(90.0)
        deadline = time.monotonic() + 30
        while ray.available_resources().get("CPU", 0) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)  # the head's CPU taken: the only free one is the worker's
        psutil.Process(worker.all_processes["raylet"][0].process.pid).suspend()
        marker = workdir / "ran"
        cmd = UtilityCommand(argv=[sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"], cwd=workdir,
                             timeout_ms=60000, max_output_bytes=4096, env=dict(os.environ))
        started = time.monotonic()
        running = RayUtilityRunner().spawn(cmd, {"cpus": 1})
        outcome = running.wait()
        result.update(seconds=round(time.monotonic() - started, 1), killed=outcome.killed, stderr=outcome.stderr,
                      ran=marker.exists(), started_on=running.started_on)
        ray.cancel(blocker, force=True)
        # The command dispatched again (the cast re-dispatches lost work) must run on the live node.
        again = workdir / "again"
        cmd2 = cmd.model_copy(update={"argv": [sys.executable, "-c", f"open({str(again)!r}, 'w').close()"]})
        started = time.monotonic()
        second = RayUtilityRunner().spawn(cmd2, {"cpus": 1})
        import threading

        done: list[Any] = []
        waiter = threading.Thread(target=lambda: done.append(second.wait()), daemon=True)
        waiter.start()
        waiter.join(40)
        result.update(again_seconds=round(time.monotonic() - started, 1), again_ran=again.exists(),
                      again_exit=done[0].exit_code if done else "no answer in 40 s",
                      again_stderr=done[0].stderr if done else None)
        # A command that asks for more CPUs than any node of the cluster has: Ray queues it as
        # infeasible for ever (the cast waited, silent, until killed); it must be refused at once.
        never = workdir / "never"
        cmd3 = cmd.model_copy(update={"argv": [sys.executable, "-c", f"open({str(never)!r}, 'w').close()"]})
        started = time.monotonic()
        refused: list[Any] = []
        waiter = threading.Thread(target=lambda: refused.append(_spawn_outcome(cmd3, {"cpus": 64})), daemon=True)
        waiter.start()
        waiter.join(20)
        result.update(infeasible=refused[0] if refused else "no answer in 20 s",
                      infeasible_seconds=round(time.monotonic() - started, 1), infeasible_ran=never.exists())
        result.update(_worker_killed_under_a_command(workdir, cmd))
        result.update(_raylet_killed_under_a_command(cluster, workdir, cmd, hold, head_id))
        result.update(_driver_killed_under_a_command(cluster, workdir))
        # Printed here, before ray.shutdown: a command still waiting then makes Ray end the process.
        print("RESULT " + json.dumps(result), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    return result


def _tree_left(pids: list[int], within_s: float) -> list[int]:
    """Which of ``pids`` still live ``within_s`` after now (each killed then: nothing is left behind)."""
    import psutil

    deadline = time.monotonic() + within_s
    left = pids
    while left and time.monotonic() < deadline:
        left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.05)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def _start_tree(workdir: Path, cmd: Any, name: str) -> tuple[Any, list[int]]:
    """A command (its shell, and a child that left its process group) started as a cluster task."""
    from castor.scaleout.utility_tasks import RayUtilityRunner

    tree = workdir / name
    script = f"setsid sleep 300 & echo $$ $! > {tree}.tmp && mv {tree}.tmp {tree}; sleep 300"
    env = {**os.environ, "CASTOR_VISIT_ID": f"scenario-{name}-1", "CASTOR_RUN_DIR": str(workdir)}
    running = RayUtilityRunner().spawn(cmd.model_copy(update={"argv": ["sh", "-c", script], "env": env}),
                                       {"cpus": 1})
    deadline = time.monotonic() + 30
    while not tree.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not tree.exists():
        running.kill()
        return running, []
    return running, [int(p) for p in tree.read_text().split()]


def _raylet_killed_under_a_command(cluster: Any, workdir: Path, cmd: Any, hold: Any, head_id: str) -> dict[str, Any]:
    """A node's raylet killed (``kill -9``) while a command runs there: the Ray worker running it
    lives on and notices nothing, so the command ran on to its end while the cast ran it again
    elsewhere. It must end with its raylet."""
    import psutil
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = cluster.add_node(num_cpus=1, object_store_memory=80 << 20)
    deadline = time.monotonic() + 60  # (not cluster.wait_for_nodes: the stopped node never answers it)
    while not any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    blocker = hold.options(scheduling_strategy=NodeAffinitySchedulingStrategy(head_id, soft=False)).remote(90.0)
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) > 1 and time.monotonic() < deadline:
        time.sleep(0.05)  # the head's CPU taken: the command goes to the new node
    running, pids = _start_tree(workdir, cmd, "raylet-kill")
    if not pids:
        return {"raylet_kill": "the command did not start in 30 s"}
    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    on_node = raylet.pid in [p.pid for p in psutil.Process(pids[0]).parents()]
    raylet.kill()
    started = time.monotonic()
    left = _tree_left(pids, 10.0)
    outcome = running.wait()
    ray.cancel(blocker, force=True)
    return {"raylet_kill_on_node": on_node, "raylet_kill_tree_left": len(left), "raylet_kill_tree": len(pids),
            "raylet_kill_lost": outcome.killed, "raylet_kill_seconds": round(time.monotonic() - started, 1)}


_DRIVER = """
import json, sys, time
from pathlib import Path
import ray
sys.path.insert(0, sys.argv[1])
import ray_scenarios
from castor.adapters.materia.process_runner import UtilityCommand
ray.init(address=sys.argv[2], namespace="castor", log_to_driver=False, configure_logging=False)
workdir = Path(sys.argv[3])
cmd = UtilityCommand(argv=["true"], cwd=workdir, timeout_ms=60000, max_output_bytes=4096)
running, pids = ray_scenarios._start_tree(workdir, cmd, "driver-kill")
print("PIDS " + json.dumps(pids), flush=True)
time.sleep(600)
"""


def _driver_killed_under_a_command(cluster: Any, workdir: Path) -> dict[str, Any]:
    """The process that started a command killed, as the serving process (``castor serve``,
    ``castor cast``) owns every host and so every command: Ray ends the task's worker and kills the
    worker's own children with it, but not theirs, so a command's grandchild lived on, reparented
    to init (``castor cast`` killed on a ``ray start`` cluster left ``sleep`` running)."""
    import subprocess

    driver = subprocess.Popen([sys.executable, "-c", _DRIVER, str(Path(__file__).parent), cluster.address,
                               str(workdir)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        pids = []
        for line in driver.stdout or []:  # until it says, or ends
            if line.startswith("PIDS "):
                pids = json.loads(line[len("PIDS "):])
                break
    finally:
        driver.kill()
        driver.wait()
    if not pids:
        return {"driver_kill": "the command did not start"}
    # The tree ends once Ray has ended the dead driver's workers (the guard then kills the rest at
    # once): Ray learns of the driver's death from the cluster's bookkeeping, which on a loaded
    # machine took more than 10 s once (a CI-like run beside other work); 30 s, and the time is kept.
    started = time.monotonic()
    left = _tree_left(pids, 30.0)
    return {"driver_kill_tree": len(pids), "driver_kill_tree_left": len(left),
            "driver_kill_seconds": round(time.monotonic() - started, 1)}


def _worker_killed_under_a_command(workdir: Path, cmd: Any) -> dict[str, Any]:
    """The Ray worker running a command killed (``kill -9``, as the OOM killer does) while the
    command runs, with a child that left the command's process group (``setsid``): the task is
    lost work, and the command's whole tree must end with it (the cast runs it again elsewhere)."""
    import psutil

    running, pids = _start_tree(workdir, cmd, "worker-kill")
    if not pids:
        return {"worker_kill": "the command did not start in 30 s"}
    os.kill(psutil.Process(pids[0]).parent().pid, signal.SIGKILL)
    outcome = running.wait()
    left = _tree_left(pids, 10.0)
    return {"worker_kill_lost": outcome.killed and outcome.stderr.startswith("lost on the cluster"),
            "worker_kill_tree_left": len(left), "worker_kill_tree": len(pids)}


def _spawn_outcome(cmd: Any, resources: dict[str, float]) -> str:
    """How a command spawned on the cluster ends: ``spawn_error: MESSAGE`` or ``exit N``."""
    from castor.adapters.materia.process_runner import UtilitySpawnError
    from castor.scaleout.utility_tasks import RayUtilityRunner

    try:
        return f"exit {RayUtilityRunner().spawn(cmd, resources).wait().exit_code}"
    except UtilitySpawnError as exc:
        return f"spawn_error: {exc.message}"


#: A utility command that stamps ``stamps.log`` in its project (its working directory): ``start PID
#: TIME VISIT NODE alive=[PIDS]`` (the earlier copies' processes still alive as it starts: on this
#: one machine it can look), then ``tick PID TIME`` every 0.1 s and ``end PID TIME``. The first copy
#: of a project runs 60 s (long enough to be cut off mid-run), a later one ``LATER_S`` (longer than
#: two leases: a healthy node renews a command's lease, and such a command completes).
STAMP_COMMAND = (
    "import os, sys, json, time\n"
    "sys.stdin.readline()\n"
    "log, me = 'stamps.log', os.getpid()\n"
    "def live(pid):\n"
    "    try:\n"
    "        with open(f'/proc/{pid}/stat') as f: return f.read().rsplit(') ', 1)[1][0] not in 'ZX'\n"
    "    except OSError:\n"
    "        return False\n"
    "earlier = [int(l.split()[1]) for l in open(log).read().splitlines() if l.startswith('start ')] "
    "if os.path.exists(log) else []\n"
    "alive = ','.join(str(p) for p in earlier if live(p))\n"
    "def stamp(text):\n"
    "    with open(log, 'a') as f: f.write(text + '\\n')\n"
    "stamp(f\"start {me} {time.time()} {os.environ['CASTOR_VISIT_ID']} {os.environ.get('CASTOR_NODE_ID', '?')} "
    "alive=[{alive}]\")\n"
    "end = time.time() + (float(os.environ['LATER_S']) if earlier else 60.0)\n"
    "while time.time() < end:\n"
    "    stamp(f'tick {me} {time.time()}')\n"
    "    time.sleep(0.1)\n"
    "stamp(f'end {me} {time.time()}')\n"
    "print(json.dumps({'pid': me}))\n"
)


def stamped_copies(log: Path) -> list[dict[str, Any]]:
    """The copies of one project's command, from its ``stamps.log``, in the order they started."""
    copies: dict[int, dict[str, Any]] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        parts = line.split()
        if len(parts) < 3:
            continue  # a line cut short by a kill
        kind, pid, at = parts[0], int(parts[1]), float(parts[2])
        copy = copies.setdefault(pid, {"pid": pid, "start": at, "last": at, "ended": False})
        if kind == "start" and len(parts) >= 6:
            copy.update(start=at, visit=parts[3], node=parts[4], alive_at_start=parts[5])
        copy["last"] = max(copy["last"], at)
        copy["ended"] = copy["ended"] or kind == "end"
    return sorted(copies.values(), key=lambda c: c["start"])


def _hold(seconds: float) -> str:
    time.sleep(seconds)
    return "held"


def cut_off_node(workdir: Path, how: str) -> dict[str, Any]:
    """Two casts whose utility commands run on the worker node when it is cut off from the cluster
    (``how``: ``stop_raylet``, its raylet SIGSTOPped: the cluster declares the node dead while the
    node's processes run on and still reach the cluster's control plane; ``link_down``, a real
    partition: the node runs in a network namespace of its own, joined to the head's by a veth
    pair, and the link is taken down, so nothing on either side reaches the other). One cast
    lives on the head node's host (healthy: its command's task fails and the cast runs the
    command again), one on the worker node's host (cut off with it:
    the serving process recovers the cast on the head's host). Every command stamps its project's
    ``stamps.log`` (:data:`STAMP_COMMAND`): no two copies of one command may run at once, and the
    casts must complete."""
    import psutil
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from castor.actors.materia.api import materia_call
    from castor.runtime import Runtime, RuntimeSettings
    from castor.scaleout.ray_backend import RayBackend, RayBackendSettings, ray_materia_component

    # ``…_then_abort``: right after the cut, the cast on the head's host is aborted and recast at
    # once; its command, cut off with the node, runs on there until its lease lapses.
    then_abort = how.endswith("_then_abort")
    how = how.removesuffix("_then_abort")
    health = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3, "health_check_timeout_ms": 1000}
    os.environ["LATER_S"] = str(2.5 * CUT_OFF_LEASE_S)  # (the cluster's processes inherit it)
    head: dict[str, Any] = {"num_cpus": 2, "object_store_memory": 80 << 20, "_system_config": health}
    behind = _NodeBehindLink() if how == "link_down" else None
    if behind is not None:
        head["node_ip_address"] = behind.head_ip
    cluster = Cluster(initialize_head=True, head_node_args=head)
    result: dict[str, Any] = {"scenario": f"cut_off_{how}" + ("_then_abort" if then_abort else ""),
                              "lease_s": CUT_OFF_LEASE_S}
    runtime = backend = None
    try:
        ray.init(address=cluster.address, namespace="castor", log_to_driver=False, configure_logging=False)
        if behind is not None:
            worker_id, stop_raylet = behind.join(cluster.address, num_cpus=2), None
        else:
            worker = cluster.add_node(num_cpus=2, object_store_memory=80 << 20)
            cluster.wait_for_nodes()
            worker_id, stop_raylet = worker.node_id, psutil.Process(worker.all_processes["raylet"][0].process.pid)
        head_id = ray.get_runtime_context().get_node_id()
        blocker = ray.remote(num_cpus=2)(_hold).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(head_id, soft=False)).remote(300.0)
        deadline = time.monotonic() + 30
        while ray.available_resources().get("CPU", 0) > 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # the head's CPUs taken: the first copies run on the worker node
        backend = RayBackend(RayBackendSettings(address=cluster.address, hosts=2, fence_after_s=8.0,
                                                command_lease_s=CUT_OFF_LEASE_S))
        runtime = Runtime(RuntimeSettings(max_casts_per_session=2), components=[ray_materia_component(backend)],
                          scaleout=backend)
        started: list[tuple[str, str]] = []
        projects: dict[str, Path] = {}
        for n in range(2):
            sid = f"s{n}"
            projects[sid] = project(workdir, f"p{n}", workdir / "visits.log", STAMP_COMMAND)
            open_session(runtime, sid, projects[sid])
            started.append((sid, materia_call(runtime, sid, "start", {"request": f"request {n}"})["cast_id"]))
        result["session_hosts"] = {sid: "worker" if backend.host_of(sid, 10).node_id == worker_id else "head"
                                   for sid, _ in started}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(stamped_copies(p / "stamps.log") for p in projects.values()):
            time.sleep(0.05)
        result["first_copies_on"] = {sid: ["worker" if c.get("node") == worker_id else c.get("node")
                                           for c in stamped_copies(p / "stamps.log")] for sid, p in projects.items()}
        result["cut_at"] = time.time()
        if behind is not None:
            behind.cut()
        elif stop_raylet is not None:
            stop_raylet.suspend()
        ray.cancel(blocker, force=True)  # the head's CPUs free: the commands run again there
        if then_abort:
            sid, cast_id = next((sid, cid) for sid, cid in started if result["session_hosts"][sid] == "head")
            materia_call(runtime, sid, "abort", {"cast_id": cast_id})
            result["recast_at_once"] = materia_call(runtime, sid, "recast", {"cast_id": cast_id})["status"]
            result["aborted"] = sid
        status = wait_all(runtime, started, 150.0)
        result["status"] = status
        result["copies"] = {sid: stamped_copies(p / "stamps.log") for sid, p in projects.items()}
        result["overlaps"] = [
            f"{sid}: {a['pid']} ran until {a['last']:.2f}, {b['pid']} started {b['start']:.2f} "
            f"(alive then: {b.get('alive_at_start')})"
            for sid, copies in result["copies"].items() for a, b in zip(copies, copies[1:], strict=False)
            if b["start"] <= a["last"] or b.get("alive_at_start") != "alive=[]"]
        result["recast_because"] = {sid: [json.loads(line)["data"].get("previousFailure")
                                          for events in (projects[sid] / ".pi" / "pi-materia").glob("*/events.jsonl")
                                          for line in events.read_text().splitlines()
                                          if json.loads(line)["type"] == "cast_recast"] for sid, _ in started}
        result["recoveries"] = backend.recoveries
    finally:
        if runtime is not None:
            runtime.shutdown(30.0)
        if backend is not None:
            backend.shutdown()
        ray.shutdown()
        if behind is not None:
            behind.stop()
        cluster.shutdown()
    print("RESULT " + json.dumps(result), flush=True)
    return result


def _resume_and_shut_down(stopped: Any, runtime: Any, backend: Any, cluster: Any) -> None:
    """A scenario's cleanup, whatever happened: what it stopped (a process, or a one-way cut) runs
    again if it is still there, then its runtime, its backend (which ends its hosts), this
    driver's Ray and the cluster are shut down, in that order. ``None`` is what was never made."""
    import psutil
    import ray

    if stopped is not None:
        try:
            stopped.resume()
        except psutil.Error:
            pass
    if runtime is not None:
        runtime.shutdown(30.0)
    if backend is not None:
        backend.shutdown()
    ray.shutdown()
    cluster.shutdown()


CUT_OFF_LEASE_S = 5.0


def stopped_host(workdir: Path, how: str) -> dict[str, Any]:
    """A cast whose host is stopped mid-command while the command runs on another node (the host's
    node has no CPU, so every command runs on the head's). ``how``: ``host``, the host's process
    SIGSTOPped (a frozen VM, a pause: nothing tells the cluster); ``raylet``, its node's raylet
    SIGSTOPped (the host cut off: the cluster declares its node dead while the host runs on);
    ``unreachable`` and ``unanswering``, an asymmetric partition (:class:`_OneWayCut`): nothing
    reaches the host's own ports while it reaches every other process (``unreachable``), or what
    it sends from them -- its answers -- is lost while calls reach it and run (``unanswering``).
    The serving process must take the host for lost and recast the cast on another host, and the
    given-up command -- still running on a healthy node -- must never run beside the recast's; once
    the cast is recast (or after ``STOPPED_FOR_S``), the stopped process is SIGCONTed: whatever the
    old host then does must not run the command again. Every command stamps ``stamps.log``."""
    import psutil
    import ray
    from ray.cluster_utils import Cluster

    from castor.actors.materia.api import materia_call
    from castor.runtime import Runtime, RuntimeSettings
    from castor.scaleout.ray_backend import RayBackend, RayBackendSettings, ray_materia_component

    health = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3, "health_check_timeout_ms": 1000}
    os.environ["LATER_S"] = str(2.5 * CUT_OFF_LEASE_S)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 80 << 20,
                                                            "_system_config": health})
    result: dict[str, Any] = {"scenario": f"stopped_{how}", "lease_s": CUT_OFF_LEASE_S}
    runtime = backend = None
    stopped: Any = None
    try:
        worker = cluster.add_node(num_cpus=0, object_store_memory=80 << 20)  # hosts only: commands go to the head
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace="castor", log_to_driver=False, configure_logging=False)
        # the host's own silence fence (it ends itself when nobody drains it) comes after the window
        # below: what bounds it is the serving process taking it for lost after 3 s of silence
        backend = RayBackend(RayBackendSettings(address=cluster.address, hosts=2, fence_after_s=60.0,
                                                command_lease_s=CUT_OFF_LEASE_S, lost_after_silence_s=3.0))
        runtime = Runtime(RuntimeSettings(max_casts_per_session=2), components=[ray_materia_component(backend)],
                          scaleout=backend)
        for n in range(2):
            open_session(runtime, f"s{n}", project(workdir, f"p{n}", workdir / "visits.log", STAMP_COMMAND))
        sid = next(f"s{n}" for n in range(2) if backend.host_of(f"s{n}", 10).node_id == worker.node_id)
        victim = backend.host_of(sid, 10)
        proj = workdir / f"p{sid[1:]}"
        cast_id = materia_call(runtime, sid, "start", {"request": "request"})["cast_id"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not stamped_copies(proj / "stamps.log"):
            time.sleep(0.05)
        result["cut_at"] = time.time()
        if how in ("unreachable", "unanswering"):
            stopped = _OneWayCut(victim.pid, "dport" if how == "unreachable" else "sport")
        else:
            stopped = psutil.Process(victim.pid if how == "host" else worker.all_processes["raylet"][0].process.pid)
            stopped.suspend()
        status = wait_all(runtime, [(sid, cast_id)], STOPPED_FOR_S)
        result["status_while_stopped"] = dict(status)
        result["resumed_at"] = time.time()
        try:
            stopped.resume()
        except psutil.NoSuchProcess:
            pass  # killed while stopped (the serving process ended the host it took for lost)
        status = wait_all(runtime, [(sid, cast_id)], 60.0)
        result["status"] = status
        deadline = time.monotonic() + 15  # what the old host may still do once it runs again
        while time.monotonic() < deadline and any(
                not c["ended"] and time.time() - c["last"] < 1.0 for c in stamped_copies(proj / "stamps.log")):
            time.sleep(0.2)
        copies = stamped_copies(proj / "stamps.log")
        result["copies"] = copies
        result["overlaps"] = [f"{a['pid']} ran until {a['last']:.2f}, {b['pid']} started {b['start']:.2f}"
                              for a, b in zip(copies, copies[1:], strict=False) if b["start"] <= a["last"]]
        result["victim"] = victim.host_id
        result["recoveries"] = backend.recoveries
        result["hosts_after"] = [{k: h[k] for k in ("host_id", "alive")} for h in backend.hosts_view()]
        try:  # the old host, running again (or reaching the GCS all along), ended itself: or was killed
            old = psutil.Process(victim.pid)
            result["old_host_alive_at_end"] = old.is_running() and old.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            result["old_host_alive_at_end"] = False
    finally:
        _resume_and_shut_down(stopped, runtime, backend, cluster)
    print("RESULT " + json.dumps(result), flush=True)
    return result


GRANT_LOSSES = 6  # host losses in a row in grant_keys


def grant_keys(workdir: Path) -> dict[str, Any]:
    """What a lost host's grant leaves in the cluster's key-value store, over many host losses, and
    what a host taken for lost while stopped does when it runs again after them all. One host is
    stopped (SIGSTOP) and taken for lost by the serving process as its silence would; then
    ``GRANT_LOSSES`` hosts are killed in a row (each replaced), and the scenario waits past the
    commands' lease and its margin. The keys of castor's namespace are then listed; a command
    submitted with the stopped host's grant must never start, and the stopped host, run again,
    must end itself."""
    import psutil
    import ray
    from ray.cluster_utils import Cluster

    from castor.adapters.materia.process_runner import UtilityCommand
    from castor.scaleout.ray_backend import RayBackend, RayBackendSettings
    from castor.scaleout.utility_tasks import GRANT_NAMESPACE, LEASE_MARGIN_S, RayUtilityRunner

    lease_s = 1.0
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 80 << 20})
    cluster.add_node(num_cpus=1, object_store_memory=80 << 20)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="castor", log_to_driver=False, configure_logging=False)
    result: dict[str, Any] = {"scenario": "grant_keys", "losses": GRANT_LOSSES + 1}
    backend = None
    sleeper: Any = None
    try:
        backend = RayBackend(RayBackendSettings(address=cluster.address, hosts=2, command_lease_s=lease_s,
                                                lost_after_silence_s=600.0))
        gcs = ray._private.worker.global_worker.gcs_client  # noqa: SLF001 - the store the grants live in

        def keys() -> list[str]:
            return sorted(k.decode() for k in gcs.internal_kv_keys(b"", GRANT_NAMESPACE, timeout=10))

        result["keys_at_start"] = keys()
        stopped_ref = backend.live_hosts()[0]
        sleeper = psutil.Process(stopped_ref.pid)
        sleeper.suspend()
        backend._host_lost(stopped_ref, "stopped by the test")  # noqa: SLF001 - as its silence would
        for n in range(GRANT_LOSSES + 1):
            deadline = time.monotonic() + 60
            while len(backend.recoveries) <= n and time.monotonic() < deadline:
                time.sleep(0.05)
            if n == GRANT_LOSSES:
                break
            victim = next(h for h in backend.live_hosts() if h.drainer is not None)
            backend.kill_host(victim.host_id)
        result["recoveries"] = len(backend.recoveries)
        time.sleep(lease_s + LEASE_MARGIN_S + 1.0)  # past every lost host's commands' lease and margin
        result["keys_at_end"] = keys()
        result["live_hosts"] = len(backend.live_hosts())
        marker = workdir / "ran"
        cmd = UtilityCommand(argv=[sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"], cwd=workdir,
                             timeout_ms=60000, max_output_bytes=4096, env=dict(os.environ))
        outcome = RayUtilityRunner(lease_s, stopped_ref.grant).spawn(cmd, {"cpus": 1}).wait()
        result["stale_command"] = {"killed": outcome.killed, "stderr": outcome.stderr, "ran": marker.exists()}
        sleeper.resume()
        deadline = time.monotonic() + 15
        alive = True
        while alive and time.monotonic() < deadline:
            try:
                alive = sleeper.is_running() and sleeper.status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                alive = False
            time.sleep(0.1)
        result["stale_host_alive_15s_after_waking"] = alive
    finally:
        _resume_and_shut_down(sleeper, None, backend, cluster)
    print("RESULT " + json.dumps(result), flush=True)
    return result


_SERVING_PROCESS = """
import json, sys, time
import ray
from castor.scaleout.ray_backend import RayBackend, RayBackendSettings
ray.init(address=sys.argv[1], namespace="castor", log_to_driver=False, configure_logging=False)
backend = RayBackend(RayBackendSettings(address=sys.argv[1], hosts=2, command_lease_s=float(sys.argv[2])))
hosts = backend.live_hosts()
print("UP " + json.dumps({"grants": [h.grant for h in hosts], "host_pids": [h.pid for h in hosts],
                          "job": ray.get_runtime_context().get_job_id()}), flush=True)
time.sleep(600)
"""


def killed_serving_process(workdir: Path) -> dict[str, Any]:
    """A serving process (``castor serve``) killed outright (``kill -9``) with two live hosts: it
    cannot delete their grant keys, so they stayed in the cluster's key-value store for as long as
    the cluster ran. The scenario then starts a serving process of its own on the same cluster (as
    the next ``castor serve`` would) and lists the keys of castor's namespace; a command submitted
    with a grant of the killed process's hosts must never start."""
    import subprocess

    import psutil
    import ray
    from ray.cluster_utils import Cluster

    from castor.adapters.materia.process_runner import UtilityCommand
    from castor.scaleout.ray_backend import RayBackend, RayBackendSettings
    from castor.scaleout.utility_tasks import GRANT_NAMESPACE, RayUtilityRunner

    lease_s = 1.0
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 80 << 20})
    cluster.add_node(num_cpus=1, object_store_memory=80 << 20)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="castor", log_to_driver=False, configure_logging=False)
    result: dict[str, Any] = {"scenario": "killed_serving_process"}
    backend = None
    serving: Any = None
    try:
        gcs = ray._private.worker.global_worker.gcs_client  # noqa: SLF001 - the store the grants live in

        def keys() -> list[str]:
            return sorted(k.decode() for k in gcs.internal_kv_keys(b"", GRANT_NAMESPACE, timeout=10))

        serving = subprocess.Popen([sys.executable, "-c", _SERVING_PROCESS, cluster.address, str(lease_s)],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        up: dict[str, Any] = {}
        for line in serving.stdout or []:  # until it says, or ends
            if line.startswith("UP "):
                up = json.loads(line[len("UP "):])
                break
        if not up:
            result["error"] = f"the serving process did not start its hosts (exit {serving.poll()})"
            return result
        result["keys_while_serving"] = keys()
        result["killed_grants"] = up["grants"]
        serving.kill()  # kill -9: nothing of it runs any more
        serving.wait()
        deadline = time.monotonic() + 30  # once the cluster has noticed (its hosts end with it)
        while time.monotonic() < deadline and not all(
                info.is_dead for info in gcs.get_all_job_info(timeout=10).values()
                if info.job_id.hex() == up["job"]):
            time.sleep(0.1)
        while time.monotonic() < deadline and any(psutil.pid_exists(pid) for pid in up["host_pids"]):
            time.sleep(0.1)
        result["hosts_alive_after_kill"] = [pid for pid in up["host_pids"] if psutil.pid_exists(pid)]
        result["keys_after_kill"] = keys()
        backend = RayBackend(RayBackendSettings(address=cluster.address, hosts=1, command_lease_s=lease_s))
        result["keys_after_next_serve"] = keys()
        result["next_serve_keys"] = sorted(f"grant:{h.grant}" for h in backend.live_hosts())
        marker = workdir / "ran"
        cmd = UtilityCommand(argv=[sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"], cwd=workdir,
                             timeout_ms=60000, max_output_bytes=4096, env=dict(os.environ))
        outcome = RayUtilityRunner(lease_s, up["grants"][0]).spawn(cmd, {"cpus": 1}).wait()
        result["stale_command"] = {"killed": outcome.killed, "stderr": outcome.stderr, "ran": marker.exists()}
    finally:
        if serving is not None and serving.poll() is None:
            serving.kill()
            serving.wait()
        _resume_and_shut_down(None, None, backend, cluster)
        print("RESULT " + json.dumps(result), flush=True)
    return result


STOPPED_FOR_S = 40.0


class _OneWayCut:
    """An asymmetric partition of one process on this namespace's loopback (``ip rule``, no
    firewall needed): packets *to* its listening ports (``dport``: nobody reaches it, while it
    reaches everyone) or *from* them (``sport``: calls reach it and run, its answers are lost)
    are dropped. :meth:`resume` heals it."""

    def __init__(self, pid: int, side: str) -> None:
        import subprocess

        import psutil

        self.ports = sorted({c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp")
                             if c.status == psutil.CONN_LISTEN})
        self.rules = [["pref", str(10 + n), "ipproto", "tcp", side, str(port), "blackhole"]
                      for n, port in enumerate(self.ports)]
        # the local table's rule comes first by default: moved after these
        subprocess.run(["ip", "rule", "del", "pref", "0", "table", "local"], check=True, timeout=10)
        subprocess.run(["ip", "rule", "add", "pref", "100", "table", "local"], check=True, timeout=10)
        for rule in self.rules:
            subprocess.run(["ip", "rule", "add", *rule], check=True, timeout=10)

    def resume(self) -> None:
        import subprocess

        for rule in self.rules:
            subprocess.run(["ip", "rule", "del", *rule], capture_output=True, timeout=10)
        self.rules = []


class _NodeBehindLink:
    """A Ray worker node in a network namespace of its own (inside this scenario's), joined to
    this one by a veth pair, so that taking the link down is a real partition: the node's raylet,
    workers and commands run on, and neither side reaches the other."""

    head_ip, node_ip = "10.203.0.1", "10.203.0.2"

    def __init__(self) -> None:
        import subprocess

        for argv in (["ip", "link", "add", "castor-a", "type", "veth", "peer", "name", "castor-b"],
                     ["ip", "addr", "add", f"{self.head_ip}/24", "dev", "castor-a"],
                     ["ip", "link", "set", "castor-a", "up"]):
            subprocess.run(argv, check=True, timeout=10)
        self.proc: Any = None
        self.netns = ""

    def join(self, gcs_address: str, num_cpus: int) -> str:
        """Start the node (``ray start --block`` in a new network namespace) and answer its node id."""
        import subprocess

        import ray

        ray_cli = str(Path(sys.executable).with_name("ray"))
        script = ("ip link set lo up; i=0; until ip link show castor-b >/dev/null 2>&1; do i=$((i+1)); "
                  "[ $i -gt 400 ] && exit 3; sleep 0.05; done; "  # until the link is moved in here
                  f"ip addr add {self.node_ip}/24 dev castor-b && ip link set castor-b up && "
                  f'exec "{ray_cli}" start --address={gcs_address} --node-ip-address={self.node_ip} '
                  f"--num-cpus={num_cpus} --object-store-memory={80 << 20} --disable-usage-stats --block")
        self.proc = subprocess.Popen(["unshare", "-n", "sh", "-c", script], start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self.netns and time.monotonic() < deadline:
            try:  # the shell runs in its namespace once unshare has made it
                netns = os.readlink(f"/proc/{self.proc.pid}/ns/net")
            except OSError:
                netns = ""
            if netns and netns != os.readlink("/proc/self/ns/net"):
                self.netns = netns
            else:
                time.sleep(0.02)
        subprocess.run(["ip", "link", "set", "castor-b", "netns", str(self.proc.pid)], check=True, timeout=10)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            for node in ray.nodes():
                if node.get("NodeManagerAddress") == self.node_ip and node.get("Alive"):
                    return str(node["NodeID"])
            if self.proc.poll() is not None:
                raise RuntimeError(f"the node behind the link exited {self.proc.returncode}")
            time.sleep(0.2)
        raise RuntimeError("the node behind the link did not join within 90 s")

    def cut(self) -> None:
        import subprocess

        subprocess.run(["ip", "link", "set", "castor-a", "down"], check=True, timeout=10)

    def stop(self) -> None:
        """End every process of the node's namespace (they outlive ``ray start``'s own exit at times)."""
        import subprocess

        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()
        if self.netns:
            for name in os.listdir("/proc"):
                try:
                    if name.isdigit() and os.readlink(f"/proc/{name}/ns/net") == self.netns:
                        os.kill(int(name), signal.SIGKILL)
                except OSError:
                    continue
        subprocess.run(["ip", "link", "del", "castor-a"], capture_output=True, timeout=10)


def main() -> None:
    scenario, workdir = sys.argv[1], Path(sys.argv[2])
    if scenario == "lease_to_stopped_node":
        lease_to_stopped_node(workdir)  # prints its RESULT itself
        return
    if scenario == "grant_keys":
        grant_keys(workdir)  # prints its RESULT itself
        return
    if scenario == "killed_serving_process":
        killed_serving_process(workdir)  # prints its RESULT itself
        return
    if scenario.startswith("stopped_"):
        stopped_host(workdir, scenario[len("stopped_"):])  # prints its RESULT itself
        return
    if scenario.startswith("cut_off_"):
        cut_off_node(workdir, scenario[len("cut_off_"):])  # prints its RESULT itself
        return
    import ray
    from ray.cluster_utils import Cluster

    from castor.actors.materia.api import materia_call
    from castor.runtime import Runtime, RuntimeSettings
    from castor.scaleout.ray_backend import RayBackend, RayBackendSettings, ray_materia_component

    visit_log = workdir / "visits.log"
    os.environ["VISIT_LOG"] = str(visit_log)
    # stop_raylet: commands outlast the node's death being noticed (about 4 s), so the host's casts
    # still need it then (with short ones they could all end before, and nothing was lost to recover).
    os.environ["SLOW_S"] = {"kill_host": "1.5", "remove_node": "1.5", "stop_raylet": "8"}.get(scenario, "0.2")
    head: dict[str, Any] = {"num_cpus": 1, "object_store_memory": 80 << 20}
    if scenario == "stop_raylet":  # a node is dead after three missed health checks a second apart
        head["_system_config"] = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3,
                                  "health_check_timeout_ms": 1000}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    worker = cluster.add_node(num_cpus=1, object_store_memory=80 << 20)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="castor", log_to_driver=False, configure_logging=False)
    backend = RayBackend(RayBackendSettings(address=cluster.address, hosts=2, fence_after_s=8.0))
    runtime = Runtime(RuntimeSettings(max_casts_per_session=2), components=[ray_materia_component(backend)],
                      scaleout=backend)
    result: dict[str, Any] = {"scenario": scenario}
    try:
        started: list[tuple[str, str]] = []
        for n in range(4):
            sid = f"s{n}"
            proj = project(workdir, f"p{n}", visit_log)
            open_session(runtime, sid, proj)
            view = materia_call(runtime, sid, "start", {"request": f"request {n}"})
            started.append((sid, view["cast_id"]))
        result["hosts_before"] = [{k: h[k] for k in ("host_id", "node_id", "sessions")} for h in backend.hosts_view()]
        if scenario == "kill_host":
            time.sleep(0.6)  # mid-cast: turns and commands in flight
            victim = next(h for h in backend.live_hosts() if h.sessions)
            result["killed"] = victim.host_id
            backend.kill_host(victim.host_id)
        elif scenario == "remove_node":
            time.sleep(0.6)
            result["removed_node"] = worker.unique_id
            cluster.remove_node(worker)
        elif scenario == "stop_raylet":
            import psutil

            time.sleep(0.6)
            victim = next(h for h in backend.live_hosts() if h.node_id == worker.node_id)
            result["killed"], result["host_pid"] = victim.host_id, victim.pid
            raylet = worker.all_processes["raylet"][0].process
            raylet.send_signal(signal.SIGSTOP)  # killed, the raylet takes its workers along only at times
            host = psutil.Process(victim.pid)
            result["host_alive_after_raylet"] = host.is_running() and host.status() != psutil.STATUS_ZOMBIE
        elif scenario == "two_hosts":
            sid, cast_id = started[0]
            holder = backend.host_of(sid, 10)
            other = next(h for h in backend.live_hosts() if h.host_id != holder.host_id)
            info = runtime.session(sid).info.model_dump()
            info["session_id"] = "intruder"
            ray.get(other.actor.open_session.remote(info, False, None), timeout=30)
            answer = ray.get(other.actor.call.remote("intruder", "recast", {"cast_id": cast_id}, 10.0), timeout=30)
            result["intruder"] = answer.get("error") or {"unexpected": "recast accepted"}
        status = wait_all(runtime, started, 120.0)
        result["status"] = status
        result["not_ended"] = {}  # what a cast still running waits on: the first thing a failure needs
        for sid, cast_id in started:
            if status.get(cast_id) not in ("complete", "failed", "aborted"):
                try:
                    view = materia_call(runtime, sid, "status", {"cast_id": cast_id})
                    view = {k: view.get(k) for k in ("current_socket", "socket_state", "pending", "visits", "live",
                                                      "last_message", "run_dir")}
                    events = Path(str(view["run_dir"])) / "events.jsonl"
                    view["last_events"] = [json.loads(line)["type"] for line in
                                           events.read_text().splitlines()[-6:]] if events.exists() else []
                except Exception as exc:  # noqa: BLE001 - a diagnostic only
                    view = {"error": repr(exc)}
                result["not_ended"][f"{sid} {cast_id}"] = view
        visits = [line.split()[0] for line in visit_log.read_text().splitlines()] if visit_log.exists() else []
        result["visits"] = len(visits)
        result["duplicate_visits"] = len(visits) - len(set(visits))
        result["nodes_used"] = sorted({line.split()[1] for line in visit_log.read_text().splitlines()}) \
            if visit_log.exists() else []
        result["recoveries"] = backend.recoveries
        if "host_pid" in result:
            import psutil

            try:
                host = psutil.Process(result["host_pid"])
                result["host_alive_at_end"] = host.is_running() and host.status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                result["host_alive_at_end"] = False
        result["hosts_after"] = [{k: h[k] for k in ("host_id", "alive", "sessions")} for h in backend.hosts_view()]
    finally:
        runtime.shutdown(30.0)
        backend.shutdown()
        ray.shutdown()
        cluster.shutdown()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
