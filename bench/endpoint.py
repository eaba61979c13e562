"""Benchmark: castor msgpack-rpc over a Unix socket vs a raw msgpack echo.

In one run, interleaved so machine noise hits both alike:

* ``raw``    — a thread echoes msgpack values over a Unix socket, reading with
  the same incremental ``Unpacker`` fed from ``recv``; the client sends one
  frame and reads the reply on its own thread. The physical floor.
* ``castor`` — ``Server`` + ``Client`` over a Unix socket, method ``echo``
  (registered without a params model, as a trivial method would be).
* ``castor_16`` — requests per second with 16 concurrent clients, each on its
  own connection and thread.
* the same two round trips carrying a 10 KiB string each way (informational,
  no ``RESULT`` line: bench/worker.py's 10 KiB tool call's frames, the
  transport's share of it).

The round trips are measured twice: unpinned (as the scheduler places the
threads) and, in a child interpreter, with every thread pinned to one CPU
(the stable "same core" floor; on a
2-vCPU VM a cross-core wake-up costs ~40 us and dominates the unpinned
numbers).

Usage: ``python bench/endpoint.py [--quick]``. Prints a table and ends with
``RESULT <name> <value> target<=<target>`` lines (medians of the runs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import msgpack

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from loguru import logger  # noqa: E402 - after the sys.path set-up above, on purpose

from castor.client import Client  # noqa: E402 - after the sys.path set-up above, on purpose
from castor.endpoint import Dispatcher, Server  # noqa: E402 - after the sys.path set-up above, on purpose

PARAMS = {"text": "ping", "n": 1}
#: The informational 10 KiB line's params: a string the size of bench/worker.py's 10 KiB tool call's query.
PARAMS_10K = {"text": "x" * 10240, "n": 1}


# ---------------------------------------------------------------- raw baseline
def _raw_server(listener: socket.socket, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_raw_echo, args=(conn,), daemon=True).start()


def _raw_echo(conn: socket.socket) -> None:
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=16 << 20)
    with conn:
        while True:
            data = conn.recv(256 * 1024)
            if not data:
                ENDED_SWITCHES.update(own_switches())  # after the timed run: its client closed
                return
            unpacker.feed(data)
            for obj in unpacker:
                # Same frame shape as a msgpack-rpc response, so payload sizes match.
                conn.sendall(msgpack.packb([1, obj[1], None, obj[3][0]], use_bin_type=True))


def run_raw(path: str, n: int, params: dict[str, object] = PARAMS) -> float:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=16 << 20)
    start = time.perf_counter()
    for i in range(n):
        sock.sendall(msgpack.packb([0, i, "echo", [params]], use_bin_type=True))
        while True:
            try:
                reply = next(unpacker)
                break
            except StopIteration:
                unpacker.feed(sock.recv(256 * 1024))
        assert reply[1] == i
    elapsed = time.perf_counter() - start
    sock.close()
    return elapsed / n * 1e6


# The context switches of threads that ended (each raw run's echo thread ends when its client closes).
ENDED_SWITCHES: dict[str, int] = {}


def own_switches() -> dict[str, int]:
    """This thread's context switches so far (empty where the kernel does not say)."""
    tid = str(threading.get_native_id())
    try:
        with open(f"/proc/self/task/{tid}/status") as status:
            return {tid: sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)}
    except (OSError, ValueError, IndexError):
        return {}


def switches() -> dict[str, int] | None:
    """Context switches (voluntary and not) of each thread of this process so far, from
    /proc/self/task/*/status; ``None`` where the kernel does not say."""
    counts = {}
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/status") as status:
                counts[tid] = sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return counts


def counted(run: Callable[[], float], n: int, into: list[float]) -> float:
    """``run()``'s result; appends to ``into`` the context switches a round trip of every thread
    that ran during it (one that ended meanwhile by what it recorded as it ended), where the
    kernel says."""
    before = switches()
    ended_before = set(ENDED_SWITCHES)  # (after ``before``: a thread gone from it recorded its end by now)
    result = run()
    after = switches()
    if before is not None and after is not None:
        for tid in set(ENDED_SWITCHES) - ended_before:
            after.setdefault(tid, ENDED_SWITCHES[tid])
        into.append(sum(count - before.get(tid, 0) for tid, count in after.items()) / n)
    return result


# ---------------------------------------------------------------- castor
def run_castor(client: Client, n: int, params: dict[str, object] = PARAMS) -> float:
    start = time.perf_counter()
    for _ in range(n):
        client.call("echo", params)
    return (time.perf_counter() - start) / n * 1e6


def run_concurrent(path: str, clients: int, seconds: float) -> float:
    conns = [Client.connect_unix(path) for _ in range(clients)]
    for c in conns:
        c.call("echo", PARAMS)  # warm: worker threads exist before timing
    counts = [0] * clients
    go = threading.Event()
    deadline_box: list[float] = []

    def loop(idx: int, client: Client) -> None:
        go.wait()
        end = deadline_box[0]
        done = 0
        while time.perf_counter() < end:
            client.call("echo", PARAMS)
            done += 1
        counts[idx] = done

    threads = [threading.Thread(target=loop, args=(i, c)) for i, c in enumerate(conns)]
    for t in threads:
        t.start()
    start = time.perf_counter()
    deadline_box.append(start + seconds)
    go.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    for c in conns:
        c.close()
    return sum(counts) / elapsed


def measure_round_trips(runs: int, n: int, with_concurrency: bool, seconds: float) -> dict[str, list[float]]:
    tmp = tempfile.mkdtemp(prefix="castor-bench-")
    raw_path, castor_path = os.path.join(tmp, "raw.sock"), os.path.join(tmp, "castor.sock")
    raw_listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw_listener.bind(raw_path)
    raw_listener.listen(64)
    stop = threading.Event()
    threading.Thread(target=_raw_server, args=(raw_listener, stop), daemon=True).start()

    dispatcher = Dispatcher()
    dispatcher.register("echo", lambda params, _ctx: params)
    server = Server(dispatcher, unix_path=castor_path).start()
    client = Client.connect_unix(castor_path)

    run_raw(raw_path, 500)  # warm both paths (threads started, caches hot)
    run_castor(client, 500)
    run_raw(raw_path, 200, PARAMS_10K)
    run_castor(client, 200, PARAMS_10K)
    out: dict[str, list[float]] = {"raw": [], "castor": [], "ratio": [], "rps": [],
                                   "raw_switches": [], "castor_switches": [], "raw_10k": [], "castor_10k": [],
                                   "ratio_10k": []}
    for _ in range(runs):
        r = counted(lambda: run_raw(raw_path, n), n, out["raw_switches"])
        c = counted(lambda: run_castor(client, n), n, out["castor_switches"])
        out["raw"].append(r)
        out["castor"].append(c)
        out["ratio"].append(c / r)
        # The same round trip with 10 KiB each way (informational: what a frame's bytes cost on each
        # side against the raw echo's, its reads, copies and writes; no RESULT line of its own).
        r10, c10 = run_raw(raw_path, n // 2, PARAMS_10K), run_castor(client, n // 2, PARAMS_10K)
        out["raw_10k"].append(r10)
        out["castor_10k"].append(c10)
        out["ratio_10k"].append(c10 / r10)
        if with_concurrency:
            out["rps"].append(run_concurrent(castor_path, 16, seconds))
    client.close()
    server.stop()
    stop.set()
    raw_listener.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def same_core_child(runs: int, n: int) -> dict[str, list[float]] | None:
    """Re-run the round trips in a child pinned to one CPU before it starts any thread."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child-same-core", "--runs", str(runs), "--n", str(n)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("CHILD "):
            return json.loads(line[6:])
    print(f"same-core child failed: {proc.stderr[-500:]}", file=sys.stderr)
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--child-same-core", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    runs = args.runs or (3 if args.quick else 9)
    n = args.n or (1000 if args.quick else 3000)
    seconds = 1.0 if args.quick else 2.0
    logger.remove()  # measure the transport, not log formatting

    if args.child_same_core:
        cpu = sorted(os.sched_getaffinity(0))[-1]
        os.sched_setaffinity(0, {cpu})  # threads started from here on inherit it
        print("CHILD " + json.dumps(measure_round_trips(runs, n, False, seconds)))
        return

    unpinned = measure_round_trips(runs, n, True, seconds)
    pinned = same_core_child(runs, n)

    def fmt(values: list[float], digits: int = 1) -> str:
        return f"{statistics.median(values):9.{digits}f}  [{min(values):.{digits}f}..{max(values):.{digits}f}]"

    med = statistics.median
    print(f"runs={runs} calls/run={n} cpus={os.cpu_count()} (median [min..max])")
    print(f"unpinned   raw msgpack echo round trip (us)   {fmt(unpinned['raw'])}")
    print(f"unpinned   castor echo round trip (us)        {fmt(unpinned['castor'])}")
    print(f"unpinned   ratio castor/raw (per run)         {fmt(unpinned['ratio'])}")
    print(f"unpinned   10 KiB each way: raw / castor (us)  {fmt(unpinned['raw_10k'])} / {fmt(unpinned['castor_10k'])}")
    print(f"unpinned   10 KiB ratio castor/raw (per run)  {fmt(unpinned['ratio_10k'])}")
    if pinned:
        print(f"same core  raw msgpack echo round trip (us)   {fmt(pinned['raw'])}")
        print(f"same core  castor echo round trip (us)        {fmt(pinned['castor'])}")
        print(f"same core  ratio castor/raw (per run)         {fmt(pinned['ratio'])}")
        print(f"same core  10 KiB each way: raw / castor (us)  {fmt(pinned['raw_10k'])} / {fmt(pinned['castor_10k'])}")
        print(f"same core  10 KiB ratio castor/raw (per run)  {fmt(pinned['ratio_10k'])}")
        if pinned["raw_switches"] and pinned["castor_switches"] and max(pinned["castor_switches"]) > 0:
            # Every thread's context switches over a run, a round trip: the raw echo's are its two
            # threads' blocking reads (and the preemptions around them); castor's add its watchdog's
            # ticks and whatever else hands off.
            print(f"same core  raw echo context switches a call  {fmt(pinned['raw_switches'], 2)}")
            print(f"same core  castor context switches a call    {fmt(pinned['castor_switches'], 2)}")
    print(f"unpinned   castor, 16 clients (requests/s)    {fmt(unpinned['rps'])}")
    print(f"RESULT endpoint_roundtrip_ratio {med(unpinned['ratio']):.2f} target<=1.5")
    if pinned:
        print(f"RESULT endpoint_roundtrip_ratio_same_core {med(pinned['ratio']):.2f} target<=1.25")
    print(f"RESULT endpoint_roundtrip_us {med(unpinned['castor']):.1f} target<={1.5 * med(unpinned['raw']):.1f}")
    # No target in the brief for throughput; 10k/s is ~100x what a busy harness needs.
    print(f"RESULT endpoint_rps_16_clients {med(unpinned['rps']):.0f} target>=10000")


if __name__ == "__main__":
    main()
