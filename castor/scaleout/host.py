"""A cast host: one castor runtime inside one Ray actor process, hosting many sessions' casts.

A Ray actor is an OS process (tens of MiB), so castor never makes one per cast or per visit: a
host runs castor's own actor runtime — the cast supervisor, CastActors, SocketActors and a
utility pool — for every session the serving process places on it, the way a shard hosts many
entities. The domain (``engine.step``, config, graph, handoff) runs unchanged inside it.

What a host is given and gives back (all plain maps, so nothing castor-typed is pickled across
nodes):

| method | does | answers |
|---|---|---|
| ``ping()`` | liveness and placement | ``{host_id, node_id, pid, castor_version, sessions, casts}`` |
| ``open_session(info, has_context, agent_spec, agent_label, harness_kind)`` | opens the session in this host's runtime with relay ports (``agent_spec`` set: the agent runs here instead, e.g. the scripted agent of ``castor cast``); ``harness_kind``: the serving process's session's (``endpoint`` for a harness), so every answer and notice names the commands of the surface the user is on | ``{session_id}`` or ``{error}`` |
| ``call(session_id, verb, params, timeout_s)`` | one materia verb (what ``cast.*`` methods do) | ``{ok: result}`` or ``{error: wire error}`` |
| ``turn_ended(session_id, outcome)`` | the harness's answer to a relayed turn | ``True`` if a turn was waiting for it |
| ``answer(request_id, ok, value)`` | the harness's answer to a relayed request | ``True`` if someone still waits |
| ``drain(max_items, timeout_s)`` | the long-poll of the relay | ``[RelayItem maps]`` |
| ``hold_commands(cast_ids, seconds)`` | no command of those casts starts here for ``seconds`` (recast here from a lost host, whose commands may run until then) | – |
| ``close_session(session_id)`` / ``shutdown()`` | ends sessions (casts stay resumable on disk) | – |

**A host nobody drains ends itself.** The serving process drains every live host without pause (a
long poll of at most a second). When it stops -- it took the host for lost: its node's raylet was
killed while the host's own process lived on, the network between them parted -- the host would
run on, holding its casts' leases, and the casts it was presumed to have lost could not be recast
anywhere. After ``fence_after_s`` without a drain the host stops its runtime (every cast saved as
it stands, its lease released) and exits: the serving process's recovery, which waits that long
for a lost host's leases, then recasts them on a live host. Before its first drain it waits longer: as long as
the serving process may take to accept it (``first_drain_within_s``: its start allowance and a
margin), so a host is never fenced while the serving process still waits for it to start.

**A host whose grant is revoked ends itself at once.** The serving process gives every host a
grant -- a key in the GCS's key-value store, written before the host starts -- and revokes it by
deleting the key the moment it takes the host for lost (so a lost host leaves nothing there) -- its
drains unanswered for ``lost_after_silence_s`` (a stopped or frozen process), its node declared
dead, its process gone -- before it recasts anything of the host's elsewhere. The grant is the
fencing token of everything the host starts: each of its commands' tasks checks it before the
command starts and at every renewal of the command's lease (a revoked grant ends the command,
see :class:`castor.scaleout.utility_tasks.CommandLease`), and the host looks at it every
``GRANT_CHECK_S``: a host that learns it was revoked (it was only stopped, or cut off, and runs
again) kills its running commands, stops its runtime (casts saved, leases released) and exits,
without answering anything more to its casts' slots. A host that cannot reach the GCS cannot
learn it; its commands then lapse with their lease, and it ends itself after ``fence_after_s``.

Utility commands of this host's casts run as Ray tasks (:mod:`castor.scaleout.utility_tasks`),
so they land on a node with the CPUs their socket declares.
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

from castor._log import logger
from castor.messages.errors import CastorError, NotFound
from castor.scaleout.relay import Outbox, RelayAgent, RelayHostContext, RelaySessionLog, RelayUi

GRANT_CHECK_S = 1.0  # how often a host asks the GCS whether its grant still holds


class CastHost:
    """The body of the ``CastHost`` Ray actor (see :func:`castor.scaleout.ray_backend.host_class`)."""

    def __init__(self, host_id: str, settings: dict[str, Any], fence_after_s: float | None = None,
                 command_lease_s: float | None = None, grant: str | None = None,
                 first_drain_within_s: float | None = None) -> None:
        from castor.actors.materia.utility_pool import pool_of
        from castor.composition import materia_component
        from castor.logs import configure_logging
        from castor.runtime import Runtime, RuntimeSettings
        from castor.scaleout.utility_tasks import COMMAND_LEASE_S, RayUtilityRunner

        configure_logging()  # this Ray worker runs castor as its program: its warnings go to the worker's log
        self.host_id = host_id
        self.outbox = Outbox()
        self.runtime = Runtime(RuntimeSettings(**settings), components=[materia_component()])
        pool = pool_of(self.runtime.system.registry)
        pool.remote_runner = RayUtilityRunner(command_lease_s or COMMAND_LEASE_S, grant)
        self._agents: dict[str, Any] = {}
        self._lock = threading.Lock()
        # first_drain_within_s: the serving process's start allowance and a margin (see
        # RayBackendSettings.first_drain_within_s): it may accept this host's answer that late
        self._fence = SilenceFence(fence_after_s, self._end_unclaimed, first_drain_within_s) if fence_after_s else None
        self.grant = grant
        self._revoked = threading.Event()
        if grant is not None:
            pool.refuses = self.revoked
            from castor.supervision.threads import start_thread

            start_thread(self._watch_grant, name="castor-host-grant", owner="/ray",
                         purpose="ends a cast host whose grant the serving process revoked")

    def revoked(self) -> bool:
        """Whether this host learnt that its grant was revoked (then nothing more of its casts is
        started or recorded here)."""
        return self._revoked.is_set()

    def _watch_grant(self) -> None:
        from castor.scaleout.utility_tasks import grant_held

        while not self._revoked.wait(GRANT_CHECK_S):
            if self.grant is not None and grant_held(self.grant, GRANT_CHECK_S) is False:
                self._revoked.set()
                self._end_revoked()

    def _end_revoked(self) -> None:
        """The serving process took this host for lost and revoked its grant (it was stopped, or
        cut off, and runs again): kill its running commands, stop (casts saved, leases released)
        and exit; its casts run on another host."""
        from castor.actors.materia.utility_pool import pool_of

        logger.bind(actor="/ray").error("cast host {host}: its grant was revoked (the serving process took it for "
                                        "lost): ending its commands and exiting", host=self.host_id)
        try:
            for running in pool_of(self.runtime.system.registry).all_running():
                running.kill()
            self.runtime.shutdown(10.0)
        finally:
            os._exit(75)

    def _end_unclaimed(self) -> None:
        """The serving process stopped draining this host: it took it for lost. Stop (casts saved,
        leases released) and exit, so its casts can be recast on a live host."""
        logger.bind(actor="/ray").error("cast host {host}: not drained for {s:.0f} s, taken for lost: "
                                        "stopping its casts and exiting", host=self.host_id,
                                        s=self._fence.silence_s if self._fence else 0.0)
        try:
            self.runtime.shutdown(10.0)
        finally:
            os._exit(75)

    # -- liveness ------------------------------------------------------------
    def ping(self) -> dict[str, Any]:
        import ray

        registry = self.runtime.system.registry
        casts = [h.path for ctx in self.runtime.sessions()
                 for h in registry.children(ctx.child("cast")) if h.alive]
        from castor.version import __version__

        return {"host_id": self.host_id, "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "castor_version": __version__,
                "sessions": sorted(ctx.info.session_id for ctx in self.runtime.sessions()), "casts": casts,
                "outbox": len(self.outbox)}

    # -- sessions --------------------------------------------------------------
    def open_session(self, info: dict[str, Any], has_context: bool, agent_spec: str | None,
                     agent_label: str = "Pi agent", harness_kind: str = "standalone") -> dict[str, Any]:
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
                kind="ray-relay", host_context=context, relays=harness_kind))
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

    def hold_commands(self, cast_ids: list[str], seconds: float) -> bool:
        """No command of ``cast_ids`` starts on this host for ``seconds`` from now: they are recast
        here from a host taken for lost, whose commands may still run that long."""
        from castor.actors.materia.utility_pool import pool_of

        pool = pool_of(self.runtime.system.registry)
        until = time.monotonic() + seconds
        for cast_id in cast_ids:
            pool.hold_commands(cast_id, until)
        return True

    # -- the relay's answers ---------------------------------------------------
    def turn_ended(self, session_id: str, outcome: dict[str, Any]) -> bool:
        with self._lock:
            agent = self._agents.get(session_id)
        return isinstance(agent, RelayAgent) and agent.deliver(outcome)

    def answer(self, request_id: int, ok: bool, value: Any) -> bool:
        return self.outbox.answer(request_id, ok, value)

    def drain(self, max_items: int = 256, timeout_s: float = 1.0) -> list[dict[str, Any]]:
        if self._fence is not None:
            self._fence.heard()
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
        if self._fence is not None:
            self._fence.stop()  # the serving process ends it: no drain follows, and none is missed
        return self.runtime.shutdown(20.0)


class SilenceFence:
    """Calls ``on_silence`` once, from its own thread, when :meth:`heard` has not been called for
    ``silence_s``, or, before its first call, for ``first_silence_s`` (when longer) counted from
    construction. It checks a few times per ``silence_s``, so it fires between the silence allowed
    and that plus ``silence_s`` / 4 after the last call; :meth:`stop` disarms it.

    ``first_silence_s`` is how long the serving process may take to accept a starting host and
    drain it the first time (``RayBackendSettings.first_drain_within_s``): a host fenced sooner
    could end itself while the serving process still waited for its answer, or just after it
    accepted it."""

    def __init__(self, silence_s: float, on_silence: Callable[[], None], first_silence_s: float | None = None) -> None:
        from castor.supervision.threads import start_thread

        self.silence_s = silence_s
        self.first_silence_s = max(silence_s, first_silence_s or 0.0)
        self._on_silence = on_silence
        self._last = time.monotonic()
        self._heard_once = False
        self._stopped = threading.Event()
        start_thread(self._watch, name="castor-host-fence", owner="/ray",
                     purpose="ends a cast host the serving process no longer drains")

    def heard(self) -> None:
        self._last = time.monotonic()  # stores only: no lock needed (the GIL)
        self._heard_once = True

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        while not self._stopped.wait(self.silence_s / 4):
            allowed = self.silence_s if self._heard_once else self.first_silence_s
            if time.monotonic() - self._last >= allowed:
                self._on_silence()
                return
