"""A cast host: one castor runtime inside one Ray actor process, hosting many sessions' casts.

A Ray actor is an OS process (tens of MiB), so castor never makes one per cast or per visit: a
host runs castor's own actor runtime — the cast supervisor, CastActors, SocketActors and a
utility pool — for every session the serving process places on it, the way a shard hosts many
entities. The domain (``engine.step``, config, graph, handoff) runs unchanged inside it.

What a host is given and gives back (all plain maps, so nothing castor-typed is pickled across
nodes):

| method | does | answers |
|---|---|---|
| ``ping()`` | liveness and placement | ``{host_id, node_id, pid, sessions, casts}`` |
| ``open_session(info, has_context, agent_spec, agent_label)`` | opens the session in this host's runtime with relay ports (``agent_spec`` set: the agent runs here instead, e.g. the scripted agent of ``castor cast``) | ``{session_id}`` or ``{error}`` |
| ``call(session_id, verb, params, timeout_s)`` | one materia verb (what ``cast.*`` methods do) | ``{ok: result}`` or ``{error: wire error}`` |
| ``turn_ended(session_id, outcome)`` | the harness's answer to a relayed turn | ``True`` if a turn was waiting for it |
| ``answer(request_id, ok, value)`` | the harness's answer to a relayed request | ``True`` if someone still waits |
| ``drain(max_items, timeout_s)`` | the long-poll of the relay | ``[RelayItem maps]`` |
| ``close_session(session_id)`` / ``shutdown()`` | ends sessions (casts stay resumable on disk) | – |

Utility commands of this host's casts run as Ray tasks (:mod:`castor.scaleout.utility_tasks`),
so they land on a node with the CPUs their socket declares.
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import os
import threading
from typing import Any, Callable

from castor.messages.errors import CastorError, NotFound
from castor.scaleout.relay import Outbox, RelayAgent, RelayHostContext, RelaySessionLog, RelayUi


class CastHost:
    """The body of the ``CastHost`` Ray actor (see :func:`castor.scaleout.ray_backend.host_class`)."""

    def __init__(self, host_id: str, settings: dict[str, Any]) -> None:
        from castor.actors.materia.utility_pool import pool_of
        from castor.composition import materia_component
        from castor.runtime import Runtime, RuntimeSettings
        from castor.scaleout.utility_tasks import RayUtilityRunner

        self.host_id = host_id
        self.outbox = Outbox()
        self.runtime = Runtime(RuntimeSettings(**settings), components=[materia_component()])
        pool_of(self.runtime.system.registry).remote_runner = RayUtilityRunner()
        self._agents: dict[str, Any] = {}
        self._lock = threading.Lock()

    # -- liveness ------------------------------------------------------------
    def ping(self) -> dict[str, Any]:
        import ray

        registry = self.runtime.system.registry
        casts = [h.path for ctx in self.runtime.sessions()
                 for h in registry.children(ctx.child("cast")) if h.alive]
        return {"host_id": self.host_id, "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "sessions": sorted(ctx.info.session_id for ctx in self.runtime.sessions()), "casts": casts,
                "outbox": len(self.outbox)}

    # -- sessions --------------------------------------------------------------
    def open_session(self, info: dict[str, Any], has_context: bool, agent_spec: str | None,
                     agent_label: str = "Pi agent") -> dict[str, Any]:
        from castor.adapters.agents.factory import make_agent
        from castor.ports.host_context import NoHostContext
        from castor.runtime import HarnessLink, SessionInfo

        sid = str(info.get("session_id"))
        try:
            if agent_spec:
                agent: Any = make_agent(agent_spec)
                context: Any = NoHostContext()
            else:
                agent = RelayAgent(self.outbox, sid, agent_label)
                context = RelayHostContext(self.outbox, sid, has_context)
            with self._lock:
                self._agents[sid] = agent
            self.runtime.open_session(SessionInfo(**info), HarnessLink(
                agent=agent, session_log=RelaySessionLog(self.outbox, sid), ui=RelayUi(self.outbox, sid),
                kind="ray-relay", host_context=context))
        except CastorError as exc:
            return {"error": exc.to_wire()}
        return {"session_id": sid}

    def close_session(self, session_id: str) -> bool:
        try:
            self.runtime.close_session(session_id, timeout=20.0)
        except NotFound:
            return False
        finally:
            with self._lock:
                agent = self._agents.pop(session_id, None)
            close = getattr(agent, "close", None)
            if close is not None:
                close()
        return True

    def call(self, session_id: str, verb: str, params: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        from castor.actors.materia.api import materia_call

        try:
            return {"ok": materia_call(self.runtime, session_id, verb, params, timeout=timeout_s)}
        except CastorError as exc:
            return {"error": exc.to_wire()}

    # -- the relay's answers ---------------------------------------------------
    def turn_ended(self, session_id: str, outcome: dict[str, Any]) -> bool:
        with self._lock:
            agent = self._agents.get(session_id)
        return isinstance(agent, RelayAgent) and agent.deliver(outcome)

    def answer(self, request_id: int, ok: bool, value: Any) -> bool:
        return self.outbox.answer(request_id, ok, value)

    def drain(self, max_items: int = 256, timeout_s: float = 1.0) -> list[dict[str, Any]]:
        return self.outbox.drain(max_items, timeout_s)

    def inject(self, injector: Callable[..., str | None], kind: str, family: str, pick: float,
               delay_s: float) -> str | None:
        """A fault inside this host's runtime (its casts, visits, utility slots): runs
        ``injector(registry, kind, family, pick, delay)`` here and returns what it answers. The
        host knows no fault itself; the soak hands it its injector (scale-out sits below testing)."""
        return injector(self.runtime.system.registry, kind, family, pick, lambda: delay_s)

    def snapshot(self) -> list[dict[str, Any]]:
        """Every actor of this host's runtime, as ``ops.actors`` shows them (paths unchanged)."""
        return [snap.model_dump(mode="json") for snap in self.runtime.system.snapshot().actors]

    def shutdown(self) -> bool:
        return self.runtime.shutdown(20.0)
