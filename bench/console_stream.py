"""What a watched console sends: the main page's stream in bytes per second at 1,000 casts.

    python bench/console_stream.py [--quick] [--window SECONDS] [--delay-ms MS]

1,000 concurrent casts of the 10-socket text loadout of ``bench/casts.py`` across 10 sessions
(tmpfs; a scripted agent answering each turn after ``--delay-ms``, default 5,000 ms, spread
0.6x to 1.4x across the sessions, so casts move from socket to socket while they are watched; a
long delay, 600,000, measures casts that all wait) behind a web console without a token. Once
every cast has started, one client reads the main page's stream (``/events``, what an open
console page reads) for ``--window`` seconds (default 10) and counts the bytes of its events;
the figure is bytes per second, with the events' count and mean size, the first event's size
(the whole document) and the casts in flight at the window's start and end. Events come once a
second while the host keeps up; a busy host takes longer over each snapshot.

Ends with ``RESULT console_stream_bytes_per_s <value> target>=0`` (a figure to track, no target).
"""

from __future__ import annotations

import argparse
import http.client
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import casts as castbench  # noqa: E402  (bench/casts.py: the loadout and its project)

from castor.actors.materia.api import materia_call  # noqa: E402 - after the sys.path set-up above, on purpose
from castor.adapters.agents.scripted import ScriptedAgent, parse_script  # noqa: E402 - after the sys.path set-up above, on purpose
from castor.composition import materia_component  # noqa: E402 - after the sys.path set-up above, on purpose
from castor.console.server import ConsoleServer  # noqa: E402 - after the sys.path set-up above, on purpose
from castor.logs import configure_logging  # noqa: E402 - after the sys.path set-up above, on purpose
from castor.runtime import HarnessLink, Runtime, RuntimeSettings, SessionInfo  # noqa: E402 - after the sys.path set-up above, on purpose


def in_flight(rt: Runtime) -> int:
    return sum(1 for h in rt.system.registry.handles("/root/session") if h.kind == "CastActor" and h.alive)


def stream_bytes(port: int, window: float) -> tuple[int, int, int]:
    """Bytes and events the main page's stream carries in ``window`` seconds after its first event,
    and the bytes of that first one (the whole document)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/events")
    response = connection.getresponse()
    assert response.status == 200, response.status
    total = events = first = 0
    ends: float | None = None
    try:
        while ends is None or time.monotonic() < ends:
            line = response.fp.readline()
            if not line:
                break
            if line.startswith(b"data: "):
                if ends is None:
                    ends = time.monotonic() + window  # the first event (a whole snapshot) opens the window
                    first = len(line)
                    continue
                events += 1
            total += len(line)
    finally:
        connection.close()
    return total, events, first


def measure(base: Path, casts: int, sessions: int, window: float, delay_ms: int) -> dict[str, float]:
    project = castbench.make_project(base, "console")
    per_session = casts // sessions
    rt = Runtime(RuntimeSettings(max_casts_per_session=per_session), components=[materia_component()])
    console = ConsoleServer(rt, "127.0.0.1", 0, token=None).start()
    try:
        for n in range(sessions):
            delay = int(delay_ms * (0.6 + 0.8 * n / max(1, sessions - 1)))
            agent = ScriptedAgent(parse_script({"*": [{"text": "ok", "delay_ms": delay}] * castbench.SOCKETS}),
                                  max_workers=4)
            rt.open_session(SessionInfo(session_id=f"bench-{n}", cwd=str(project), trusted=True),
                            HarnessLink(agent=agent, session_log=None, ui=None))

        def start_all(sid: str) -> None:
            for n in range(per_session):
                materia_call(rt, sid, "start", {"request": f"c{n}"}, timeout=300)

        starters = [threading.Thread(target=start_all, args=(f"bench-{s}",)) for s in range(sessions)]
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        before = in_flight(rt)
        total, events, first = stream_bytes(console.port, window)
        return {"bytes_per_s": total / window, "events": events, "in_flight_start": before,
                "in_flight_end": in_flight(rt), "first": first, "per_event": total / max(1, events)}
    finally:
        console.stop()
        rt.shutdown(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 casts")
    parser.add_argument("--window", type=float, default=10.0, help="seconds the stream is read (default 10)")
    parser.add_argument("--delay-ms", type=int, default=5000, help="the agent's latency per turn (default 5000)")
    args = parser.parse_args()
    configure_logging("ERROR")
    casts = 300 if args.quick else 1000
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(prefix="castor-bench-console-", dir=shm) as tmp:
        result = measure(Path(tmp), casts, 10, args.window, args.delay_ms)
    print(f"{casts} casts started; {result['in_flight_start']:.0f} in flight when the window opened, "
          f"{result['in_flight_end']:.0f} when it closed; {result['events']:.0f} events in {args.window:.0f} s")
    print(f"the first event (the whole document) {result['first']:.0f} bytes; then {result['per_event']:.0f} bytes "
          "an event on average")
    print(f"RESULT console_stream_bytes_per_s {result['bytes_per_s']:.0f} target>=0")


if __name__ == "__main__":
    main()
