"""A utility command's lease on the cluster: its guard, its renewal and the caller's fence (no Ray needed).

A command runs on a cluster node only while its task keeps renewing its lease; a node cut off from
the cluster cannot, and its guard kills the command once the lease has lapsed. The caller runs the
command again elsewhere only after the lease (and a margin) has passed since it saw the node dead.
The end-to-end proofs, on a real cluster with a node cut off, are in ``test_ray_backend.py``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from castor.ports.utility_runner import RUN_DIR_ENV, VISIT_ID_ENV
from castor.scaleout import utility_tasks
from castor.scaleout.utility_tasks import CommandGuard, CommandLease, NodeWatch

pytestmark = pytest.mark.timeout(60)


def _command(tmp_path: Path) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """A command as a task starts one: in a session of its own, its visit id in its environment."""
    tags = {VISIT_ID_ENV: f"lease-test-{uuid.uuid4().hex}", RUN_DIR_ENV: str(tmp_path)}
    proc = subprocess.Popen(["sleep", "60"], env={**os.environ, **tags}, start_new_session=True)
    return proc, tags


@contextlib.contextmanager
def _guarded_command(tmp_path: Path, lease_s: float) -> Iterator[tuple[subprocess.Popen[bytes], CommandGuard]]:
    """A :func:`_command` and its :class:`CommandGuard` with a lease of ``lease_s``; afterwards the
    guard released and the command, if it still runs, killed and reaped."""
    proc, tags = _command(tmp_path)
    guard = CommandGuard(tags, lease_s)
    try:
        yield proc, guard
    finally:
        guard.release()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _lives_for(proc: subprocess.Popen[bytes], seconds: float) -> bool:
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return True
    return False


def test_a_guard_kills_its_command_once_the_lease_lapses_and_not_while_it_is_renewed(tmp_path: Path) -> None:
    lease_s = 1.0
    with _guarded_command(tmp_path, lease_s) as (proc, guard):
        guard.renewed(time.monotonic())
        guard.watch(proc.pid)
        for _ in range(10):  # two leases' worth, renewed every 0.2 s: it lives
            guard.renewed(time.monotonic())
            assert _lives_for(proc, 0.2)
        last = time.monotonic()
        guard.renewed(last)  # the last renewal: its lease runs out at last + lease_s
        proc.wait(timeout=10)
        died = time.monotonic()
        assert proc.returncode == -9, proc.returncode
        assert died - last >= lease_s, died - last  # never before the lease has lapsed
        assert died - last < lease_s + 2.0, died - last


def test_a_renewal_dated_earlier_never_moves_the_lease_back_and_end_now_kills_at_once(tmp_path: Path) -> None:
    with _guarded_command(tmp_path, 30.0) as (proc, guard):
        now = time.monotonic()
        guard.renewed(now)
        guard.watch(proc.pid)
        guard.renewed(now - 60.0)  # a late line about an older renewal: the lease still runs from `now`
        assert _lives_for(proc, 0.5)
        started = time.monotonic()
        guard.end_now()  # the cluster said the node is dead
        proc.wait(timeout=10)
        assert proc.returncode == -9 and time.monotonic() - started < 5.0


def test_a_released_guard_leaves_its_command_alone(tmp_path: Path) -> None:
    proc, tags = _command(tmp_path)
    guard = CommandGuard(tags, 0.3)
    try:
        guard.renewed(time.monotonic())
        guard.watch(proc.pid)
        guard.release()  # the task ended as it should: the lease no longer matters
        guard.renewed(time.monotonic())  # after the release: ignored (the pipe's number may be another file's)
        assert _lives_for(proc, 1.0)
    finally:
        proc.kill()
        proc.wait()


def test_a_command_whose_task_is_interrupted_twice_is_still_ended_by_its_guard(tmp_path: Path) -> None:
    """``ray.cancel`` is a ``KeyboardInterrupt`` in the task; a cast host ending itself cancels its
    commands more than once (its own kill, then its runtime's stop). The second one landed inside
    the first one's kill: the task left with the command running and released its guard as if it
    had ended as it should -- the command ran on to its end, holding no lease, beside the recast's
    copy on another host. Now the guard is told to kill it first and is never released with it
    alive, and the task's own kill is retried until it is done."""
    with _guarded_command(tmp_path, 30.0) as (proc, guard):
        guard.renewed(time.monotonic())
        guard.watch(proc.pid)
        interrupts = [KeyboardInterrupt(), KeyboardInterrupt()]

        class _Interrupted:
            def kill(self) -> None:
                if interrupts:
                    raise interrupts.pop()  # another cancel, landing inside this kill

            def wait(self) -> None:
                return None

        utility_tasks.end_for_sure(_Interrupted(), guard)
        assert interrupts == []
        guard.release()  # what the task's outer code may still do: changes nothing now
        proc.wait(timeout=10)
        assert proc.returncode == -9, proc.returncode


class _Guard:
    def __init__(self) -> None:
        self.said: list[tuple[str, float | None]] = []

    def renewed(self, at: float) -> None:
        self.said.append(("renewed", at))

    def end_now(self) -> None:
        self.said.append(("end_now", None))


def test_a_renewal_counts_from_when_it_was_asked_not_from_when_the_answer_came(monkeypatch) -> None:
    """An answer that took long still proves only that the node was alive when the question was
    sent: the lease runs from then, so it never outlasts the cluster's declaration of its death."""
    slow = threading.Event()

    def node_alive(node_id: str, timeout_s: float) -> bool:
        slow.wait(0.3)
        return True

    monkeypatch.setattr(utility_tasks, "_node_alive", node_alive)
    guard = _Guard()
    lease = CommandLease("a" * 56, 5.0, guard)  # type: ignore[arg-type]
    asked = time.monotonic()
    assert lease.renew()
    assert lease.last is not None and asked <= lease.last < asked + 0.1, (asked, lease.last)
    assert guard.said == [("renewed", lease.last)]


@pytest.mark.parametrize(("answer", "why"), [(False, "declared node"), (None, "could not reach the cluster")])
def test_a_lease_not_renewed_ends_the_command(monkeypatch, answer: bool | None, why: str) -> None:
    """The cluster says the node is dead (False): the command is ended at the next renewal. It
    cannot be asked (None: the node cut off): the command is ended once the lease has lapsed."""
    monkeypatch.setattr(utility_tasks, "_node_alive", lambda node_id, timeout_s: answer)
    guard = _Guard()
    lease = CommandLease("b" * 56, 0.5, guard)  # type: ignore[arg-type]
    lease.last = time.monotonic()
    killed = threading.Event()
    running = SimpleNamespace(kill=killed.set)
    started = time.monotonic()
    lease.keep(running, threading.Event())  # returns once it has ended the command
    assert killed.is_set() and ("end_now", None) in guard.said
    assert lease.lost is not None and why in lease.lost, lease.lost
    assert lease.lapsed()
    if answer is None:
        assert time.monotonic() - started >= 0.5 - 0.05


@pytest.mark.parametrize(("held", "ended"), [(False, True), (None, False), (True, False)])
def test_a_command_of_a_host_whose_grant_is_revoked_is_ended_at_its_next_renewal(monkeypatch, held: bool | None,
                                                                                 ended: bool) -> None:
    """The serving process took the command's cast host for lost and revoked its grant (False):
    the command is ended at once, its node alive or not. The grant cannot be read (None): the
    lease is not renewed (it lapses as for a node cut off). Held (True): renewed."""
    monkeypatch.setattr(utility_tasks, "_node_alive", lambda node_id, timeout_s: True)
    monkeypatch.setattr(utility_tasks, "grant_held", lambda grant, timeout_s: held)
    guard = _Guard()
    lease = CommandLease("c" * 56, 5.0, guard, grant="host-1-abc")  # type: ignore[arg-type]
    assert lease.renew() is (held is True)
    assert (lease.lost is not None and "grant was revoked" in lease.lost) is ended, lease.lost
    killed = threading.Event()
    if ended:  # keep() ends it at its first renewal, long before the lease would lapse
        lease.last = time.monotonic()
        lease.period_s = 0.05
        lease.keep(SimpleNamespace(kill=killed.set), threading.Event())
        assert killed.is_set() and ("end_now", None) in guard.said


def _watch(dead: dict[str, float]) -> NodeWatch:
    watch = NodeWatch()
    watch.dead_since = lambda fresh=False: dict(dead)  # type: ignore[method-assign]
    return watch


def test_the_caller_takes_a_command_for_lost_only_once_its_lease_has_lapsed_since_its_node_died() -> None:
    now = time.monotonic()
    watch = _watch({"node-b": now - 5.0})
    fence_s = 8.0  # the lease and its margin
    assert watch.stalled_by("node-b", now - 20.0, fence_s) is None  # dead 5 s: its copy may still run
    assert watch.fenced_until("node-b", now - 20.0, fence_s) == pytest.approx(now + 3.0)
    assert watch.stalled_by("node-a", now - 20.0, fence_s) is None  # another node: nothing to wait for
    assert watch.fenced_until("node-a", now - 20.0, fence_s) is None
    # not known to have started: any node that died since it was submitted may run it
    assert watch.fenced_until(None, now - 20.0, fence_s) == pytest.approx(now + 3.0)
    assert watch.fenced_until(None, now - 1.0, fence_s) is None  # submitted after that death
    watch = _watch({"node-b": now - 9.0})
    assert watch.stalled_by("node-b", now - 20.0, fence_s) == "its node node-b died"
    assert watch.stalled_by(None, now - 20.0, fence_s) == "not started when node node-b died"


def test_a_failed_task_on_a_dead_node_is_taken_for_lost_only_after_the_fence() -> None:
    """Ray fails a task the moment its node is declared dead; a node only cut off runs the command
    on. The caller now waits out the command's lease before it reports the work lost (and the
    cast runs it again)."""
    from castor.adapters.materia.process_runner import UtilityCommand

    cmd = UtilityCommand(argv=["true"], cwd=Path("."), timeout_ms=1000, max_output_bytes=1024)
    seen_dead = time.monotonic()
    running = utility_tasks.RemoteRunningUtility(cmd, None, _watch({"node-b": seen_dead}), lease_s=0.5)
    running.started_on = "node-b"
    why = running._fenced("NodeDiedError")
    waited = time.monotonic() - seen_dead
    assert waited >= 0.5 + utility_tasks.LEASE_MARGIN_S - 0.05, waited
    assert why.startswith("NodeDiedError; its node died"), why
    # its node alive (the worker was killed there: its guard ended the command at once): no wait
    running = utility_tasks.RemoteRunningUtility(cmd, None, _watch({}), lease_s=0.5)
    running.started_on = "node-a"
    started = time.monotonic()
    assert running._fenced("WorkerCrashedError") == "WorkerCrashedError"
    assert time.monotonic() - started < 0.5


def test_a_lost_host_s_casts_run_no_command_before_the_lease_whether_or_not_its_node_is_dead() -> None:
    """A lost host's grant is revoked when it is taken for lost; the commands it started, on any
    node, end at their next renewal or once their lease lapses (a node cut off cannot ask). Its
    casts are recast at once, and their new host is told to start none of their commands before
    then -- also when the lost host's node lives: a host stopped (SIGSTOP) or cut off alone may run
    again, and its commands on live nodes ran on beside the recast's (before, such a host's casts
    ran their commands at once)."""
    pytest.importorskip("ray")
    from castor.scaleout.ray_backend import HostRef, RayBackend, RayBackendSettings

    def recast(node_alive: bool) -> tuple[float, list[tuple[list[str], float]]]:
        backend = RayBackend.__new__(RayBackend)
        backend._ray = SimpleNamespace(nodes=lambda: [{"NodeID": "B", "Alive": node_alive}, {"NodeID": "A",
                                                                                            "Alive": True}])
        backend.settings = RayBackendSettings(command_lease_s=0.5, replace_lost_hosts=False)
        backend._lock = threading.RLock()
        backend._closed = threading.Event()
        held: list[tuple[list[str], float]] = []
        live = HostRef("host-1", SimpleNamespace(hold_commands=SimpleNamespace(
            remote=lambda ids, seconds: held.append((list(ids), seconds)))), node_id="A")
        backend.hosts = {"host-1": live}
        backend.recoveries = []
        backend.log = SimpleNamespace(warning=lambda *a, **k: None, error=lambda *a, **k: None,
                                      info=lambda *a, **k: None)
        ctx = SimpleNamespace(harness=SimpleNamespace(agent=None), info=SimpleNamespace(session_id="s0"))
        placed = SimpleNamespace(ctx=ctx, ready=threading.Event(), fenced_until=0.0)
        backend._placed = {"s0": placed}
        backend._place = lambda placed, avoid=None, ready=True: "host-1"  # type: ignore[method-assign]
        backend._casts_left = lambda host, sid: (["c1"], [])  # type: ignore[method-assign]
        backend._get = lambda host, ref, timeout_s=30.0: ref  # type: ignore[method-assign]
        recast: list[float] = []

        def call_on(host: Any, sid: str, verb: str, params: dict[str, Any], timeout_s: float) -> dict[str, Any]:
            assert held, "the hold must come before the recast"
            recast.append(time.monotonic())
            return {}

        backend._call_on = call_on  # type: ignore[method-assign]
        lost = HostRef("host-2", None, node_id="B", alive=False, lost_at=time.monotonic(), grant="host-2-abc")
        backend._recover(lost, ["s0"])
        assert placed.ready.is_set() and len(recast) == 1
        return recast[0] - (lost.lost_at or 0.0), held

    from castor.scaleout.utility_tasks import LEASE_MARGIN_S

    for node_alive in (False, True):
        after, held = recast(node_alive)
        assert after < 0.5, after  # recast at once: callers do not wait out the lease
        assert len(held) == 1 and held[0][0] == ["c1"], held
        assert 0.5 + LEASE_MARGIN_S - 0.5 <= held[0][1] <= 0.5 + LEASE_MARGIN_S, held


def test_a_cast_run_again_by_hand_after_a_lost_host_is_held_as_the_recovery_s_are() -> None:
    """A ``recast`` (or ``continue``, ``revive``) asked for while the session's lost host may
    still run commands: the cast's host is told to hold its commands until then, first; the cast
    named by none is the one ``status`` names. Read-only verbs, and calls after the window, hold
    nothing."""
    pytest.importorskip("ray")
    from castor.scaleout.ray_backend import HostRef, RayBackend, _Placed

    backend = RayBackend.__new__(RayBackend)
    backend._lock = threading.RLock()
    said: list[tuple[str, object]] = []
    host = HostRef("host-1", SimpleNamespace(hold_commands=SimpleNamespace(
        remote=lambda ids, seconds: said.append(("hold", (list(ids), round(seconds)))))))
    backend.host_of = lambda sid, timeout_s: host  # type: ignore[method-assign]
    backend._get = lambda host, ref, timeout_s=30.0: ref  # type: ignore[method-assign]

    def call_on(host: Any, sid: str, verb: str, params: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        said.append((verb, params.get("cast_id")))
        return {"cast_id": "c9"} if verb == "status" else {}

    backend._call_on = call_on  # type: ignore[method-assign]
    backend._placed = {"s1": _Placed(ctx=None, fenced_until=time.monotonic() + 10.0)}
    backend.call("s1", "recast", {"cast_id": "c1"})
    backend.call("s1", "continue", {})
    backend.call("s1", "status", {"cast_id": "c1"})
    assert said == [("hold", (["c1"], 10)), ("recast", "c1"), ("status", None), ("hold", (["c9"], 10)),
                    ("continue", None), ("status", "c1")], said
    said.clear()
    backend._placed["s1"].fenced_until = time.monotonic() - 1.0
    backend.call("s1", "recast", {"cast_id": "c1"})
    assert said == [("recast", "c1")], said


def test_a_pool_starts_no_command_of_a_held_cast_before_its_hold_ends() -> None:
    """A cast recast from a lost host: its commands wait until the lost host's can no longer run;
    another cast's do not; a command cancelled while it waits never starts."""
    from castor.actors.materia.utility_pool import UtilityPoolState

    pool = UtilityPoolState(2, 2)
    pool.hold_commands("c1", time.monotonic() + 0.5)
    assert pool.held_for("c2:Socket-2:1:2") == 0.0 and pool.held_for("c1:Socket-2:1:2") > 0.3
    began = time.monotonic()
    assert pool.wait_until_released("c1:Socket-2:1:2")
    assert time.monotonic() - began >= 0.45
    pool.hold_commands("c1", time.monotonic() + 30.0)
    threading.Timer(0.2, pool.cancel_queued, args=("c1:Socket-2:3:4",)).start()
    began = time.monotonic()
    assert not pool.wait_until_released("c1:Socket-2:3:4")
    assert time.monotonic() - began < 5.0
