"""A bounded, adaptive spin before a blocking wait for a reply expected within microseconds.

When a process may run on more than one CPU, a thread that blocks for a reply lets its CPU go
idle, and on a virtual machine an idle vCPU halts: the peer's reply then has to wake it, which
costs the peer's send (and the reply's latency) 15-17 us on the hosts castor is measured on --
more than the reply itself takes to come. Polling the descriptor without blocking for a few tens
of microseconds first keeps the CPU awake, so a reply that comes within them is read at once and
wakes nothing.

It is bounded and adaptive, as glibc's adaptive mutexes are: a spin lasts at most ``2 x`` the
recent time a reply took to come while spinning, plus a margin, and never more than ``max_us``;
spins that do not catch the reply (a slow backend, a peer descheduled, a client and server in one
interpreter, where the spinner's interpreter lock delays the very thread that would answer) are
counted, and after ``_MISSES_TO_BACK_OFF`` in a row the next calls wait without spinning, a
number that doubles while the probes keep missing (up to ``_BACK_OFF_MAX``) and starts over at
the first spin that catches its reply. Each poll releases the interpreter lock, and between two
polls the spinner yields its CPU (``sched_yield``): a peer woken by the request is often queued on
the waker's own CPU (a pipe's or a socket's wake-up is a synchronous one, which places the woken
task there), and a spin that does not yield keeps it from running -- measured, such a spin caught
two replies in three and made the call slower; yielding, it caught 99.9 %.

What it costs: the CPU while it spins (up to ``max_us`` a call, on a CPU that would otherwise
idle), and other threads of the process that want the interpreter lock meanwhile get it less
readily. It is off where it cannot pay: a process confined to one CPU (``os.sched_getaffinity``,
read when the waiter is made), where the spinner would only keep the peer it waits for from
running, and wherever ``CASTOR_REPLY_SPIN=0`` (``off``, ``false``, ``no``; ``CASTOR_REPLY_SPIN_US``
sets the bound, default 50 us, at most 1,000; 0 turns it off; a value that is no number leaves
the default). A waiter may be off unless asked for (``on_by_default=False``: the Icarus worker
call, where the spin measured slower than the blocking wait); ``CASTOR_REPLY_SPIN=1`` (``on``,
``true``, ``yes``) turns those on too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

__all__ = ["ReplySpin", "reply_spin"]

_DEFAULT_MAX_US = 50
#: Spins that caught no reply, in a row, before the next calls wait without spinning.
_MISSES_TO_BACK_OFF = 3
#: The first back-off (calls without a spin) and its bound; it doubles while probes keep missing.
_BACK_OFF_FIRST = 8
_BACK_OFF_MAX = 1024
#: Added to twice the average time a reply took to come while spinning, for the next spin's bound.
_MARGIN_NS = 10_000

_clock = time.perf_counter_ns
_yield = getattr(os, "sched_yield", lambda: None)


class ReplySpin:
    """One waiter's spin state (one per worker process or connection; not thread-safe by
    design: it is used by the one thread that holds the wait, and a lost update only skews an
    estimate)."""

    __slots__ = ("max_ns", "average_ns", "skip", "misses", "back_off", "spins", "hits")

    def __init__(self, max_us: float = _DEFAULT_MAX_US) -> None:
        self.max_ns = int(max_us * 1000)
        self.average_ns = self.max_ns // 2  # the first spins run to the bound
        self.skip = 0  # calls left that wait without spinning
        self.misses = 0  # spins in a row that caught nothing
        self.back_off = _BACK_OFF_FIRST
        self.spins = 0
        self.hits = 0

    def wanted(self) -> bool:
        """Whether this call spins (a call in a back-off does not, and counts the back-off down)."""
        if self.skip:
            self.skip -= 1
            return False
        return True

    def poll(self, poll0: Callable[[Any], list[Any]], zero: Any = 0) -> list[Any]:
        """Call ``poll0(zero)`` (a poll or epoll set's ``poll`` with no wait) until it returns
        events or the bound passes; the events, or ``[]`` (then wait as before)."""
        clock = _clock
        started = clock()
        bound = 2 * self.average_ns + _MARGIN_NS
        end = started + (bound if bound < self.max_ns else self.max_ns)
        self.spins += 1
        while True:
            events = poll0(zero)
            if events:
                now = clock()
                self.hits += 1
                self.misses = 0
                self.back_off = _BACK_OFF_FIRST
                self.average_ns += (now - started - self.average_ns) >> 3
                return events
            if clock() >= end:
                break
            _yield()
        self.average_ns += (self.max_ns - self.average_ns) >> 3
        self.misses += 1
        if self.misses >= _MISSES_TO_BACK_OFF:
            self.misses = 0
            self.skip = self.back_off
            self.back_off = min(self.back_off * 2, _BACK_OFF_MAX)
        return []


def _multi_cpu() -> bool:
    try:
        return len(os.sched_getaffinity(0)) > 1
    except (AttributeError, OSError):  # no affinity on this platform: what the machine has
        return (os.cpu_count() or 1) > 1


_OFF = frozenset(("0", "off", "false", "no"))
_ON = frozenset(("1", "on", "true", "yes"))


def reply_spin(*, on_by_default: bool = True) -> ReplySpin | None:
    """A spin for one waiter, or ``None`` where it is off: confined to one CPU now, turned off
    (``CASTOR_REPLY_SPIN=0``; ``CASTOR_REPLY_SPIN_US``, the bound in microseconds, 0 turns it off),
    or, for a waiter made with ``on_by_default=False``, not turned on (``CASTOR_REPLY_SPIN=1``).

    Which waiters spin by default is measured, not assumed: a ``castor.client`` caller of a server
    in another process does; the Icarus worker call does not (with the spin, the call through
    ``IcarusWorkerActor`` unpinned read 1.18-1.23 of its raw child against 1.11-1.15 without, in
    four pairs of runs alternated: docs/performance.md, "The worker's reply spin made opt-in")."""
    setting = os.environ.get("CASTOR_REPLY_SPIN", "").strip().lower()
    if setting in _OFF or (not on_by_default and setting not in _ON):
        return None
    try:
        max_us = float(os.environ.get("CASTOR_REPLY_SPIN_US", _DEFAULT_MAX_US))
    except ValueError:
        max_us = _DEFAULT_MAX_US
    if not max_us > 0 or not _multi_cpu():
        return None
    return ReplySpin(min(max_us, 1000.0))
