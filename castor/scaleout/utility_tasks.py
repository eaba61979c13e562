"""Utility commands as Ray tasks: a command runs on a node that has the CPUs its socket declares.

A cast host's utility pool keeps its slots, its ledger and its rules (one outcome per visit id,
``CASTOR_VISIT_ID`` in the command's environment, cancel kills the tree); only the place where
the process starts changes. :class:`RayUtilityRunner.spawn` submits one task per dispatch:

| rule | how |
|---|---|
| where | ``num_cpus`` = the socket's ``resources.cpus`` (default 1): Ray schedules the task on a node with that many free CPUs; a command waits in Ray's queue until one has them |
| at most once per dispatch | ``max_retries=0``: Ray never runs a task again (a lost node loses the dispatch; the cast re-dispatches under a **new** visit id, as after a slot crash) |
| cancel / kill | ``ray.cancel`` (not forced): the task's thread gets ``KeyboardInterrupt`` and kills the command's whole tree before it ends, its guard told first (:func:`end_for_sure`: a second cancel inside the first one's kill cannot leave it running); a cancel that cannot reach the node (cut off) changes nothing: the lease rule below ends the command, and the answers' stream is read a second at a time (:meth:`RemoteRunningUtility._next_answer`), so the caller still takes it for lost |
| a node or worker lost mid-command | the task fails with a Ray error: reported as lost work (``WorkLost``), never as the command's result |
| a node dies while a command waits | the task says where it started (its first streamed answer); a command started on a node seen dead the command's lease and ``LEASE_MARGIN_S`` ago, or not known to have started that long after a node died (Ray may have sent its lease request to that node, and it is then never answered; or it started there and its answer never came), is cancelled and reported as lost work; commands submitted after a node death ask for a CPU amount no earlier one did (:func:`fresh_kind`), so Ray leases them afresh instead of queueing them behind a lease request that dead node never answers |
| the task's worker dies under the command (``kill -9``, the OOM killer) or its node's raylet dies | the command runs in a session of its own, so it would outlive both: a :class:`CommandGuard` process (started first, it learns of the worker's death from a pipe only the worker holds) kills the command's group and every process carrying its visit id; the task's own thread kills it once its parent, the raylet, is gone. The cast hears lost work |
| the cast host that started it is taken for lost (its grant revoked, its key deleted: ``castor.scaleout.host``) | the task checks the grant before the command starts and at every lease renewal: revoked, the command is ended (never started) |
| its node is cut off from the cluster (a partition, a hung raylet): the node runs on, the cluster declares it dead, Ray fails the task | the command holds a lease (:class:`CommandLease`): its task renews it while the GCS answers that the node is alive; its guard kills it once the lease is ``lease_s`` old, or when the GCS says the node is dead. A failed task whose node is dead (or, not known to have started, any node that died since) is reported lost only ``lease_s`` + ``LEASE_MARGIN_S`` after this process saw that node dead, so no two copies ever run at once |
| the command cannot start | ``spawn_error`` as for a local command |
| no live node has the CPUs it asks for | ``spawn_error`` at once (Ray would hold the task as infeasible for ever); an autoscaler's node types that do not run yet are not counted |

What it does not do: move the project's files — every node must see the project at the same
path (see docs/scale-out.md).
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from castor.adapters.materia.process_runner import UtilityCommand, UtilityResult, UtilitySpawnError
from castor.supervision.threads import start_thread

DEFAULT_CPUS = 1.0
CPU_STEP = 0.0001  # the finest CPU figure Ray counts
WATCH_S = 1.0  # how often a waiting command looks at the cluster's nodes
COMMAND_LEASE_S = 15.0
"""T, the lease of a running command (``RayBackendSettings.command_lease_s``): its task renews it
while the cluster's control plane (the GCS) answers that the command's node is alive; the
command's guard kills the command once it has gone ``T`` without a renewal, and kills it at once
when the GCS says the node is dead."""
LEASE_MARGIN_S = 3.0
"""How much longer than ``T`` the caller waits, after it first saw a command's node dead, before
it takes the command for lost: the guard's kill itself takes a moment."""
GUARD_START_S = 10.0  # how long a command's guard may take to start before the command is refused
RAYLET_WATCH_S = 0.5  # how often a running command's task looks whether its node's raylet still lives
GRANT_NAMESPACE = b"castor"
"""Where, in the cluster's key-value store (the GCS's), the serving process keeps each live cast
host's grant (:func:`grant_key`) and revokes it by deleting it."""
GRANT_KEY_PREFIX = b"grant:"  # how every grant's key begins (grant_key): what a sweep of them lists
_HOLDER_PREFIX = b"job:"  # how a grant key's value names its holder (grant_holder)
NODE_ID_ENV = "CASTOR_NODE_ID"  # in the command's environment: the Ray node it runs on


def _run_on_node(cmd_map: dict[str, Any], lease_s: float = COMMAND_LEASE_S,
                 grant: str | None = None) -> Iterator[dict[str, Any]]:
    """The task body (a streaming generator): first where it started, then the command's answer
    (or ``lost``: its lease lapsed, or the grant of the cast host that started it was revoked,
    and its guard killed it); kills the command's tree if cancelled, and a guard kills it if the
    task's worker dies or its lease lapses. A command whose host's grant is revoked never starts."""
    import ray

    from castor.adapters.materia.process_runner import spawn

    node_id = ray.get_runtime_context().get_node_id()
    yield {"started_on": node_id}
    cmd = UtilityCommand.model_validate(cmd_map)
    cmd = cmd.model_copy(update={"env": {**(cmd.env or {}), NODE_ID_ENV: node_id}})
    try:
        guard = CommandGuard(cmd.env or {}, lease_s)
    except OSError as exc:
        yield {"spawn_error": f"cannot start the command's guard on node {node_id[:12]}: {exc}",
               "node_pid": os.getpid()}
        return
    lease = CommandLease(node_id, lease_s, guard, grant)
    running: Any = None
    try:
        if not lease.renew():  # never started without a lease the cluster granted
            guard.release()
            yield {"lost": lease.lost or f"node {node_id[:12]} could not reach the cluster", "node_pid": os.getpid()}
            return
        try:
            running = spawn(cmd)
        except UtilitySpawnError as exc:
            guard.release()
            yield {"spawn_error": exc.message, "node_pid": os.getpid()}
            return
        guard.watch(running.pid)
        done = threading.Event()
        start_thread(_end_if_raylet_dies, args=(running, os.getppid(), done), name=f"castor-raylet-watch-{running.pid}",
                     owner="/ray", purpose="ends a utility command whose node's raylet died")
        start_thread(lease.keep, args=(running, done), name=f"castor-command-lease-{running.pid}", owner="/ray",
                     purpose="renews a utility command's lease; ends the command when it lapses")
        try:
            result = running.wait()
        finally:
            done.set()
    except BaseException:  # KeyboardInterrupt from ray.cancel (often several): the command must not outlive it
        end_for_sure(running, guard)
        raise
    guard.release()
    if lease.lapsed():
        yield {"lost": lease.lost or "its lease lapsed", "node_pid": os.getpid()}
        return
    yield {"result": result.model_dump(mode="json"), "node_pid": os.getpid()}


def end_for_sure(running: Any, guard: CommandGuard) -> None:
    """End a command whose task is interrupted (``ray.cancel``: a ``KeyboardInterrupt``), whatever
    else interrupts this meanwhile: its guard is told to kill it (and let go, never released
    with the command alive), then the task kills it itself and waits for its end.

    Before, a second cancel -- a cast host taken for lost cancels its commands as it ends itself,
    then again as its runtime stops -- landed inside the first one's kill: the task left with the
    command running and told its guard it had ended as it should, so the command ran on to its end,
    holding no lease, beside the recast's copy on another host."""
    for _ in range(100):  # each KeyboardInterrupt restarts it; the guard's kill needs only the first line
        try:
            guard.abandon()
            if running is not None:
                running.kill()
                running.wait()
            return
        except KeyboardInterrupt:
            continue


def _node_alive(node_id: str, timeout_s: float) -> bool | None:
    """What the cluster's control plane (the GCS) says of ``node_id`` now: True alive, False dead,
    None no answer within ``timeout_s`` (this node cut off from it, or the GCS down)."""
    import ray

    try:
        from ray._raylet import NodeID

        client = getattr(ray._private.worker.global_worker, "gcs_client")  # noqa: SLF001, B009 - check_alive has a timeout
        return bool(client.check_alive([NodeID.from_hex(node_id)], timeout=timeout_s)[0])
    except (ImportError, AttributeError):  # another Ray: the public listing (without a timeout of its own)
        try:
            return any(n.get("NodeID") == node_id and n.get("Alive") for n in ray.nodes())  # type: ignore[no-untyped-call]
        except Exception:  # noqa: BLE001 - no answer: the lease is not renewed
            return None
    except Exception:  # noqa: BLE001 - timed out, the GCS unreachable: the lease is not renewed
        return None


def grant_key(grant: str) -> bytes:
    """The key whose presence in the GCS's key-value store says that the cast host holding
    ``grant`` is held: the serving process writes it before the host starts and deletes it when it
    takes the host for lost (or stops it). Absent, none of the host's commands may start or run on.

    Presence, not a revocation's mark, is what holds: a mark had to stay for ever (one key per lost
    host, for as long as the cluster ran), since a stale host that found it gone would take itself
    for held. A grant deleted stays revoked; the store keeps one key per live host."""
    return GRANT_KEY_PREFIX + grant.encode()




def grant_holder(job_id: str) -> bytes:
    """The value of a grant's key: the Ray job (the serving process's driver, ``job_id`` in hex)
    that holds it. Only the key's presence fences anything; the value lets a later serving process
    tell a key whose holder has ended (killed outright, it could delete nothing) from a live one's."""
    return _HOLDER_PREFIX + job_id.encode()


def holder_of(value: bytes | None) -> str | None:
    """The job (hex) a grant key's value names (:func:`grant_holder`), or None: no such value (a
    key written by an earlier castor, which said only ``held``)."""
    if value is None or not value.startswith(_HOLDER_PREFIX):
        return None
    return value[len(_HOLDER_PREFIX):].decode(errors="replace") or None


def grant_held(grant: str, timeout_s: float) -> bool | None:
    """What the GCS says of the cast host's grant now: True held, False revoked (its key is gone:
    the serving process took the host for lost), None no answer within ``timeout_s``."""
    import ray

    try:
        client = getattr(ray._private.worker.global_worker, "gcs_client")  # noqa: SLF001, B009 - a get with a timeout
        return client.internal_kv_get(grant_key(grant), GRANT_NAMESPACE, timeout=timeout_s) is not None
    except Exception:  # noqa: BLE001 - timed out, the GCS unreachable: not known
        return None


class CommandLease:
    """A running command's lease, renewed from its task while the GCS answers that the command's
    node is alive (see ``COMMAND_LEASE_S``).

    A renewal counts from the moment its question was *sent* (never from the answer's arrival):
    a renewal that succeeded was sent before the GCS declared the node dead, so the command never
    runs past ``T`` after that declaration, which is what the caller waits for before it runs
    the command again elsewhere.

    With a ``grant`` (the cast host's, see :func:`grant_key`), a renewal also needs the GCS
    to say the grant is held: once the serving process has revoked it, the command is ended at its
    next renewal (or, its node unable to ask, once its lease lapses), so none of a lost host's
    commands runs past ``T`` after the revocation -- wherever it runs, whatever the host does."""

    def __init__(self, node_id: str, lease_s: float, guard: CommandGuard, grant: str | None = None) -> None:
        self.node_id = node_id
        self.grant = grant
        self.lease_s = lease_s
        self.period_s = max(0.05, lease_s / 5)  # four tries at least before it lapses
        self._guard = guard
        self.last: float | None = None
        self.lost: str | None = None  # why the command was ended (None: its lease holds)

    def renew(self) -> bool:
        sent = time.monotonic()
        alive = _node_alive(self.node_id, self.period_s)
        if alive and self.grant is not None:
            held = grant_held(self.grant, self.period_s)
            if held is False and self.lost is None:
                self.lost = ("the serving process took the command's cast host for lost (its grant was revoked); "
                             "the cast runs on another host")
            if not held:
                return False
        if alive:
            self.last = sent
            self._guard.renewed(sent)
            return True
        if alive is False and self.lost is None:
            self.lost = f"the cluster declared node {self.node_id[:12]} dead while the command ran there"
        return False

    def lapsed(self) -> bool:
        return self.lost is not None or self.last is None or time.monotonic() - self.last >= self.lease_s

    def keep(self, running: Any, done: threading.Event) -> None:
        """Renew every ``period_s`` until ``done``; end the command once the GCS says the node is
        dead or the lease has lapsed (its guard does too, on its own clock)."""
        while not done.wait(self.period_s):
            if self.renew():
                continue
            if self.lost is None and self.lapsed():
                self.lost = (f"node {self.node_id[:12]} could not reach the cluster for {self.lease_s:g} s "
                             "(its lease lapsed)")
            if self.lost is not None:
                self._guard.end_now()
                running.kill()
                return


def _end_if_raylet_dies(running: Any, raylet_pid: int, done: threading.Event) -> None:
    """Kill the command's tree once this worker's parent, its node's raylet, is gone.

    A raylet that dies (``kill -9``, the OOM killer) leaves the worker running the task alive,
    and the worker notices nothing while the command runs: the cluster declares the node dead,
    the cast hears lost work and runs the command again on a live node, while this copy ran on to
    its end. The worker's parent changes when the raylet dies, so this looks every
    ``RAYLET_WATCH_S``."""
    while not done.wait(RAYLET_WATCH_S):
        if os.getppid() != raylet_pid:
            running.kill()
            return


#: The guard's program (standard library only, started with ``python -I -S``). The task tells it,
#: one line each: ``g GROUP`` the command's process group, ``r T`` its lease renewed as of
#: ``time.monotonic()`` T (this machine's clock, which every process shares), ``k`` end it now, ``x``
#: the task ended as it should (the command is over or was ended by the task): exit. It ends the
#: command -- stops its process group and every process whose environment carries its visit id (and
#: run directory), then kills them all -- on ``k``, on end of file without ``x`` (the task's worker
#: died with the command running: killed, the OOM killer, gone with its raylet; nothing else would
#: end it), and once the lease has gone ``LEASE`` seconds without a renewal (the node is cut off
#: from the cluster, which runs the command again elsewhere once that much time has passed).
_GUARD_PROGRAM = r"""
import os, select, signal, sys, time
if os.fork():
    os._exit(0)  # the guard goes on detached: Ray kills a worker's own children with it
visit, run_dir, lease = sys.argv[1].encode(), sys.argv[2].encode(), float(sys.argv[3])
group, renewed, said, end = 0, None, b"", False
while not end:
    wait = None if renewed is None else max(0.0, renewed + lease - time.monotonic())
    if not select.select([0], [], [], wait)[0]:
        break  # the lease lapsed
    try:
        chunk = os.read(0, 256)
    except OSError:
        chunk = b""
    if not chunk:
        break  # the worker died
    said += chunk
    *lines, said = said.split(b"\n")
    for line in lines:
        if line == b"x":
            sys.exit(0)
        if line == b"k":
            end = True
        elif line[:2] == b"g " and line[2:].isdigit():
            group = int(line[2:])
        elif line[:2] == b"r ":
            try:
                at = float(line[2:])
            except ValueError:
                continue
            renewed = at if renewed is None else max(renewed, at)
me = os.getpid()
tags = [b"CASTOR_VISIT_ID=" + visit] + ([b"CASTOR_RUN_DIR=" + run_dir] if run_dir else [])


def tagged():
    found = []
    if not visit:
        return found
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/" + name + "/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if all(tag in env for tag in tags):
            found.append(int(name))
    return found


def send(sig, pids):
    if group > 1:
        try:
            os.killpg(group, sig)
        except OSError:
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


send(signal.SIGSTOP, [])
pids = tagged()
send(signal.SIGSTOP, pids)
send(signal.SIGKILL, sorted(set(pids) | set(tagged())))
"""


class CommandGuard:
    """Ends a command whose task's worker died under it.

    The command runs in its own session (so that a cancel can kill its whole tree), so a Ray
    worker killed mid-command (``kill -9``, the OOM killer, its raylet gone) left it running on
    its node, reparented to init, while the cast was told the work was lost and ran it again
    elsewhere: two copies at once, on a shared project, and one nobody would ever end. The guard
    is a small process the task starts first, holding the read end of a pipe whose write end only
    the worker holds: the worker's death, however it comes, closes it, and the guard then kills
    the command's tree (see ``_GUARD_PROGRAM``). A task that ends as it should tells the guard so
    first. The guard forks away from the worker before the command starts: when the worker exits
    because its owner (the cast host, the serving process) died, Ray kills the worker's own
    children, the guard among them had it stayed one, and a command's grandchildren (``sh -c
    'make; ...'`` runs ``make`` as one) lived on. Raises ``OSError`` when the guard cannot start
    (the command is then not started)."""

    def __init__(self, env: dict[str, str], lease_s: float = COMMAND_LEASE_S) -> None:
        import subprocess
        import sys

        from castor.ports.utility_runner import RUN_DIR_ENV, VISIT_ID_ENV

        self._lock = threading.Lock()  # the task's thread and its lease's thread both tell it things
        self._closed = False
        read_end, self._write_end = os.pipe()  # both close-on-exec: no command inherits the write end
        try:
            self._proc = subprocess.Popen(  # noqa: S603 - this interpreter and a fixed program
                [sys.executable, "-I", "-S", "-c", _GUARD_PROGRAM, env.get(VISIT_ID_ENV, ""),
                 env.get(RUN_DIR_ENV, ""), repr(float(lease_s))],
                stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
                start_new_session=True, env={})
        except OSError:
            os.close(self._write_end)
            raise
        finally:
            os.close(read_end)
        try:  # the launcher exits once the guard has forked away from it
            code = self._proc.wait(timeout=GUARD_START_S)
        except subprocess.TimeoutExpired:
            code = None
        if code != 0:
            self._proc.kill()
            self._proc.wait()
            os.close(self._write_end)
            raise OSError(f"its guard did not start within {GUARD_START_S:g} s (exit {code})")

    def watch(self, group: int) -> None:
        """The command started as the leader of process group ``group``."""
        self._say(f"g {group}\n".encode())

    def renewed(self, at: float) -> None:
        """The command's lease was renewed as of ``time.monotonic()`` ``at``."""
        self._say(f"r {at!r}\n".encode())

    def end_now(self) -> None:
        """Kill the command's tree now (the cluster declared its node dead, or its lease lapsed)."""
        self._say(b"k\n")

    def abandon(self) -> None:
        """The task ends as it should not (interrupted): the guard kills the command now, and
        this side lets it go (a later :meth:`release` changes nothing)."""
        self._say(b"k\n")
        self._close()

    def release(self) -> None:
        """The task ends as it should: the guard exits without touching anything."""
        self._say(b"x\n")
        self._close()

    def _close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                try:
                    os.close(self._write_end)
                except OSError:
                    pass

    def _say(self, data: bytes) -> None:
        with self._lock:  # never after the close: the number may name another file by then
            if self._closed:
                return
            try:
                os.write(self._write_end, data)
            except OSError:  # the guard is gone: nothing to tell
                pass


class NodeWatch:
    """Which cluster nodes this process has seen dead, and since when; asks the cluster at most
    once per ``period_s`` however many commands wait (one shared answer).

    Guarantees a node's death time is when this process first saw it dead (never earlier, so never
    before the cluster declared it); does not tell a node cut off from the cluster from one that
    is gone (a command there is fenced by its lease either way)."""

    def __init__(self, period_s: float = WATCH_S) -> None:
        self._period_s = period_s
        self._lock = threading.Lock()
        self._checked = -period_s
        self._dead: dict[str, float] = {}
        self._largest_cpus: float | None = None  # the most CPUs one live node has (None: not known yet)

    def dead_since(self, fresh: bool = False) -> dict[str, float]:
        """Node id -> when this process first saw it dead; ``fresh``: ask the cluster now."""
        import ray

        with self._lock:
            now = time.monotonic()
            if fresh or now - self._checked >= self._period_s:
                self._checked = now
                try:
                    nodes = ray.nodes()  # type: ignore[no-untyped-call]
                except Exception:  # noqa: BLE001 - the cluster's control plane is slow: ask next time
                    nodes = []
                for node in nodes:
                    if not node.get("Alive") and node.get("NodeID") not in self._dead:
                        self._dead[str(node.get("NodeID"))] = now
                alive = [float((n.get("Resources") or {}).get("CPU", 0.0)) for n in nodes if n.get("Alive")]
                if alive:
                    self._largest_cpus = max(alive)
            return dict(self._dead)

    def largest_cpus(self) -> float | None:
        """The most CPUs one live node of the cluster has (as last asked), or None if unknown."""
        self.dead_since()
        with self._lock:
            return self._largest_cpus

    def stalled_by(self, started_on: str | None, submitted_at: float, fence_s: float) -> str | None:
        """Why a command not answered yet is taken for lost, or None: it started on a node seen
        dead ``fence_s`` ago, or it is not known to have started and a node died after it was
        submitted, that long ago (Ray may have sent its lease request there, and such a request
        is never answered: ray-project/ray#63405; or it did start there and its first answer never
        came back). ``fence_s`` is the command's lease and a margin: by then a copy still running
        on that node, cut off from the cluster, has been killed by its guard."""
        now = time.monotonic()
        dead = self.dead_since()
        if started_on is not None:
            since = dead.get(started_on)
            return f"its node {started_on[:12]} died" if since is not None and now - since >= fence_s else None
        for node_id, since in dead.items():
            if since >= submitted_at and now - since >= fence_s:
                return f"not started when node {node_id[:12]} died"
        return None

    def fenced_until(self, started_on: str | None, submitted_at: float, fence_s: float) -> float | None:
        """Until when (``time.monotonic()``) a command whose task failed may still run somewhere: on
        its node (or, not known to have started, on any node that died since it was submitted),
        dead to the cluster but maybe only cut off, until ``fence_s`` after this process saw it
        dead. None: no such node, the command is over (its worker died on a live node, where its
        guard ended it)."""
        dead = self.dead_since(fresh=True)
        if started_on is not None:
            since = dead.get(started_on)
            return since + fence_s if since is not None else None
        later = [since for since in dead.values() if since >= submitted_at]
        return max(later) + fence_s if later else None


_TASK: Any = None
_TASK_LOCK = threading.Lock()


def _task() -> Any:
    global _TASK
    with _TASK_LOCK:
        if _TASK is None:
            import ray

            _TASK = ray.remote(max_retries=0, num_returns="streaming")(_run_on_node)
        return _TASK


class RemoteRunningUtility:
    """A command started as a Ray task, with the interface of a local ``RunningUtility``."""

    def __init__(self, cmd: UtilityCommand, answers: Any, watch: NodeWatch,
                 lease_s: float = COMMAND_LEASE_S) -> None:
        self.cmd = cmd
        self._answers = answers  # the task's ObjectRefGenerator: where it started, then its answer
        self._watch = watch
        self.fence_s = lease_s + LEASE_MARGIN_S  # how long a copy cut off with its node may still run
        self._never = threading.Event()
        self._killed = threading.Event()
        self._finished = threading.Event()
        self._started = time.monotonic()
        self.started_on: str | None = None
        self.spawn_error: str | None = None
        self.lost_why: str | None = None  # why the command was taken for lost (the cast's WorkLost says it)

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    def pids(self) -> list[int]:
        return []  # on another node: ops.fault kill_process kills it through kill()

    def kill(self) -> None:
        import ray

        self._killed.set()
        try:
            ray.cancel(self._answers, force=False)
        except Exception:  # noqa: BLE001 - already finished, or its node is gone
            pass

    def terminate(self, grace_s: float) -> None:
        self.kill()

    def wait(self) -> UtilityResult:
        try:
            answer = self._answer()
        except _Lost as lost:
            self.lost_why = f"lost on the cluster: {lost}"
            self._finished.set()
            return self._lost(str(lost))
        self._finished.set()
        if "spawn_error" in answer:
            self.spawn_error = str(answer["spawn_error"])
            raise UtilitySpawnError(self.spawn_error, may_have_started=False)
        result = UtilityResult.model_validate(answer["result"])
        if self._killed.is_set() and not result.timed_out:
            return result.model_copy(update={"killed": True})
        return result

    def _answer(self) -> dict[str, Any]:
        import ray

        while True:
            try:
                ref = self._next_answer(WATCH_S)
            except StopIteration:
                raise _Lost(self._fenced("the task ended without an answer")) from None
            if ref is None:
                why = self._watch.stalled_by(self.started_on, self._started, self.fence_s)
                if why is not None:
                    self.kill()  # a task cancelled before it started never starts; one started is told to stop
                    raise _Lost(f"{why} (its lease of {self.fence_s - LEASE_MARGIN_S:g} s has lapsed since)")
                continue
            try:
                answer = ray.get(ref)
            except StopIteration:
                raise _Lost(self._fenced("the task ended without an answer")) from None
            except Exception as exc:  # noqa: BLE001 - cancelled, worker crashed, node died: lost work
                raise _Lost(self._fenced(type(exc).__name__)) from None
            if "started_on" in answer:
                self.started_on = str(answer["started_on"])
                continue
            if "lost" in answer:  # its lease lapsed on its node: the guard ended the command before this answer
                raise _Lost(str(answer["lost"]))
            return dict(answer)

    def _next_answer(self, timeout_s: float) -> Any:
        """The ref of the task's next streamed answer, or None when none came within ``timeout_s``
        (StopIteration at the end of the stream).

        Ray's ``next()`` on the stream waits without bound for the task's end when the stream has
        ended but the task's node is unreachable: a command cancelled (an abort) just as its node
        was cut off hung its slot for ever -- and the cast's next command, which waits for it, with
        it. Ray's bounded form of ``next()`` is used (``_next_sync``: the pinned Ray 2.60 has it)."""
        ref = self._answers._next_sync(timeout_s)  # noqa: SLF001 - Ray's bounded next(), see above
        return None if ref.is_nil() else ref

    def _fenced(self, why: str) -> str:
        """Wait, before a failed task is taken for lost, until no copy of its command can still run.

        Ray fails the task as soon as the cluster declares its node dead, but a node that is only
        cut off runs the command on until its guard sees the lease lapse: the cast would have run
        it again elsewhere at once, two copies at the same time on the shared project. Answers
        ``why`` with what was waited for."""
        until = self._watch.fenced_until(self.started_on, self._started, self.fence_s)
        if until is None:
            return why
        left = until - time.monotonic()
        if left > 0:
            self._never.wait(left)  # nothing shortens it: not a cancel either, the copy may still run
        return f"{why}; its node died, and its lease of {self.fence_s - LEASE_MARGIN_S:g} s has lapsed since"

    def _lost(self, why: str) -> UtilityResult:
        return UtilityResult(argv=list(self.cmd.argv), pid=0, exit_code=None, signal=None, signal_name=None,
                             timed_out=False, killed=True, duration_ms=(time.monotonic() - self._started) * 1000,
                             stdout="", stderr=f"lost on the cluster: {why}", stdout_truncated=False,
                             stderr_truncated=False, max_bytes=self.cmd.max_output_bytes,
                             timeout_ms=self.cmd.timeout_ms)


class _Lost(Exception):
    """The command's task is lost (its message says why): reported as lost work, never as its result."""


class RayUtilityRunner:
    """What a cast host's utility pool uses instead of a local ``spawn``."""

    def __init__(self, lease_s: float = COMMAND_LEASE_S, grant: str | None = None) -> None:
        self._watch = NodeWatch()
        self.lease_s = lease_s
        self.grant = grant  # the cast host's (see grant_key): its commands live only while it is held

    @property
    def fence_s(self) -> float:
        """How long a command started here may run on after its cast host is taken for lost (its
        lease and margin): what its record in the cast's run directory says, so that a runtime
        taking the cast up holds its commands that long (``command_records.cluster_fence_s``)."""
        return self.lease_s + LEASE_MARGIN_S

    def spawn(self, cmd: UtilityCommand, resources: dict[str, float] | None = None) -> RemoteRunningUtility:
        cpus = float((resources or {}).get("cpus", DEFAULT_CPUS))
        largest = self._watch.largest_cpus()
        if largest is not None and cpus > largest:
            # Ray would hold the task as infeasible for ever, and the cast would wait without a word.
            needs = f"{cpus:g} CPU{'' if cpus == 1 else 's'}"
            raise UtilitySpawnError(f"the command needs {needs} (its socket's resources.cpus) and no node of the "
                                    f"cluster has more than {largest:g}", may_have_started=False)
        # Ray counts CPUs in steps of CPU_STEP and refuses a finer figure (a ValueError here, which
        # crashed the pool's slot: the cast failed "work lost 4 times in a row"); a config may ask
        # for any figure above 0, so it is rounded to Ray's step, never below one step.
        cpus = max(round(cpus, 4), CPU_STEP)
        num_cpus = fresh_kind(cpus, len(self._watch.dead_since()))
        try:
            answers = _task().options(num_cpus=num_cpus).remote(cmd.model_dump(mode="json"), self.lease_s,
                                                                   self.grant)
        except (ValueError, TypeError) as exc:  # what else Ray refuses of a submission: the command cannot start
            raise UtilitySpawnError(f"the cluster refused the command: {exc}", may_have_started=False) from None
        return RemoteRunningUtility(cmd, answers, self._watch, self.lease_s)


def fresh_kind(cpus: float, deaths_seen: int) -> float:
    """The CPU request of a command submitted after ``deaths_seen`` node deaths: ``cpus`` less
    0.0001 per death (at most 0.0099 less; a request under 0.02 CPU is left as it is).

    Why: Ray sends one worker-lease request at a time per kind of task (function and resources),
    and a request it sent to a node that then stopped is never answered (ray-project/ray#63405).
    Every later command of that kind waited behind it for ever (seen in the stop_raylet scenario:
    a cast on a healthy host stuck two minutes). A command submitted after a death asks for a
    resource amount no earlier one did, so Ray leases it afresh; two commands of one socket still
    never share a CPU (0.9999 twice is more than one)."""
    if cpus < 0.02:
        return cpus
    return round(cpus - 0.0001 * (deaths_seen % 100), 4)
