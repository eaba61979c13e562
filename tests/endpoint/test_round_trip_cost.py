"""What one echo round trip costs in Python calls, on each side: a budget, so that a change that adds
work to every frame is seen (docs/performance.md, the endpoint section).

Counted with a profile hook on the caller's thread and on the server's reading threads (Python
functions and built-ins alike), one window per call, the median over the calls: a window that a
hand-off or the watchdog stretched does not move it. A lock section is counted neither way (see
``_LOCK_CALLS``). The budgets are the counts of 2026-12-08, the small-hours stop (server 13, client 15
on CPython 3.11, since both sides write a frame with the socket's own ``send`` in their own frame,
not through the transport's ``send_nowait``, a client without a token calls its connection's
``call`` directly, and the caller's pending call is made by a type call, no ``object.__new__``)
with one call of slack. Before them: server 14, client
18 (2026-12-07, the evening stop), since both sides read the socket in their own frame, the caller
writes its request in its own, and the server's worker takes a request's four lock sections by
acquire-then-try (the code before it reads 19 and 20 counted so). Before those: server 19, client
20, since a caller that finds the reader role free makes its whole call in one frame, a request's
context and dispatch cost a call less each, and each side packs its frame in its own frame; 23 and
25 before, since a server worker takes a request that a read brings whole in one step and answers
it with one write, and ends it in one lock section; 29 and 26 before, since a caller takes an
answer that a read brings whole in one step; 29 and 31 before that, 35 and 35 before that.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

from castor.client import Client
from castor.endpoint import Dispatcher, Server

SERVER_CALLS_PER_ROUND_TRIP = 14
CLIENT_CALLS_PER_ROUND_TRIP = 16
CALLS = 300
_LOCK = type(threading.Lock())
#: A lock section costs no call the hook sees when written ``with lock:`` (the statement's
#: ``__enter__``/``__exit__`` raise no profile event) and two when written ``lock.acquire()`` /
#: ``try: ... finally: lock.release()`` (the cheaper form a connection's worker threads use:
#: tests/endpoint/test_lock_sections.py). Neither is counted, so the budget reads the same work
#: whichever form a section takes.
_LOCK_CALLS = ("acquire", "release")


class _Counts:
    """Python and built-in calls per thread kind while ``counting`` is set."""

    def __init__(self) -> None:
        self.counting = False
        self.server = 0
        self.client = 0
        self.caller = threading.get_ident()

    def hook(self, _frame: FrameType, event: str, arg: Any) -> None:
        if not self.counting or (event != "call" and event != "c_call"):
            return
        if event == "c_call" and type(getattr(arg, "__self__", None)) is _LOCK and arg.__name__ in _LOCK_CALLS:
            return  # a lock section, counted neither way: see _LOCK_CALLS
        if threading.get_ident() == self.caller:
            self.client += 1
        elif threading.current_thread().name.startswith("castor-unix-"):
            self.server += 1


@pytest.fixture
def echo() -> Iterator[tuple[Client, _Counts]]:
    counts = _Counts()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "castor.sock")
        dispatcher = Dispatcher()
        dispatcher.register("echo", lambda params, _ctx: params)
        threading.setprofile(counts.hook)  # every thread started from here on: the server's too
        try:
            server = Server(dispatcher, unix_path=path).start()
            client = Client.connect_unix(path)
            try:
                yield client, counts
            finally:
                client.close()
                server.stop()
        finally:
            threading.setprofile(None)  # type: ignore[arg-type]  # None removes the hook


@pytest.mark.timeout(60)
def test_an_echo_round_trip_stays_within_its_python_call_budget(echo: tuple[Client, _Counts]) -> None:
    client, counts = echo
    params = {"text": "ping", "n": 1}
    for _ in range(100):  # warm: the server's threads exist, the watchdog runs
        client.call("echo", params)
    server_calls: list[int] = []
    client_calls: list[int] = []
    sys.setprofile(counts.hook)
    try:
        for _ in range(CALLS):
            counts.server = counts.client = 0
            counts.counting = True
            client.call("echo", params)
            counts.counting = False
            server_calls.append(counts.server)
            client_calls.append(counts.client)
    finally:
        counts.counting = False
        sys.setprofile(None)
    server, calls = statistics.median(server_calls), statistics.median(client_calls)
    assert server <= SERVER_CALLS_PER_ROUND_TRIP, f"the server's side of an echo costs {server} calls"
    assert calls <= CLIENT_CALLS_PER_ROUND_TRIP, f"the client's side of an echo costs {calls} calls"
