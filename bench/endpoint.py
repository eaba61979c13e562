"""Benchmark: castor msgpack-rpc over a Unix socket vs a raw msgpack echo.

In one run, interleaved so machine noise hits both alike:

* ``raw``    — a thread echoes msgpack values over a Unix socket, reading with
  the same incremental ``Unpacker`` fed from ``recv``; the client sends one
  frame and reads the reply on its own thread. The physical floor.
* ``castor`` — ``Server`` + ``Client`` over a Unix socket, method ``echo``
  (registered without a params model, as a trivial method would be).
* ``castor_16`` — requests per second with 16 concurrent clients, each on its
  own connection and thread.

Usage: ``python bench/endpoint.py [--quick]``. Prints a table and ends with
``RESULT <name> <value> target<=<target>`` lines (medians of the runs).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import threading
import time

import msgpack

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from loguru import logger  # noqa: E402

from castor.client import Client  # noqa: E402
from castor.endpoint import Dispatcher, Server  # noqa: E402

PARAMS = {"text": "ping", "n": 1}


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
                return
            unpacker.feed(data)
            for obj in unpacker:
                # Same frame shape as a msgpack-rpc response, so payload sizes match.
                conn.sendall(msgpack.packb([1, obj[1], None, obj[3][0]], use_bin_type=True))


def run_raw(path: str, n: int) -> float:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=16 << 20)
    start = time.perf_counter()
    for i in range(n):
        sock.sendall(msgpack.packb([0, i, "echo", [PARAMS]], use_bin_type=True))
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


# ---------------------------------------------------------------- castor
def run_castor(client: Client, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        client.call("echo", PARAMS)
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int, default=None)
    args = parser.parse_args()
    runs = args.runs or (3 if args.quick else 7)
    n = 1000 if args.quick else 4000
    seconds = 1.0 if args.quick else 2.0
    logger.remove()  # measure the transport, not log formatting

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

    run_raw(raw_path, 200)
    run_castor(client, 200)
    raw_us, castor_us, ratios, rps = [], [], [], []
    for _ in range(runs):
        r = run_raw(raw_path, n)
        c = run_castor(client, n)
        raw_us.append(r)
        castor_us.append(c)
        ratios.append(c / r)
        rps.append(run_concurrent(castor_path, 16, seconds))
    client.close()
    server.stop()
    stop.set()
    raw_listener.close()

    def fmt(values: list[float]) -> str:
        return f"{statistics.median(values):9.1f}  [{min(values):.1f}..{max(values):.1f}]"

    print(f"runs={runs} calls/run={n} cpus={os.cpu_count()}")
    print(f"raw msgpack echo round trip (us)     {fmt(raw_us)}")
    print(f"castor echo round trip (us)          {fmt(castor_us)}")
    print(f"ratio castor/raw (per run)           {fmt(ratios)}")
    print(f"castor 16 clients (requests/s)       {fmt(rps)}")
    print(f"RESULT endpoint_roundtrip_ratio {statistics.median(ratios):.2f} target<=1.5")
    print(f"RESULT endpoint_roundtrip_us {statistics.median(castor_us):.1f} target<={1.5 * statistics.median(raw_us):.1f}")
    print(f"RESULT endpoint_rps_16_clients {statistics.median(rps):.0f} target>=10000")


if __name__ == "__main__":
    main()
