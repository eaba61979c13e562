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
| the command cannot start | ``spawn_error`` as for a local command |

What it does not do: move the project's files — every node must see the project at the same
path (see docs/scale-out.md).
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import threading
import time
from typing import Any

from castor.adapters.materia.process_runner import UtilityCommand, UtilityResult, UtilitySpawnError

DEFAULT_CPUS = 1.0
NODE_ID_ENV = "CASTOR_NODE_ID"  # in the command's environment: the Ray node it runs on


def _run_on_node(cmd_map: dict[str, Any]) -> dict[str, Any]:
    """The task body: run the command where Ray placed this task; kill its tree if cancelled."""
    import os

    import ray

    from castor.adapters.materia.process_runner import spawn

    cmd = UtilityCommand.model_validate(cmd_map)
    cmd = cmd.model_copy(update={"env": {**(cmd.env or {}), NODE_ID_ENV: ray.get_runtime_context().get_node_id()}})
    try:
        running = spawn(cmd)
    except UtilitySpawnError as exc:
        return {"spawn_error": exc.message, "node_pid": os.getpid()}
    try:
        result = running.wait()
    except BaseException:  # KeyboardInterrupt from ray.cancel: the command must not outlive it
        running.kill()
        running.wait()
        raise
    return {"result": result.model_dump(mode="json"), "node_pid": os.getpid()}


_TASK: Any = None
_TASK_LOCK = threading.Lock()


def _task() -> Any:
    global _TASK
    with _TASK_LOCK:
        if _TASK is None:
            import ray

            _TASK = ray.remote(max_retries=0)(_run_on_node)
        return _TASK


class RemoteRunningUtility:
    """A command started as a Ray task, with the interface of a local ``RunningUtility``."""

    def __init__(self, cmd: UtilityCommand, ref: Any) -> None:
        self.cmd = cmd
        self._ref = ref
        self._killed = threading.Event()
        self._finished = threading.Event()
        self._started = time.monotonic()
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
            ray.cancel(self._ref, force=False)
        except Exception:  # noqa: BLE001 - already finished, or its node is gone
            pass

    def terminate(self, grace_s: float) -> None:
        self.kill()

    def wait(self) -> UtilityResult:
        import ray

        try:
            answer = ray.get(self._ref)
        except Exception as exc:  # noqa: BLE001 - cancelled, worker crashed, node died: lost work
            self._finished.set()
            return self._lost(type(exc).__name__)
        self._finished.set()
        if "spawn_error" in answer:
            self.spawn_error = str(answer["spawn_error"])
            raise UtilitySpawnError(self.spawn_error, may_have_started=False)
        result = UtilityResult.model_validate(answer["result"])
        if self._killed.is_set() and not result.timed_out:
            return result.model_copy(update={"killed": True})
        return result

    def _lost(self, why: str) -> UtilityResult:
        return UtilityResult(argv=list(self.cmd.argv), pid=0, exit_code=None, signal=None, signal_name=None,
                             timed_out=False, killed=True, duration_ms=(time.monotonic() - self._started) * 1000,
                             stdout="", stderr=f"lost on the cluster: {why}", stdout_truncated=False,
                             stderr_truncated=False, max_bytes=self.cmd.max_output_bytes,
                             timeout_ms=self.cmd.timeout_ms)


class RayUtilityRunner:
    """What a cast host's utility pool uses instead of a local ``spawn``."""

    def spawn(self, cmd: UtilityCommand, resources: dict[str, float] | None = None) -> RemoteRunningUtility:
        cpus = float((resources or {}).get("cpus", DEFAULT_CPUS))
        ref = _task().options(num_cpus=cpus).remote(cmd.model_dump(mode="json"))
        return RemoteRunningUtility(cmd, ref)
