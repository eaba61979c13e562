"""Fuzz: thousands of hostile frames on one connection while a good client is served correctly.

Two kinds of hostile input:

* *resyncable* — well-formed msgpack values of every wrong shape, unknown
  methods, bad params, random msgids — all on ONE persistent connection that
  must stay open and answer every request that carries a valid msgid
  exactly once;
* *destructive* — random bytes, truncated frames, over-limit maps and
  strings, deep nesting — each on its own connection, which must end (answered
  or closed) without hanging.

Throughout, a well-behaved client on another connection checks every answer.
"""

from __future__ import annotations

import itertools
import random
import socket
import threading
import time

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from castor.client import Client
from castor.endpoint import ConnectionSettings, FrameLimits, Server
from tests.support.waiting import poll_until

from .conftest import Gates, RawPeer, build_dispatcher

LIMITS = FrameLimits(max_map_len=256, max_array_len=256, max_str_len=4096, max_bin_len=4096,
                     max_buffer_size=64 * 1024)
ALLOWED_CODES = {"invalid_frame", "invalid_params", "unknown_method", "not_found", "internal", "mailbox_full"}

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=False),
                    st.text(max_size=20), st.binary(max_size=20))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
methods = st.one_of(st.sampled_from(["echo", "add", "fail", "boom", "nope", "runtime.hello", "", "error"]),
                    st.text(max_size=12), values)
params = st.one_of(
    st.builds(lambda d: [d], st.dictionaries(st.text(max_size=6), values, max_size=4)),
    st.just([{"a": 1, "b": 2}]), st.just([{"a": "x"}]), st.just([]), values)

# ("request", method, params): the test assigns a fresh valid msgid and expects exactly one answer.
requests = st.tuples(st.just("request"), methods, params)
# Anything else: a value that is not a valid request (wrong msgid, wrong arity, other frame types).
others = st.one_of(
    values,
    st.builds(lambda m, p: [2, m, p], methods, params),
    st.builds(lambda i, e, r: [1, i, e, r], st.integers(0, 2**32 - 1), values, values),
    st.builds(lambda i, m, p: [0, i, m, p], st.one_of(st.integers(2**32, 2**40), st.integers(-9, -1),
                                                      st.text(max_size=3), st.none()), methods, params),
    st.lists(values, min_size=0, max_size=6),
).map(lambda v: ("other", v))
frames = st.lists(st.one_of(requests, others), min_size=5, max_size=40)

destructive = st.one_of(
    st.binary(min_size=1, max_size=300),
    st.builds(lambda v, cut: msgpack.packb([0, 1, "echo", [v]])[:cut], values, st.integers(1, 40)),
    st.builds(lambda n: msgpack.packb([0, 1, "echo", [{str(i): i for i in range(n)}]]), st.integers(257, 2000)),
    st.builds(lambda n: msgpack.packb([0, 1, "echo", [{"s": "x" * n}]]), st.integers(4097, 70000)),
    st.builds(lambda d: b"\x91" * d + b"\xc0", st.integers(100, 5000)),  # deep nesting
    st.builds(
        lambda k: msgpack.packb({k: 1}), st.integers(min_value=-(2**63), max_value=2**64 - 1)
    ),  # non-string map key
)


class GoodClient(threading.Thread):
    """Calls echo with fresh values and checks every single answer."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.client = Client.connect_unix(address, default_timeout=10)
        self.stop_flag = threading.Event()
        self.calls = 0
        self.failures: list[str] = []

    def run(self) -> None:
        rng = random.Random(7)
        while not self.stop_flag.is_set():
            payload = {"i": self.calls, "s": "".join(rng.choice("abcé€") for _ in range(rng.randint(0, 30)))}
            try:
                answer = self.client.call("echo", payload, timeout=10)
                if answer != payload:
                    self.failures.append(f"wrong answer {answer!r} for {payload!r}")
                if self.client.call("add", {"a": self.calls, "b": 1}, timeout=10) != self.calls + 1:
                    self.failures.append("wrong add")
            except Exception as exc:  # any error on the good connection is a failure
                self.failures.append(repr(exc))
            self.calls += 1


@pytest.fixture
def fuzz_server(sock_dir):
    srv = Server(build_dispatcher(Gates()), unix_path=f"{sock_dir}/f.sock",
                 settings=ConnectionSettings(frame_limits=LIMITS, max_in_flight=4096)).start()
    yield srv
    srv.stop()


@pytest.mark.timeout(120)
def test_fuzz_hostile_connection_never_disturbs_a_good_one(fuzz_server: Server) -> None:
    good = GoodClient(fuzz_server.address)
    good.start()
    persistent = RawPeer(fuzz_server.address)
    msgids = itertools.count(1)
    expected: set[int] = set()
    answered: dict[int, int] = {}
    sent = {"frames": 0, "destructive": 0}

    def drain(timeout: float) -> None:
        while True:
            try:
                frame = persistent.read(timeout)
            except TimeoutError:
                return
            assert isinstance(frame, list) and frame[0] in (1, 2), frame
            if frame[0] == 1:
                assert frame[2] is None or frame[2]["code"] in ALLOWED_CODES, frame
                answered[frame[1]] = answered.get(frame[1], 0) + 1
            else:
                assert frame[1] == "error" and frame[2][0]["code"] in ALLOWED_CODES, frame
            timeout = 0.001

    @settings(max_examples=250, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(batch=frames)
    def resyncable(batch) -> None:
        out = []
        for kind, *rest in batch:
            if kind == "request":
                msgid = next(msgids)
                expected.add(msgid)
                out.append(msgpack.packb([0, msgid, rest[0], rest[1]], use_bin_type=True))
            else:
                out.append(msgpack.packb(rest[0], use_bin_type=True))
        persistent.send(b"".join(out))
        sent["frames"] += len(out)
        drain(0.001)

    @settings(max_examples=80, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(payload=destructive)
    def hostile(payload: bytes) -> None:
        peer = RawPeer(fuzz_server.address)
        try:
            peer.send(payload + msgpack.packb([0, 999, "echo", [{"after": True}]]))
            peer.sock.shutdown(socket.SHUT_WR)
            got = peer.read_until_eof(timeout=10)  # TimeoutError here = the server hung
        except (BrokenPipeError, ConnectionResetError):
            got = []  # the server closed first: allowed for undecodable input
        finally:
            peer.close()
        sent["destructive"] += 1
        for frame in got:
            assert frame[0] in (1, 2)

    resyncable()
    hostile()
    drain(0.2)
    assert poll_until(lambda: (drain(0.01), set(answered) >= expected)[1], timeout=10), \
        f"{len(expected - set(answered))} requests never answered"
    assert all(count == 1 for count in answered.values())
    assert set(answered) == expected  # no answers for msgids we did not send

    good.stop_flag.set()
    good.join(15)
    assert good.failures == []
    assert good.calls >= 20, "the good client was starved"
    assert sent["frames"] >= 1000
    # The persistent hostile connection is still usable, and nothing leaked.
    persistent.send_value([0, 0, "echo", [{"end": 1}]])
    deadline = time.monotonic() + 5
    while True:
        frame = persistent.read(max(0.01, deadline - time.monotonic()))
        if frame[0] == 1 and frame[1] == 0:
            assert frame[3] == {"end": 1}
            break
    persistent.close()
    good.client.close()
    assert poll_until(lambda: fuzz_server.connections() == [], timeout=5)
