"""A long-lived server stays flat: one ``castor serve``, thousands of casts, hundreds of sessions.

    python bench/longrun.py [--quick] [--casts N] [--sessions M] [--dir DIR]

One real ``castor serve --socket`` process; a harness written here drives it over the Unix
socket with castor's own msgpack-rpc client (``castor.client``), as a Pi extension would: each
*session* is a new connection that says hello, opens a session on one shared project, runs its
share of casts one after another (the one-socket ``hello`` loadout; the harness answers every
``agent.run_turn`` at once with ``agent.turn_ended``, a scripted agent with no model; a cast has
ended when its mirrored state entry says so), closes the session and disconnects. Every
project's casts land in one artifact root, so the listing grows with the run.

Sampled from outside (psutil on the server's pid, ``ops.actors`` over the endpoint) after every
session past the warm-up (the first fifth of the casts, at least 600 of them or half the run):
RSS, threads, open fds, live actors, each against the casts done so far:

- ``longrun_rss_mb_per_1000_casts`` (target <= 0.5): memory kept per finished cast, the
  least-squares slope of RSS;
- ``longrun_threads_per_1000_casts``, ``longrun_fds_per_1000_casts``,
  ``longrun_actors_per_1000_casts`` (target 0): the median of the last third of the samples
  minus the median of the first third, per 1,000 casts between them (a count that only wobbles
  by a parked thread reads 0; one kept per cast reads ~1000);
- ``longrun_cast_list_ratio_10x`` (target <= 1.2): ``cast.list`` (one default page) on a project
  holding 10x the casts against the same call on one holding 1x (one session in eleven ran its
  casts there), at the end of the run, calls alternating between the two (200 each, medians), so
  the host's drift hits both sides alike.

- ``longrun_cast_list_ms_at_<N>`` (target <= 100): ``cast.list`` over the endpoint on a project
  holding N finished casts (100,000; ``--quick`` 20,000; ``--scale``), made cheaply as minimal
  state files beside a fresh server, after one call that rebuilt the index (timed and printed,
  not a target: a one-off).

The casts run on tmpfs (/dev/shm) unless ``--dir`` names another place: this benchmark is about
what the process keeps, not the disk. ``--quick`` (CI): 1,500 casts in 150 sessions, under a
minute; the full run: 5,000 casts in 500 sessions.
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
import time
from pathlib import Path

import psutil

from castor.client import Client
from castor.logs import configure_logging
from castor.testing.instant_harness import InstantHarness

ROOT = Path(__file__).resolve().parents[1]


def step_slope(xs: list[float], ys: list[float]) -> float:
    """Slope of a step-valued count (threads, fds, actors): the median of the last third of the
    samples minus that of the first third, over the casts between them. A count that only wobbles
    (a parked thread, a connection closing) reads 0; one kept per cast reads ~1000 per 1000."""
    third = len(xs) // 3
    if third < 1:
        return 0.0
    head_x, tail_x = statistics.median(xs[:third]), statistics.median(xs[-third:])
    if tail_x == head_x:
        return 0.0
    return (statistics.median(ys[-third:]) - statistics.median(ys[:third])) / (tail_x - head_x)


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys against xs (0 with fewer than two distinct xs)."""
    if len(xs) < 2 or len(set(xs)) < 2:
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den


class Server:
    def __init__(self, work: Path) -> None:
        self.sock = str(work / "castor.sock")
        home = work / "home"
        (home / "agent").mkdir(parents=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
               "PI_CODING_AGENT_DIR": str(home / "agent"), "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        self.stderr = open(work / "serve.stderr", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "castor", "serve", "--socket", self.sock], env=env,
                                     cwd=str(work), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self.stderr)
        deadline = time.monotonic() + 30
        while not self._accepting():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"castor serve did not start: {(work / 'serve.stderr').read_text()[-2000:]}")
            time.sleep(0.05)
        self.ps = psutil.Process(self.proc.pid)

    def _accepting(self) -> bool:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(self.sock)
            return True
        except OSError:
            return False
        finally:
            probe.close()

    def connect(self) -> Client:
        return Client.connect_unix(self.sock, default_timeout=30)

    def sample(self, ops: Client) -> dict[str, float]:
        """RSS, threads, fds and actors; the counts as the least of five readings 10 ms apart, so a
        connection still closing (its thread, its socket) is not counted as kept."""
        threads = fds = None
        for _ in range(5):
            with self.ps.oneshot():
                rss, t, f = self.ps.memory_info().rss, self.ps.num_threads(), self.ps.num_fds()
            threads = t if threads is None else min(threads, t)
            fds = f if fds is None else min(fds, f)
            time.sleep(0.01)
        actors = len(ops.call("ops.actors", {})["actors"])
        return {"rss": rss, "threads": threads, "fds": fds - 1, "actors": actors}  # less the ops connection's own

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.stderr.close()


class Harness(InstantHarness):
    """One harness session on its own connection (castor.testing.instant_harness), timing ``cast.list``."""

    def __init__(self, server: Server, sid: str, project: Path) -> None:
        super().__init__(server.connect(), sid, project, client_name="bench-longrun")

    def cast(self) -> None:  # type: ignore[override]  # the bench's one request and deadline
        super().cast("flat for weeks", timeout_s=30)

    def list_time(self, calls: int = 30) -> float:
        timings = []
        for _ in range(calls):
            started = time.perf_counter()
            self.client.call("cast.list", {"session_id": self.sid})
            timings.append(time.perf_counter() - started)
        return statistics.median(timings)



def _project(work: Path, name: str) -> Path:
    project = work / name
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps({"activeLoadout": "hello"}))
    return project


def list_ratio(server: Server, big: Path, small: Path, pairs: int = 200) -> tuple[float, float]:
    """Median ``cast.list`` time (s) on each project, calls alternating so drift hits both alike."""
    sides = [Harness(server, "list-big", big), Harness(server, "list-small", small)]
    times: list[list[float]] = [[], []]
    try:
        for _ in range(pairs):
            for side, harness in enumerate(sides):
                times[side].append(harness.list_time(1))
    finally:
        for harness in sides:
            harness.close()
    return statistics.median(times[0]), statistics.median(times[1])


_MINIMAL = ('{"format":1,"castId":"%s","revision":1,"incarnation":1,"savedAt":"2026-01-01T00:00:00.000Z",'
            '"state":{"active":false,"phase":"complete","socketState":"complete","request":"r"}}')


def listing_at_scale(count: int, base: Path) -> tuple[float, float]:
    """``cast.list`` over the endpoint on a project holding ``count`` finished casts (minimal state
    files made directly: cheap). The first call rebuilds the index from every state.json (a
    one-off); returns (that first call, the median of 20 calls after it), in seconds."""
    work = Path(tempfile.mkdtemp(prefix="castor-longrun-scale-", dir=base))
    project = _project(work, "scale")
    root = project / ".pi" / "pi-materia"
    root.mkdir()
    for n in range(count):
        cast_id = f"2026-01-01T00-00-00-000Z-{n:06d}"
        os.mkdir(root / cast_id)
        fd = os.open(root / cast_id / "state.json", os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, (_MINIMAL % cast_id).encode())
        os.close(fd)
    server = Server(work)
    try:
        harness = Harness(server, "scale", project)
        started = time.perf_counter()
        first = harness.client.call("cast.list", {"session_id": "scale"}, timeout=600)
        rebuild = time.perf_counter() - started
        if first["total"] != count:
            raise RuntimeError(f"listed {first['total']} of {count} casts")
        steady = harness.list_time(20)
        harness.close()
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return rebuild, steady


def run(casts: int, sessions: int, base: Path) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="castor-longrun-", dir=base))
    big, small = _project(work, "big"), _project(work, "small")
    server = Server(work)
    ops = server.connect()
    per_session = max(1, casts // sessions)
    warmup = max(casts // 5, min(600, casts // 2))
    done = 0
    samples: list[tuple[int, dict[str, float]]] = []
    started = time.monotonic()
    try:
        for n in range(sessions):
            # One session in eleven works on the small project: it ends with a tenth of the big one's casts.
            harness = Harness(server, f"longrun-{n}", small if n % 11 == 0 else big)
            for _ in range(per_session):
                harness.cast()
                done += 1
            harness.close()
            if done >= warmup:
                samples.append((done, server.sample(ops)))
        elapsed = time.monotonic() - started
        final = server.sample(ops)
        # which threads castor itself runs at the end (outside the actors' own): a count that grew
        # is then named by owner and purpose, not only counted
        kept = sorted(f"{t.get('name')} ({t.get('owner')}: {t.get('purpose')})"
                      for t in ops.call("ops.actors", {}).get("threads", []))
        list_10x, list_1x = list_ratio(server, big, small)
        counts = [
            len([p for p in (project / ".pi" / "pi-materia").iterdir() if p.is_dir()]) for project in (big, small)
        ]
    finally:
        ops.close()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    xs = [d / 1000 for d, _ in samples]
    fit = {"rss": slope(xs, [s["rss"] for _, s in samples])}
    fit.update({key: step_slope(xs, [s[key] for _, s in samples]) for key in ("threads", "fds", "actors")})
    return {
        "casts": done,
        "sessions": sessions,
        "seconds": elapsed,
        "casts_per_second": done / elapsed,
        "rss_mb_per_1000": fit["rss"] / 2**20,
        "threads_per_1000": fit["threads"],
        "fds_per_1000": fit["fds"],
        "actors_per_1000": fit["actors"],
        "list_1x_ms": (list_1x or 0) * 1000,
        "list_10x_ms": (list_10x or 0) * 1000,
        "big_casts": counts[0],
        "small_casts": counts[1],
        "final_rss_mb": final["rss"] / 2**20,
        "final_threads": final["threads"],
        "final_fds": final["fds"],
        "final_actors": final["actors"],
        "final_castor_threads": kept,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI size: 1,500 casts, 150 sessions")
    parser.add_argument("--casts", type=int, default=None)
    parser.add_argument("--sessions", type=int, default=None)
    parser.add_argument("--scale", type=int, default=None,
                        help="finished casts in the listing-at-scale project (default 100,000; --quick 20,000)")
    parser.add_argument("--dir", default=None, help="where the project lives (default /dev/shm, else the temp dir)")
    args = parser.parse_args()
    configure_logging("ERROR")
    casts = args.casts or (1500 if args.quick else 5000)
    sessions = args.sessions or (150 if args.quick else 500)
    if args.dir:
        base = Path(args.dir)
    elif os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        base = Path("/dev/shm")
    else:
        base = Path(tempfile.gettempdir())
    r = run(casts, sessions, base)
    scale = args.scale or (20_000 if args.quick else 100_000)
    rebuild, steady = listing_at_scale(scale, base)
    print(f"{r['casts']} casts in {r['sessions']} sessions, {r['seconds']:.1f} s ({r['casts_per_second']:.0f}/s) "
          f"on {base}")
    print(f"end of run: RSS {r['final_rss_mb']:.1f} MB, {r['final_threads']:.0f} threads, {r['final_fds']:.0f} fds, "
          f"{r['final_actors']:.0f} actors")
    print(f"castor's own threads at the end ({len(r['final_castor_threads'])}): "
          f"{'; '.join(r['final_castor_threads']) or '-'}")
    print(f"cast.list (one page, median of 200 alternating calls): {r['list_1x_ms']:.2f} ms on a project with "
          f"{r['small_casts']} casts, {r['list_10x_ms']:.2f} ms on one with {r['big_casts']}")
    ratio = r["list_10x_ms"] / r["list_1x_ms"] if r["list_1x_ms"] else float("inf")
    print(f"cast.list with {scale} finished casts: {steady * 1000:.2f} ms (median of 20; the first call, which "
          f"rebuilt the index from every state.json, {rebuild:.1f} s)")
    print(f"RESULT longrun_rss_mb_per_1000_casts {r['rss_mb_per_1000']:.2f} target<=0.5")
    print(f"RESULT longrun_threads_per_1000_casts {r['threads_per_1000']:.2f} target<=0")
    print(f"RESULT longrun_fds_per_1000_casts {r['fds_per_1000']:.2f} target<=0")
    print(f"RESULT longrun_actors_per_1000_casts {r['actors_per_1000']:.2f} target<=0")
    print(f"RESULT longrun_cast_list_ratio_10x {ratio:.2f} target<=1.2")
    print(f"RESULT longrun_cast_list_ms_at_{scale} {steady * 1000:.2f} target<=100")


if __name__ == "__main__":
    main()
