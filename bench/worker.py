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

5. **What users wait on** (``--user-rounds`` rounds, in two placements: a child process pinned
   to one CPU with ``sched_setaffinity`` before it starts a thread, so the whole tree -- its
   threads and the worker it spawns -- shares that CPU, and an unpinned child), against a
   fake ``icarus`` package this benchmark writes (``hooks.echo`` returns its arguments;
   ``tools.fabric_recall`` returns its query as JSON; nothing else runs per call):

   - ``raw`` -- the floor: a parent writing one JSON line to a tiny Python child (no castor
     code: ``RAW_CHILD``) that imports the same package, calls the function and writes one
     JSON line back; the parent reads it with ``readline`` and parses it. One such pair per
     path, each making the backend call its path makes: ``raw`` calls ``hooks.echo`` (the
     actor's call), ``raw_hook`` calls ``hooks.pre_llm_call`` with the keyword arguments castor
     sends for a prompt, ``raw_tool`` calls ``tools.fabric_recall`` and parses the JSON text it
     returns (a harness receives the structure). Until 2026-12-06 the hook and tool lines were
     held against ``hooks.echo``'s floor, which does less than the tool's call (no JSON text
     made and parsed: about 35 us less per 10 KiB call on one CPU): a floor below its path.
     Those ratios are still printed, as a line of their own without a target.
   - ``actor`` -- the call a harness makes inside castor minus the endpoint:
     ``IcarusWorkerClient.call`` -> ``IcarusWorkerActor`` ask -> ``WorkerProcess`` ->
     castor's worker program -> the same package.
   - ``hook`` / ``tool`` -- a hook call (``harness.event`` ``before_agent_start``, which runs
     ``hooks.pre_llm_call`` once) and a Fabric tool call (``icarus.tool`` ``fabric_recall``)
     through the endpoint over a Unix socket from a ``castor.client`` msgpack-rpc client, in
     a real ``Runtime`` with the Icarus component (the client handles the footer and toast
     notifications on its reading thread, as a harness's quick UI updates are registered:
     ``on_notification(..., on_reading_thread=True)``). Their floors are ``raw_hook`` and
     ``raw_tool`` plus ``echo``: a raw msgpack echo over the same kind of socket (bench/endpoint.py's
     baseline).

   Each round warms every path (2,000 calls), then times 2,000 small calls (``hooks.echo``
   with one small argument) and 500 calls carrying 10 KiB each way per path, in ten slices with
   every path in turn within a slice (so the paths compared ran close together in time). Every
   call is timed on its own; the figures are per-round medians and p99s, and each ratio is the
   median over the rounds of (path / floor) within the round.

Runs are interleaved (raw, bridge, raw, bridge, ...) so machine noise hits both;
each run's value is the mean over ``--calls`` round trips; medians of the runs
are reported, and the ratio is the median of the per-pair (adjacent raw/bridge
runs) ratios, which cancels most of the load drift of a shared machine. Ends with ``RESULT <name> <value>
target<=<target>`` lines.

Usage: ``python bench/worker.py [--quick] [--runs 9] [--calls 1000] [--cold 7] [--queued 1000] [--drain-runs 5]
[--user-rounds 5]``
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from castor.actors.icarus.worker import WorkerCall, icarus_worker_spec  # noqa: E402 - after the sys.path set-up above, on purpose
from castor.adapters.icarus.launch import WorkerLaunch, build_launch  # noqa: E402 - after the sys.path set-up above, on purpose
from castor.adapters.icarus.worker_process import WorkerProcess, next_request_id, worker_factory  # noqa: E402 - after the sys.path set-up above, on purpose
from castor.domain.icarus.settings import IcarusSettings  # noqa: E402 - after the sys.path set-up above, on purpose
from castor.logs import configure_logging  # noqa: E402 - after the sys.path set-up above, on purpose
from castor.messages.errors import Timeout, WorkerRetired  # noqa: E402 - after the sys.path set-up above, on purpose
from castor.supervision import ActorSystem  # noqa: E402 - after the sys.path set-up above, on purpose

REFERENCE = REPO / "examples" / "icarus_reference" / "icarus"
RATIO_TARGET = 1.3
COLD_START_TARGET_MS = 250.0
DRAIN_TARGET_MS = 20.0
DRAIN_DEADLINE_S = 0.5  # how long the blocking call runs before its deadline fires
USER_RATIO_TARGET = 1.25  # the actor call's median against the raw child's
USER_P99_TARGET = 1.5
USER_BIG_TARGET = 1.2  # 10 KiB each way
ENDPOINT_TARGET = 1.5  # a hook / tool call through the endpoint against its raw child + raw msgpack echo
WARM, SMALL, BIG, BIG_BYTES = 2000, 2000, 500, 10 * 1024

FAKE_PACKAGE = {
    "__init__.py": '"""A fake icarus package for bench/worker.py: nothing runs per call but the function."""\n',
    "hooks.py": (
        "def echo(*args, **kwargs):\n"
        "    return {'args': list(args), 'kwargs': kwargs}\n\n\n"
        "def on_session_start(**kwargs):\n    return None\n\n\n"
        "def pre_llm_call(**kwargs):\n    return None\n\n\n"
        "def post_llm_call(**kwargs):\n    return None\n\n\n"
        "def on_session_end(**kwargs):\n    return None\n"),
    "tools.py": (
        "import json\n\n\n"
        "def fabric_recall(args, **kwargs):\n"
        "    return json.dumps({'query': args.get('query'), 'count': 0, 'entries': []})\n"),
    "state.py": "", "obsidian.py": "", "parsing.py": "",
}

# The floor's child: no castor code, the same package, one JSON line in, one out.
RAW_CHILD = """import importlib, json, sys
sys.path.insert(0, sys.argv[1])
import icarus.hooks, icarus.tools
out = sys.stdout.buffer
for line in sys.stdin.buffer:
    req = json.loads(line)
    fn = getattr(importlib.import_module("icarus." + req["module"]), req["function"])
    reply = {"id": req["id"], "ok": True, "result": fn(*req["args"], **req["kwargs"])}
    out.write(json.dumps(reply).encode() + b"\\n")
    out.flush()
"""


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
        proc.stdout.readline()  # the program's ready line

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


# ---------------------------------------------------------------- what users wait on
def write_fake_package(root: Path) -> Path:
    package = root / "icarus"
    package.mkdir(parents=True, exist_ok=True)
    for name, text in FAKE_PACKAGE.items():
        (package / name).write_text(text)
    return package


def _payload(i: int, big: bool) -> str:
    return ("x" * BIG_BYTES) if big else f"ping-{i}"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


SLICES = 10  # each round's calls are timed in this many slices, every path in turn within a slice


def _round(calls: dict[str, object], warm: int, small: int, big: int) -> dict[str, dict[str, float]]:
    """One round: every path warmed, then its small and its 10 KiB calls timed in slices, every path
    in turn within a slice, so paths compared with each other ran tens of milliseconds apart (a
    shared machine's speed drifts by more than the overheads measured here, second to second).
    Each call is timed on its own (us): per path the small calls' median and p99, the big ones' median."""
    clock = time.perf_counter_ns
    for one in calls.values():
        for i in range(warm):
            one(i, False)
    small_us: dict[str, list[float]] = {name: [] for name in calls}
    big_us: dict[str, list[float]] = {name: [] for name in calls}
    for part in range(SLICES):
        for count, big_call, samples in ((small // SLICES, False, small_us), (big // SLICES, True, big_us)):
            for name, one in calls.items():
                out = samples[name]
                for i in range(part * count, (part + 1) * count):
                    started = clock()
                    one(i, big_call)
                    out.append((clock() - started) / 1e3)
    return {name: {"median": statistics.median(small_us[name]), "p99": _percentile(small_us[name], 0.99),
                   "big": statistics.median(big_us[name])} for name in calls}


class RawChild:
    """The floor: JSON lines to a tiny child that imports the same package (no castor code).

    ``call`` picks the backend call, the one the path this is the floor of makes: ``echo``
    (``hooks.echo``: the actor's call), ``hook`` (``hooks.pre_llm_call`` with the keyword
    arguments castor sends for a prompt; it answers ``None``) or ``tool``
    (``tools.fabric_recall``; its JSON text is parsed, as a harness receives the structure)."""

    def __init__(self, package: Path, call: str = "echo") -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", RAW_CHILD, str(package.parent)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.one = {"echo": self._echo, "hook": self._hook, "tool": self._tool}[call]

    def _ask(self, request: dict) -> object:
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        assert reply["id"] == request["id"] and reply["ok"], reply
        return reply["result"]

    def _echo(self, i: int, big: bool) -> None:
        value = _payload(i, big)
        result = self._ask({"id": i, "module": "hooks", "function": "echo", "args": [value], "kwargs": {}})
        assert result["args"][0] == value  # type: ignore[index]

    def _hook(self, i: int, big: bool) -> None:
        kwargs = {"session_id": "bench", "user_message": _payload(i, big), "is_first_turn": False}
        assert self._ask({"id": i, "module": "hooks", "function": "pre_llm_call", "args": [], "kwargs": kwargs}) is None

    def _tool(self, i: int, big: bool) -> None:
        value = _payload(i, big)
        text = self._ask({"id": i, "module": "tools", "function": "fabric_recall", "args": [{"query": value}],
                          "kwargs": {}})
        assert json.loads(text)["query"] == value  # type: ignore[arg-type]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


class ActorPath:
    """``IcarusWorkerClient.call`` through a supervised ``IcarusWorkerActor`` (the harness's path)."""

    def __init__(self, package: Path, workdir: str) -> None:
        from castor.actors.icarus.worker import IcarusWorkerClient

        settings = IcarusSettings(icarus_dir=str(package), fabric_dir=f"{workdir}/fabric", python=sys.executable)
        launch = build_launch(settings, cwd=workdir)
        self.system = ActorSystem([icarus_worker_spec("bench-user-worker", worker_factory(launch), next_request_id)])
        self.client = IcarusWorkerClient(self.system.lookup("/root/bench-user-worker"))

    def one(self, i: int, big: bool) -> None:
        value = _payload(i, big)
        assert self.client.call("hooks", "echo", [value])["args"][0] == value

    def close(self) -> None:
        self.client.close()
        self.system.shutdown(10)


class RawEcho:
    """A raw msgpack echo over a Unix socket (bench/endpoint.py's floor), for the endpoint paths."""

    def __init__(self, path: str) -> None:
        import msgpack

        self.msgpack = msgpack
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(4)
        import threading

        threading.Thread(target=self._serve, daemon=True).start()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.unpacker = msgpack.Unpacker(raw=False, max_buffer_size=16 << 20)

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        unpacker = self.msgpack.Unpacker(raw=False, max_buffer_size=16 << 20)
        with conn:
            while True:
                data = conn.recv(256 * 1024)
                if not data:
                    return
                unpacker.feed(data)
                for obj in unpacker:
                    conn.sendall(self.msgpack.packb([1, obj[1], None, obj[3][0]], use_bin_type=True))

    def one(self, i: int, big: bool) -> None:
        params = {"session_id": "bench", "name": "fabric_recall", "params": {"query": _payload(i, big)}}
        self.sock.sendall(self.msgpack.packb([0, i, "echo", [params]], use_bin_type=True))
        while True:
            try:
                reply = next(self.unpacker)
                break
            except StopIteration:
                self.unpacker.feed(self.sock.recv(256 * 1024))
        assert reply[1] == i

    def close(self) -> None:
        self.sock.close()
        self.listener.close()


class EndpointPaths:
    """A real Runtime with the Icarus component behind a Server on a Unix socket; a castor.client."""

    def __init__(self, package: Path, workdir: str) -> None:
        from castor.client import Client
        from castor.composition import icarus_component
        from castor.endpoint import Server
        from castor.endpoint.app import build_dispatcher
        from castor.runtime import Runtime, RuntimeSettings

        root = Path(workdir)
        agent, project = root / "agent", root / "project"
        agent.mkdir()
        project.mkdir()
        (agent / "settings.json").write_text(json.dumps({"piIcarusHook": {
            "icarusDir": str(package), "python": sys.executable, "fabricDir": str(root / "fabric"),
            "timeoutMs": 30000}}))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PI_CODING_AGENT_DIR": str(agent)}
        self.runtime = Runtime(RuntimeSettings(), components=[icarus_component(env=env, home=str(root))])
        self.server = Server(build_dispatcher(self.runtime), unix_path=str(root / "castor.sock")).start()
        self.client = Client.connect_unix(str(root / "castor.sock"), default_timeout=30)
        # A harness's footer and toasts are quick updates: handled on the reading thread (the
        # caller waiting for its answer), as castor.client recommends for such handlers.
        for method in ("message.send", "ui.status", "ui.notify"):
            self.client.on_notification(method, lambda _p: None, on_reading_thread=True)
        self.client.call("session.open", {"session_id": "bench", "cwd": str(project), "trusted": False,
                                          "flags": {"harness": "pi", "has_agent_settled": True}})
        self.client.call("harness.event", {"session_id": "bench", "event": "session_start",
                                           "data": {"reason": "startup", "previous_session_file": None}})

    def hook(self, i: int, big: bool) -> None:
        result = self.client.call("harness.event", {"session_id": "bench", "event": "before_agent_start", "data": {
            "prompt": _payload(i, big), "message_type": "user", "custom_type": None, "turn_id": None,
            "system_prompt": "sys", "images": 0}})
        assert not result, result

    def tool(self, i: int, big: bool) -> None:
        value = _payload(i, big)
        result = self.client.call("icarus.tool", {"session_id": "bench", "name": "fabric_recall",
                                                  "params": {"query": value}, "tool_call_id": f"t{i}"})
        assert result["query"] == value, result

    def close(self) -> None:
        try:
            self.client.call("session.close", {"session_id": "bench"})
        finally:
            self.client.close()
            self.server.stop()
            self.runtime.shutdown(timeout=10)


PATHS = ("raw", "raw_hook", "raw_tool", "actor", "echo", "hook", "tool")


def user_paths(rounds: int, warm: int, small: int, big: int) -> dict[str, list[dict[str, float]]]:
    """Every path, ``rounds`` times in turn, in this process (its placement is the caller's).

    Every round starts every path afresh -- the raw child, the worker behind the actor, the echo
    server, the runtime and its worker behind the endpoint -- and closes them after. A parent and
    child taking turns on one CPU settle, per pair of processes, into a fast or a slow mode for
    their whole lives (12 us apart on this host: 20 against 32 us for the raw child, 23 against
    35 for the actor's worker, one pair in five to ten, every call of the pair alike), so a pair
    kept for every round made one run's ratio 1.75 where its neighbours read 1.14. With fresh
    pairs a round's slow pair is one round of several, and each figure is the median over rounds.
    """
    out: dict[str, list[dict[str, float]]] = {name: [] for name in PATHS}
    with tempfile.TemporaryDirectory(prefix="castor-bench-user-") as workdir:
        package = write_fake_package(Path(workdir) / "pkg")
        for n in range(rounds):
            here = Path(workdir) / f"round-{n}"
            here.mkdir()
            raw, raw_hook, raw_tool = RawChild(package), RawChild(package, "hook"), RawChild(package, "tool")
            actor = ActorPath(package, str(here))
            echo, endpoint = RawEcho(f"{here}/echo.sock"), EndpointPaths(package, str(here))
            calls = {"raw": raw.one, "raw_hook": raw_hook.one, "raw_tool": raw_tool.one, "actor": actor.one,
                     "echo": echo.one, "hook": endpoint.hook, "tool": endpoint.tool}
            try:
                figures = _round(calls, warm, small, big)
            finally:
                for thing in (endpoint, echo, actor, raw_tool, raw_hook, raw):
                    thing.close()
            for name in PATHS:
                out[name].append(figures[name])
    return out


def user_paths_child(pinned: bool, rounds: int, warm: int, small: int, big: int) -> dict[str, list[dict[str, float]]]:
    """:func:`user_paths` in a child process, pinned to one CPU (before any thread) or not."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child-user", "pinned" if pinned else "unpinned",
           "--user-rounds", str(rounds), "--user-calls", f"{warm},{small},{big}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    for line in proc.stdout.splitlines():
        if line.startswith("CHILD "):
            return json.loads(line[6:])
    raise SystemExit(f"bench/worker.py: the {'one-CPU' if pinned else 'unpinned'} child failed:\n"
                     f"{proc.stderr[-3000:]}")


def report_user(label: str, suffix: str, data: dict[str, list[dict[str, float]]]) -> None:
    med = statistics.median

    def ratio(path: str, key: str, floor: tuple[str, ...] = ("raw",)) -> float:
        return med(data[path][i][key] / sum(data[f][i][key] for f in floor) for i in range(len(data[path])))

    for name in PATHS:
        rows = data[name]
        big = f"  10 KiB median {med(r['big'] for r in rows):7.1f}"
        print(f"{label:9} {name:8} median {med(r['median'] for r in rows):7.1f} us  "
              f"p99 {med(r['p99'] for r in rows):7.1f} us{big}  "
              "(rounds: " + ", ".join(format(r["median"], ".1f") for r in rows) + ")")
    print(f"RESULT worker_actor_vs_raw_child_ratio{suffix} {ratio('actor', 'median'):.3f} target<={USER_RATIO_TARGET}")
    print(f"RESULT worker_actor_p99_vs_raw_child_ratio{suffix} {ratio('actor', 'p99'):.3f} target<={USER_P99_TARGET}")
    print(f"RESULT worker_actor_10k_vs_raw_child_ratio{suffix} {ratio('actor', 'big'):.3f} target<={USER_BIG_TARGET}")
    # Each endpoint path against the raw child making its own backend call, plus the raw echo.
    hook_floor, tool_floor, echo_floor = ("raw_hook", "echo"), ("raw_tool", "echo"), ("raw", "echo")
    print(f"{label:9} (against hooks.echo's floor, as before 2026-12-06: hook "
          f"{ratio('hook', 'median', echo_floor):.3f}, tool {ratio('tool', 'median', echo_floor):.3f}, "
          f"tool 10 KiB {ratio('tool', 'big', echo_floor):.3f})")
    print(f"RESULT worker_endpoint_hook_vs_raw_ratio{suffix} {ratio('hook', 'median', hook_floor):.3f} "
          f"target<={ENDPOINT_TARGET}")
    print(f"RESULT worker_endpoint_tool_vs_raw_ratio{suffix} {ratio('tool', 'median', tool_floor):.3f} "
          f"target<={ENDPOINT_TARGET}")
    print(f"RESULT worker_endpoint_tool_10k_vs_raw_ratio{suffix} {ratio('tool', 'big', tool_floor):.3f} "
          f"target<={ENDPOINT_TARGET}")
    print(f"RESULT worker_actor_us{suffix} {med(r['median'] for r in data['actor']):.1f} "
          f"target<={USER_RATIO_TARGET * med(r['median'] for r in data['raw']):.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--cold", type=int, default=7)
    parser.add_argument("--queued", type=int, default=1000)
    parser.add_argument("--drain-runs", type=int, default=5)
    parser.add_argument("--user-rounds", type=int, default=5)
    parser.add_argument("--user-calls", default=f"{WARM},{SMALL},{BIG}", help="warm-up,small,10 KiB calls per round")
    parser.add_argument("--quick", action="store_true", help="fewer runs and calls (CI)")
    parser.add_argument("--only-user", action="store_true", help="only the user-path measurements")
    parser.add_argument("--child-user", choices=("pinned", "unpinned"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    configure_logging("ERROR")  # the retirements below log warnings by design
    if args.quick:
        args.runs, args.calls, args.cold, args.drain_runs, args.user_rounds = 3, 500, 3, 2, 2
        args.user_calls = "500,1000,200"
    warm, small, big = (int(n) for n in args.user_calls.split(","))
    if args.child_user:
        if args.child_user == "pinned":
            # Before any thread exists: every later thread, and the worker it spawns, inherits it.
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        print("CHILD " + json.dumps(user_paths(args.user_rounds, warm, small, big)), flush=True)
        return 0
    pinned = user_paths_child(True, args.user_rounds, warm, small, big)
    unpinned = user_paths_child(False, args.user_rounds, warm, small, big)
    report_user("one CPU", "_one_cpu", pinned)
    report_user("unpinned", "_unpinned", unpinned)
    if args.only_user:
        return 0

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
    ratio = statistics.median(b / r for b, r in zip(bridge, raw, strict=True))
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
