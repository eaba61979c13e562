"""Give the allocator's free pages back to the system after work ends.

A long-lived server's resident memory is mostly what glibc's allocator keeps, not live objects:
the threads that ran a session's casts leave free but touched pages in their malloc arenas, and
glibc only gives back what sits at the top of a heap. Measured over thousands of casts, the live
Python data stays flat while the resident size creeps up by a few hundred kilobytes per thousand
casts and does not come down when the server goes idle (docs/performance.md, "Giving free pages
back").
``malloc_trim(0)`` hands every whole free page of every arena back to the kernel (it stays
mapped; touching it again faults in a zero page), which is what "comes back when idle" means for
an operator reading RSS.

:class:`MemoryReturn` runs that trim on its own thread, after work has ended
(:meth:`MemoryReturn.work_ended`: the runtime calls it when a session closes), at most once per
``min_interval_s``. Guarantees:

* **Never on a caller's thread.** ``work_ended`` sets a flag and returns; the trim (it walks the
  arenas' free lists: under 0.1 ms in a 50 MB castor process, 15-23 ms for a 550 MB heap of freed
  small blocks, on these machines) runs on the ``castor-memory-return`` thread, started on the first ``work_ended``.
* **Rate-limited.** Two trims are at least ``min_interval_s`` apart; work that ends meanwhile is
  covered by the next one. ``min_interval_s <= 0`` disables it (no thread is ever started).
* **No allocator, no-op.** Where there is no glibc ``malloc_trim`` (musl, macOS) ``available`` is
  False and nothing runs; this changes no behaviour, only how much idle memory the process holds.
* **Stops.** :meth:`stop` ends the thread (joined, bounded); a later ``work_ended`` does nothing.
* **Never fails the caller.** A thread that cannot be started disables the trim (logged once); a
  failing trim ends the thread (logged); ``work_ended`` itself never raises.

What it does not do: free live objects (nothing is dropped that is still referenced) or bound
the heap; a process that keeps more live data still grows.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time
from collections.abc import Callable

from castor._log import logger
from castor.ports.session_component import DEFAULT_MEMORY_RETURN_S
from castor.supervision.threads import start_thread


@functools.cache
def glibc_trim() -> Callable[[], int] | None:
    """``malloc_trim(0)`` of the C library this process runs on, or None where there is none.

    Looked up once per process, among the symbols the running program already has loaded
    (``dlopen(NULL)``: no library search, no ``ldconfig`` run)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: int(trim(0))


#: glibc's ``mallopt`` parameter for the most malloc arenas (``M_ARENA_MAX`` in ``malloc.h``).
_M_ARENA_MAX = -8


def limit_malloc_arenas(arenas: int) -> bool:
    """Ask glibc to make at most ``arenas`` malloc arenas in this process (``mallopt(M_ARENA_MAX)``);
    ``True`` if it took the setting. ``arenas <= 0`` or a C library without ``mallopt`` (musl,
    macOS): nothing is changed, ``False``.

    Why: glibc gives the threads that allocate arenas of their own, up to eight per CPU, and
    memory freed inside one arena serves only the threads attached to it. castor runs hundreds of
    actor threads, and almost all their allocations are made holding the interpreter lock, one
    thread at a time, so per-thread arenas buy no parallelism -- only memory left free in one arena
    while another grows. With one arena, 1,000 concurrent casts
    peak at about 55 KiB of resident memory each instead of about 64 (docs/performance.md).

    Process-wide and not undone (arenas made before the call stay); the runtime applies it at
    construction, before its threads start (``RuntimeSettings.malloc_arenas``).
    """
    if arenas <= 0:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, arenas))


class MemoryReturn:
    """Trims the allocator on a background thread after work ends, rate-limited (module doc)."""

    def __init__(self, min_interval_s: float = DEFAULT_MEMORY_RETURN_S, *,
                 trim: Callable[[], int] | None = None, owner: str = "/runtime",
                 on_trim: Callable[[float], None] | None = None) -> None:
        self.min_interval_s = min_interval_s
        self._trim = trim  # None: the C library's (glibc_trim, looked up when work first ends, not at start-up)
        self._owner = owner
        self._on_trim = on_trim  # told each trim's duration (seconds), on the trimming thread
        self._lock = threading.Lock()
        self._wake = threading.Event()  # work ended since the last trim
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        """Whether a trim can run here (an allocator that has one, and not disabled)."""
        return self.min_interval_s > 0 and self._trimmer() is not None

    def _trimmer(self) -> Callable[[], int] | None:
        return self._trim if self._trim is not None else glibc_trim()

    def work_ended(self) -> None:
        """Some work ended (a session closed): trim soon, on the trimming thread. Never blocks."""
        if not self.available:
            return
        with self._lock:
            if self._stop.is_set():
                return
            if self._thread is None:
                try:
                    self._thread = start_thread(self._run, name="castor-memory-return", owner=self._owner,
                                                purpose="give the allocator's free pages back after work ends")
                except RuntimeError as exc:  # no thread to spare: the caller's work is not affected
                    self._stop.set()
                    logger.warning("memory return disabled: cannot start its thread ({exc})", exc=exc)
                    return
        self._wake.set()

    def stop(self, timeout: float = 2.0) -> None:
        """End the trimming thread (joined, at most ``timeout`` seconds); idempotent."""
        with self._lock:
            self._stop.set()
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        trim = self._trimmer()
        assert trim is not None  # started only when available
        last = float("-inf")
        while True:
            self._wake.wait()
            rest = last + self.min_interval_s - time.monotonic()
            if (rest > 0 and self._stop.wait(rest)) or self._stop.is_set():
                return
            self._wake.clear()  # work that ends from here on gets the next trim
            started = time.monotonic()
            try:
                trim()
            except Exception:  # noqa: BLE001 - an allocator call must not end the server
                logger.opt(exception=True).warning("malloc_trim failed; idle memory is no longer returned")
                return
            last = time.monotonic()
            if self._on_trim is not None:
                try:
                    self._on_trim(last - started)
                except Exception:  # noqa: BLE001 - a metrics sink must not end the trimming
                    logger.opt(exception=True).debug("memory return: the trim observer failed")
