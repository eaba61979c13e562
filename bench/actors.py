"""Actor costs: bare pykka vs a castor supervised, inspectable actor — in one run.

Ask round trip, tell throughput, and the life of a short-lived child: castor's
spawn of a TEMPORARY child + first ask + stop (until the supervisor has removed
it and closed its handle) against pykka's ``start()`` + ask + ``stop()``.

    python bench/actors.py [--quick]

Both sides run in this process, alternating repetitions so machine noise hits
them alike. Figures are medians of the repetitions. The last lines are
``RESULT <name> <value> target<=<target>`` (value = castor / pykka ratio).
"""

from __future__ import annotations

import argparse
import statistics
import time

import pykka

from castor.logs import configure_logging
from castor.messages.base import LocalMessage
from castor.supervision import Actor, ActorSystem, ChildSpec, Restart, handles


class Echo(LocalMessage, type_name="bench.echo"):
    n: int


class CastorEcho(Actor):
    @handles(Echo)
    def echo(self, message: Echo) -> int:
        return message.n


class Stop(LocalMessage, type_name="bench.stop"):
    pass


class PykkaEcho(pykka.ThreadingActor):
    def on_receive(self, message):
        return message.n


def ask_round_trip(ask, n: int) -> float:
    """Seconds per ask, over n sequential asks."""
    message = Echo(n=1)
    start = time.perf_counter()
    for _ in range(n):
        ask(message)
    return (time.perf_counter() - start) / n


def tell_throughput(tell, ask, n: int) -> float:
    """Messages per second: n tells, then one ask that returns after all of them."""
    message = Echo(n=1)
    start = time.perf_counter()
    for _ in range(n):
        tell(message)
    ask(message)
    return n / (time.perf_counter() - start)


class Nothing(Actor):
    """An empty temporary child: what a socket visit costs before it does any work."""

    @handles(Echo)
    def echo(self, message: Echo) -> int:
        return message.n

    @handles(Stop)
    def stop(self, _message: Stop) -> None:
        self.stop_self()  # as a SocketActor ends its visit


def castor_spawn_stop(system: ActorSystem, n: int) -> float:
    """Seconds per spawn + first ask + stop of a temporary child, waiting until it is removed."""
    message = Echo(n=1)
    start = time.perf_counter()
    for i in range(n):
        handle = system.spawn(ChildSpec(f"t{i}", Nothing, restart=Restart.TEMPORARY, shutdown_timeout=2.0))
        handle.ask(message, timeout=10)
        handle.tell(Stop())
        if not handle.closed.wait(10):
            raise RuntimeError("temporary child was not removed")
    return (time.perf_counter() - start) / n


def pykka_spawn_stop(n: int) -> float:
    """Seconds per ``start()`` + ask + ``stop()`` (blocking until the thread's loop ended)."""
    message = Echo(n=1)
    start = time.perf_counter()
    for _ in range(n):
        ref = PykkaEcho.start()
        ref.ask(message, timeout=10)
        ref.stop()
    return (time.perf_counter() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    configure_logging("ERROR")
    reps, asks, tells, spawns = (5, 2000, 20000, 200) if args.quick else (9, 5000, 50000, 500)

    system = ActorSystem([ChildSpec("echo", CastorEcho)])
    castor_ref = system.lookup("/root/echo")
    pykka_ref = PykkaEcho.start()
    c_ask = lambda m: castor_ref.ask(m, timeout=10)  # noqa: E731 - a short local helper
    p_ask = lambda m: pykka_ref.ask(m, timeout=10)  # noqa: E731 - a short local helper
    for _ in range(2):  # warm up both
        ask_round_trip(c_ask, 500)
        ask_round_trip(p_ask, 500)

    castor_spawn_stop(system, 50)
    pykka_spawn_stop(50)
    c_hop, p_hop, c_tell, p_tell, c_spawn, p_spawn = [], [], [], [], [], []
    for _ in range(reps):
        p_spawn.append(pykka_spawn_stop(spawns))
        c_spawn.append(castor_spawn_stop(system, spawns))
        p_hop.append(ask_round_trip(p_ask, asks))
        c_hop.append(ask_round_trip(c_ask, asks))
        p_tell.append(tell_throughput(pykka_ref.tell, p_ask, tells))
        c_tell.append(tell_throughput(castor_ref.tell, c_ask, tells))
    pykka_ref.stop()
    system.shutdown(10)

    # Ratios per repetition pair, then the median: each pair ran back to back.
    hop_ratio = statistics.median(c / p for c, p in zip(c_hop, p_hop, strict=True))
    tell_ratio = statistics.median(p / c for c, p in zip(c_tell, p_tell, strict=True))  # >1: castor slower
    print(f"pykka ask round trip      median {statistics.median(p_hop) * 1e6:8.1f} us  (reps {reps} x {asks})")
    print(f"castor ask round trip     median {statistics.median(c_hop) * 1e6:8.1f} us")
    print(f"pykka tell throughput     median {statistics.median(p_tell):10.0f} msg/s (reps {reps} x {tells})")
    print(f"castor tell throughput    median {statistics.median(c_tell):10.0f} msg/s")
    spawn_ratio = statistics.median(c / p for c, p in zip(c_spawn, p_spawn, strict=True))
    print(f"pykka start+ask+stop      median {statistics.median(p_spawn) * 1e6:8.1f} us  (reps {reps} x {spawns})")
    print(
        f"castor spawn+ask+stop     median {statistics.median(c_spawn) * 1e6:8.1f} us  (temporary child, until removed)"
    )
    print(f"RESULT ask_hop_ratio {hop_ratio:.3f} target<=1.25")
    print(f"RESULT tell_cost_ratio {tell_ratio:.3f} target<=1.5")
    print(f"RESULT spawn_stop_ratio {spawn_ratio:.3f} target<=1.5")


if __name__ == "__main__":
    main()
