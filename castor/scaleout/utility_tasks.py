"""Utility commands as Ray tasks: a command runs on a node that has the CPUs its socket declares.

A cast host's utility pool keeps its slots, its ledger and its rules (one outcome per visit id,
``CASTOR_VISIT_ID`` in the command's environment, cancel kills the tree); only the place where
the process starts changes. :class:`RayUtilityRunner.spawn` submits one task per dispatch:

| rule | how |
|---|---|
| where | ``num_cpus`` = the socket's ``resources.cpus`` (default 1): Ray schedules the task on a node with that many free CPUs; a command waits in Ray's queue until one has them |
| at most once per dispatch | ``max_retries=0``: Ray never runs a task again (a lost node loses the dispatch; the cast re-dispatches under a **new** visit id, as after a slot crash) |
| cancel / kill | ``ray.cancel`` (not forced): the task's thread gets ``KeyboardInterrupt`` and kills the command's whole tree before it ends |
| a node or worker lost mid-command | the task fails with a Ray error: reported as lost work (``WorkLost``), never as the command's result |
| a node dies while a command waits | the task says where it started (its first streamed answer); a command started on a node dead for ``NODE_LOST_AFTER_S``, or not started ``NODE_LOST_AFTER_S`` after a node died (Ray may have sent its lease request to that node, and it is then never answered), is cancelled and reported as lost work; commands submitted after a node death ask for a CPU amount no earlier one did (:func:`fresh_kind`), so Ray leases them afresh instead of queueing them behind a lease request that dead node never answers |
| the command cannot start | ``spawn_error`` as for a local command |
| no live node has the CPUs it asks for | ``spawn_error`` at once (Ray would hold the task as infeasible for ever); an autoscaler's node types that do not run yet are not counted |

What it does not do: move the project's files — every node must see the project at the same
path (see docs/scale-out.md).
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from castor.adapters.materia.process_runner import UtilityCommand, UtilityResult, UtilitySpawnError

DEFAULT_CPUS = 1.0
WATCH_S = 1.0  # how often a waiting command looks at the cluster's nodes
NODE_LOST_AFTER_S = 5.0
"""How long a command waits for an answer once a node it may be on is dead: a task whose node's
raylet is stopped but whose worker lives still answers (so it is not re-run needlessly)."""
NODE_ID_ENV = "CASTOR_NODE_ID"  # in the command's environment: the Ray node it runs on


def _run_on_node(cmd_map: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The task body (a streaming generator): first where it started, then the command's answer;
    kills the command's tree if cancelled."""
    import os

    import ray

    from castor.adapters.materia.process_runner import spawn

    node_id = ray.get_runtime_context().get_node_id()
    yield {"started_on": node_id}
    cmd = UtilityCommand.model_validate(cmd_map)
    cmd = cmd.model_copy(update={"env": {**(cmd.env or {}), NODE_ID_ENV: node_id}})
    try:
        running = spawn(cmd)
    except UtilitySpawnError as exc:
        yield {"spawn_error": exc.message, "node_pid": os.getpid()}
        return
    try:
        result = running.wait()
    except BaseException:  # KeyboardInterrupt from ray.cancel: the command must not outlive it
        running.kill()
        running.wait()
        raise
    yield {"result": result.model_dump(mode="json"), "node_pid": os.getpid()}


class NodeWatch:
    """Which cluster nodes this process has seen dead, and since when; asks the cluster at most
    once per ``period_s`` however many commands wait (one shared answer).

    Guarantees a node's death time is when this process first saw it dead (never earlier); does
    not tell a node cut off from the cluster from one that is gone."""

    def __init__(self, period_s: float = WATCH_S) -> None:
        self._period_s = period_s
        self._lock = threading.Lock()
        self._checked = -period_s
        self._dead: dict[str, float] = {}
        self._largest_cpus: float | None = None  # the most CPUs one live node has (None: not known yet)

    def dead_since(self) -> dict[str, float]:
        import ray

        with self._lock:
            now = time.monotonic()
            if now - self._checked >= self._period_s:
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

    def stalled_by(self, started_on: str | None, submitted_at: float) -> str | None:
        """Why a command not answered yet is taken for lost, or None: it started on a node that has
        been dead ``NODE_LOST_AFTER_S``, or it has not started and a node died after it was
        submitted that long ago (Ray may have sent its lease request there, and such a request is
        never answered: ray-project/ray#63405)."""
        now = time.monotonic()
        dead = self.dead_since()
        if started_on is not None:
            since = dead.get(started_on)
            return f"its node {started_on[:12]} died" if since is not None and now - since >= NODE_LOST_AFTER_S \
                else None
        for node_id, since in dead.items():
            if since >= submitted_at and now - since >= NODE_LOST_AFTER_S:
                return f"not started when node {node_id[:12]} died"
        return None


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

    def __init__(self, cmd: UtilityCommand, answers: Any, watch: NodeWatch) -> None:
        self.cmd = cmd
        self._answers = answers  # the task's ObjectRefGenerator: where it started, then its answer
        self._watch = watch
        self._killed = threading.Event()
        self._finished = threading.Event()
        self._started = time.monotonic()
        self.started_on: str | None = None
        self.spawn_error: str | None = None

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
            ready, _ = ray.wait([self._answers], timeout=WATCH_S)
            if not ready:
                why = self._watch.stalled_by(self.started_on, self._started)
                if why is not None:
                    self.kill()  # a task cancelled before it started never starts; one started is told to stop
                    raise _Lost(why)
                continue
            try:
                answer = ray.get(next(self._answers))
            except StopIteration:
                raise _Lost("the task ended without an answer") from None
            except Exception as exc:  # noqa: BLE001 - cancelled, worker crashed, node died: lost work
                raise _Lost(type(exc).__name__) from None
            if "started_on" in answer:
                self.started_on = str(answer["started_on"])
                continue
            return dict(answer)

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

    def __init__(self) -> None:
        self._watch = NodeWatch()

    def spawn(self, cmd: UtilityCommand, resources: dict[str, float] | None = None) -> RemoteRunningUtility:
        cpus = float((resources or {}).get("cpus", DEFAULT_CPUS))
        largest = self._watch.largest_cpus()
        if largest is not None and cpus > largest:
            # Ray would hold the task as infeasible for ever, and the cast would wait without a word.
            needs = f"{cpus:g} CPU{'' if cpus == 1 else 's'}"
            raise UtilitySpawnError(f"the command needs {needs} (its socket's resources.cpus) and no node of the "
                                    f"cluster has more than {largest:g}", may_have_started=False)
        num_cpus = fresh_kind(cpus, len(self._watch.dead_since()))
        answers = _task().options(num_cpus=num_cpus).remote(cmd.model_dump(mode="json"))
        return RemoteRunningUtility(cmd, answers, self._watch)


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
