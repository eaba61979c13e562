"""Operator methods: ``ops.actors``, ``ops.mailbox``, ``ops.worker``, ``ops.fault``.

Inspection never consumes a message. ``ops.fault`` exists on every runtime
but answers ``forbidden`` unless it was started with ``--allow-faults``.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import psutil
from pydantic import Field

from castor.endpoint.dispatch import Context, Dispatcher, Params
from castor.messages.errors import ActorStopped, Forbidden, InvalidParams, NotFound
from castor.runtime import Runtime
from castor.supervision import faults
from castor.supervision.registry import WATCH_PACE_S


class ActorsParams(Params):
    prefix: str = ""


MAX_ACTOR_PATH_CHARS = 1024
"""An actor path longer than this names no actor: refused as invalid params, not looked up."""


class MailboxParams(Params):
    path: str = Field(max_length=MAX_ACTOR_PATH_CHARS)


class HostsParams(Params):
    pass


class WorkerParams(Params):
    session_id: str | None = None


class FaultParams(Params):
    kind: Literal["kill", "crash_next", "delay_next", "kill_process", "retire", "kill_host"]
    path: str = Field(max_length=MAX_ACTOR_PATH_CHARS)
    message_type: str | None = None
    seconds: float = 0.0
    reason: str = "fault injected over the endpoint"


def process_stats(pid: int | None = None) -> dict[str, Any]:
    """pid, RSS, CPU times, threads and open files of one process (default: this one)."""
    proc = psutil.Process(pid or os.getpid())
    with proc.oneshot():
        times = proc.cpu_times()
        try:
            open_files = len(proc.open_files())
        except psutil.Error:
            open_files = None
        return {
            "pid": proc.pid,
            "rss_bytes": proc.memory_info().rss,
            "cpu_user_s": times.user,
            "cpu_system_s": times.system,
            "threads": proc.num_threads(),
            "open_files": open_files,
        }


def register_ops_methods(dispatcher: Dispatcher, runtime: Runtime) -> None:
    def actors(params: ActorsParams, _ctx: Context) -> dict[str, Any]:
        data = runtime.system.snapshot_data(params.prefix, pace_s=WATCH_PACE_S)  # TreeSnapshot's JSON shape
        if runtime.scaleout is not None:  # casts run on cast hosts: their actors, labelled with the host
            known = {actor["path"] for actor in data["actors"]}
            data["actors"] = sorted(data["actors"] + [a for a in runtime.scaleout.host_actors(params.prefix)
                                                      if a["path"] not in known], key=lambda a: a["path"])
        return data

    def mailbox(params: MailboxParams, _ctx: Context) -> dict[str, Any]:
        return runtime.system.mailbox(params.path).model_dump(mode="json")

    def worker(params: WorkerParams, _ctx: Context) -> dict[str, Any]:
        result: dict[str, Any] = {"runtime": process_stats()}
        if params.session_id is not None:
            from castor.endpoint.methods.icarus import worker_stats

            result["worker"] = worker_stats(runtime, params.session_id)
        return result

    def fault(params: FaultParams, _ctx: Context) -> dict[str, Any]:
        if not runtime.settings.allow_faults:
            raise Forbidden("fault injection is disabled (start castor serve with --allow-faults)")
        if params.kind == "kill_host":  # path: a cast host's id (``ops.hosts``)
            if runtime.scaleout is None:
                raise InvalidParams("kill_host needs castor serve --backend ray")
            if params.path not in runtime.scaleout.hosts:
                raise NotFound(f"no cast host {params.path!r}", data={"path": params.path})
            if not runtime.scaleout.hosts[params.path].alive:  # answered "injected", and nothing was
                raise ActorStopped(f"cast host {params.path} is already lost (see ops.hosts); nothing injected",
                                   data={"path": params.path, "state": "lost"})
            runtime.scaleout.kill_host(params.path)
            return {"injected": params.kind, "path": params.path}
        handle = runtime.system.lookup(params.path)
        if params.kind in ("kill", "retire"):
            carried = faults.kill(handle, params.reason) if params.kind == "kill" else handle.retire(params.reason)
            if not carried:
                raise ActorStopped(f"{params.path} runs no incarnation to {params.kind} ({handle.state.value}); "
                                   "nothing injected", data={"path": params.path, "state": handle.state.value},
                                   may_have_started=False)
        elif params.kind == "crash_next":
            faults.crash_next(handle, params.message_type)
        elif params.kind == "delay_next":
            if not 0 < params.seconds <= 600:  # NaN fails this too
                raise InvalidParams("delay_next needs 0 < seconds <= 600")
            faults.delay_next(handle, params.seconds, params.message_type)
        elif params.kind == "kill_process":
            return {"injected": params.kind, "path": params.path, "pids": faults.kill_process(handle)}
        return {"injected": params.kind, "path": params.path}

    def hosts(_params: HostsParams, _ctx: Context) -> dict[str, Any]:
        """Where casts run: ``local`` (this process), or the cast hosts of the Ray backend."""
        if runtime.scaleout is None:
            return {"backend": "local", "hosts": []}
        return {"backend": "ray", "hosts": runtime.scaleout.hosts_view()}

    dispatcher.register("ops.hosts", hosts, HostsParams)
    dispatcher.register("ops.actors", actors, ActorsParams)
    dispatcher.register("ops.mailbox", mailbox, MailboxParams)
    dispatcher.register("ops.worker", worker, WorkerParams)
    dispatcher.register("ops.fault", fault, FaultParams)
