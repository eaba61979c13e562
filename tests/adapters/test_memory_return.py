"""MemoryReturn: the allocator is trimmed after work ends, on its own thread, rate-limited."""

from __future__ import annotations

import threading
import time

import psutil
import pytest

from castor.adapters.memory_return import MemoryReturn, glibc_trim, limit_malloc_arenas
from castor.runtime import Runtime, RuntimeSettings

pytestmark = pytest.mark.timeout(30)


class CountingTrim:
    """A stand-in for malloc_trim that records where and when it ran."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, str]] = []
        self.ran = threading.Event()
        self.lock = threading.Lock()

    def __call__(self) -> int:
        with self.lock:
            self.calls.append((time.monotonic(), threading.current_thread().name))
        self.ran.set()
        return 1

    def wait_for(self, count: int, seconds: float = 10.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.calls) >= count:
                    return
            self.ran.wait(0.05)
            self.ran.clear()
        raise AssertionError(f"{len(self.calls)} trims, expected {count}")


def test_work_ended_trims_on_its_own_thread_and_returns_at_once() -> None:
    trim = CountingTrim()
    memory = MemoryReturn(0.05, trim=trim)
    try:
        memory.work_ended()
        trim.wait_for(1)
        assert trim.calls[0][1] == "castor-memory-return"  # never the caller's thread
    finally:
        memory.stop()


def test_trims_are_at_least_the_interval_apart_and_work_meanwhile_gets_the_next() -> None:
    trim = CountingTrim()
    interval = 0.3
    memory = MemoryReturn(interval, trim=trim)
    try:
        memory.work_ended()
        trim.wait_for(1)
        for _ in range(50):  # a burst of closed sessions within one interval
            memory.work_ended()
        trim.wait_for(2)
        first, second = trim.calls[0][0], trim.calls[1][0]
        assert second - first >= interval * 0.99
        trim.ran.clear()
        assert not trim.ran.wait(interval * 2)  # the burst is covered: no third trim without new work
        assert len(trim.calls) == 2
    finally:
        memory.stop()


def test_no_work_no_trim_and_no_thread() -> None:
    trim = CountingTrim()
    memory = MemoryReturn(0.01, trim=trim)
    before = {t.name for t in threading.enumerate()}
    assert "castor-memory-return" not in before
    memory.stop()
    memory.work_ended()  # after stop: nothing
    assert not trim.calls
    assert "castor-memory-return" not in {t.name for t in threading.enumerate()}


def test_disabled_never_starts_a_thread() -> None:
    trim = CountingTrim()
    memory = MemoryReturn(0, trim=trim)
    assert not memory.available
    memory.work_ended()
    assert "castor-memory-return" not in {t.name for t in threading.enumerate()}
    assert not trim.calls


def test_stop_ends_a_thread_waiting_out_its_interval() -> None:
    trim = CountingTrim()
    memory = MemoryReturn(3600, trim=trim)  # the second trim would be an hour away
    memory.work_ended()
    trim.wait_for(1)
    memory.work_ended()
    started = time.monotonic()
    memory.stop(timeout=5)
    assert time.monotonic() - started < 2
    assert "castor-memory-return" not in {t.name for t in threading.enumerate()}
    assert len(trim.calls) == 1


def test_a_failing_trim_ends_the_thread_without_raising_into_callers() -> None:
    def broken() -> int:
        raise OSError("no allocator")

    memory = MemoryReturn(0.01, trim=broken)
    memory.work_ended()
    deadline = time.monotonic() + 5
    while "castor-memory-return" in {t.name for t in threading.enumerate()} and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "castor-memory-return" not in {t.name for t in threading.enumerate()}
    memory.work_ended()  # still never raises
    memory.stop()


def test_the_real_allocator_trim_gives_freed_pages_back() -> None:
    trim = glibc_trim()
    if trim is None:
        pytest.skip("no glibc malloc_trim on this system")
    proc = psutil.Process()
    # Free memory that sits inside a heap (not at its top): glibc keeps those pages until a trim.
    blocks = [bytearray(4000) for _ in range(20_000)]  # ~80 MB
    keep = blocks[-1]  # holds the heap's top: freeing the rest leaves a hole glibc keeps
    del blocks
    before = proc.memory_info().rss
    assert trim() == 1  # memory was released
    after = proc.memory_info().rss
    assert before - after > 40 * 2**20
    assert len(keep) == 4000  # the live block survives


def test_a_runtime_trims_after_a_session_closes_and_stops_the_thread_on_shutdown(tmp_path) -> None:
    from castor.ports.session_component import HarnessLink, SessionInfo

    rt = Runtime(RuntimeSettings(memory_return_interval_s=0.05))
    trim = CountingTrim()
    rt.memory_return._trim = trim  # the real one works too; this one reports when it ran
    try:
        rt.open_session(SessionInfo(session_id="m1", cwd=str(tmp_path)),
                        HarnessLink(agent=None, session_log=None, ui=None))
        assert not trim.calls  # opening is not work that ended
        rt.close_session("m1")
        trim.wait_for(1)
        _counters, histograms = rt.system.registry.meters.collect()
        assert sum(histograms[("memory_trim_seconds", "runtime")][:-1]) >= 1  # /metrics sees it
    finally:
        rt.shutdown(10)
    assert "castor-memory-return" not in {t.name for t in threading.enumerate()}


def test_no_thread_to_spare_disables_it_without_failing_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    import castor.adapters.memory_return as memory_return

    def refuse(*_args: object, **_kwargs: object) -> threading.Thread:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(memory_return, "start_thread", refuse)
    trim = CountingTrim()
    memory = MemoryReturn(0.01, trim=trim)
    memory.work_ended()  # does not raise
    memory.work_ended()  # nor does a second close
    assert not trim.calls
    memory.stop()


def test_a_failing_observer_does_not_end_the_trimming() -> None:
    trim = CountingTrim()

    def broken(_seconds: float) -> None:
        raise ValueError("sink down")

    memory = MemoryReturn(0.01, trim=trim, on_trim=broken)
    try:
        memory.work_ended()
        trim.wait_for(1)
        memory.work_ended()
        trim.wait_for(2)  # still trimming after the observer failed
    finally:
        memory.stop()


# A child that starts eight threads, each allocating once, and prints how many malloc arenas
# glibc's malloc_info reports (one ``<heap nr=...>`` per arena). ARENAS < 0: the allocator's default.
_ARENA_CHILD = r"""
import ctypes, sys, threading
from castor.adapters.memory_return import limit_malloc_arenas
arenas = int(sys.argv[1])
if arenas >= 0:
    assert limit_malloc_arenas(arenas) is True
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
go = threading.Barrier(8)
def allocate():
    go.wait()
    libc.malloc(4096)  # kept: the thread's arena stays in use
threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
libc.open_memstream.restype = ctypes.c_void_p
buf, size = ctypes.c_char_p(), ctypes.c_size_t()
stream = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
libc.malloc_info(0, ctypes.c_void_p(stream))
libc.fclose(ctypes.c_void_p(stream))
print(buf.value.decode().count("<heap nr="))
"""


def _arenas_in_a_child(arenas: int) -> int:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _ARENA_CHILD, str(arenas)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def test_limit_malloc_arenas_keeps_threads_in_one_arena() -> None:
    """The setting is real: eight threads that each allocate get arenas of their own by default
    (glibc makes up to eight per CPU), and one arena between them all once limited to one."""
    if glibc_trim() is None:
        pytest.skip("not glibc")
    assert _arenas_in_a_child(-1) > 1
    assert _arenas_in_a_child(1) == 1
    assert limit_malloc_arenas(0) is False  # 0: nothing changed


def test_a_runtime_limits_the_arenas_before_its_threads_start(monkeypatch: pytest.MonkeyPatch) -> None:
    import castor.runtime as runtime_module

    seen: list[tuple[int, int]] = []
    monkeypatch.setattr(runtime_module, "limit_malloc_arenas",
                        lambda n: seen.append((n, threading.active_count())) or True)
    before = threading.active_count()
    rt = Runtime(RuntimeSettings(malloc_arenas=3), components=[])
    try:
        assert seen == [(3, before)]  # asked once, with the setting, before the runtime's first thread
        assert RuntimeSettings().malloc_arenas == 1
    finally:
        rt.shutdown(10)
