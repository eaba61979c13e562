"""Counters and latency histograms of one actor system, by actor kind, for ``/metrics``.

Cheap enough for every ask: an observation is one short critical section (a counter bump,
or a bisect and two additions). Kept by the :class:`~castor.supervision.registry.Registry`,
so they outlive the handles they came from (a counter never goes down). The web console
turns them into Prometheus text (``castor/console/metrics.py``); this module needs nothing
but the standard library.
"""

from __future__ import annotations

import threading
from bisect import bisect_left

#: Upper bounds (seconds) of the latency histograms' buckets; +Inf is implied.
BUCKETS: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                              10.0, 30.0, 60.0, 300.0)


class Meters:
    """``count(name, kind)`` and ``observe(name, kind, seconds)``; ``collect()`` copies them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, str], int] = {}
        # (name, kind) -> [count per bucket (+Inf last)..., sum of values]
        self._histograms: dict[tuple[str, str], list[float]] = {}

    def count(self, name: str, kind: str, n: int = 1) -> None:
        key = (name, kind)
        with self._lock:
            self._counters[key] = self._counters.get(key, 0) + n

    def observe(self, name: str, kind: str, seconds: float) -> None:
        key = (name, kind)
        index = bisect_left(BUCKETS, seconds)
        with self._lock:
            row = self._histograms.get(key)
            if row is None:
                row = self._histograms[key] = [0.0] * (len(BUCKETS) + 2)
            row[index] += 1
            row[-1] += seconds

    def collect(self) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], list[float]]]:
        """A consistent copy: counters, and per histogram its bucket counts (not cumulative,
        +Inf last) followed by the sum."""
        with self._lock:
            return dict(self._counters), {k: list(v) for k, v in self._histograms.items()}
