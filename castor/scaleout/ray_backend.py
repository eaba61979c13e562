"""The serving process's side of the Ray backend: hosts, the session directory, the relay drain.

``castor serve --backend ray`` (and ``castor cast``/``castor soak --backend ray``) build one
:class:`RayBackend` and give the runtime :func:`ray_materia_component` instead of the local
materia component. Everything above it — the endpoint's ``cast.*`` methods, the CLI, the harness
link — is unchanged: they ask ``/root/session/<sid>/materia``, which here is a
:class:`RemoteSessionActor` forwarding each verb to the session's cast host.

The directory (one rule, kept here because the serving process is the only router):

| when | what |
|---|---|
| a session opens | it is placed on the live host with the fewest sessions, within the opening's own deadline (a session not placed by then is placed by its next call, within that call's deadline; a host that answers too late is told to close it again); all its casts run there (they share the session's harness link, its concurrency limit and its lease root) |
| a session closes | its host is asked to end its turns (``session_end``), then to close it, each waited for ``SESSION_CLOSE_WAIT_S`` at most; it is forgotten here either way (best effort: a cut-off host's own fence ends it) |
| a host answers a call | its answer (a result or a castor wire error) is returned as is |
| a host dies (``RayActorError``: its process was killed, its node removed), or does not answer its drains for ``lost_after_silence_s`` (a stopped or frozen process: it is also killed, best effort) | its grant is revoked (``_revoke``: the fencing token its commands and the host itself check, see :mod:`castor.scaleout.host`; its key in the GCS is deleted, so a lost host leaves nothing in the store) and it is marked lost; its casts are recast at once, but their new host starts none of their commands before ``command_lease_s`` + ``LEASE_MARGIN_S`` after the revocation, when every command it started has ended wherever it ran; a replacement host is started on the live node with the fewest hosts (see ``_nodes_for_replacement``); every session it held is opened again on a live host and each of its casts that the dead host left ``orphaned`` is recast there — from its persisted state, under new visit ids; turns the dead host had sent are cancelled at the harness, and their late answers find no waiting turn (ignored) |
| a lost host's process still lives (its node's raylet was killed, the network parted, the process stopped) | it still holds its casts' leases, so they are not ``orphaned`` yet: the recovery re-lists the session's casts every second and recasts each as its lease comes free, for up to ``FENCE_AFTER_S`` + ``FENCE_MARGIN_S``; the host ends itself at once when it learns its grant was revoked, and, drained by nobody for ``FENCE_AFTER_S``, stops its casts and exits (:class:`castor.scaleout.host.SilenceFence`) |
| a call meets a lost host | ``actor_crashed`` with ``may_have_started: true`` (the host may have run it); a Ray ``GetTimeoutError`` is ``timeout`` with ``may_have_started: true`` |

Two hosts never advance one cast: a session lives on one host at a time (this directory), a cast's
lease is taken on the shared file system by the host that runs it, and every state save is fenced
by the cast's incarnation, so a host that was presumed dead but still writes is refused.
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from castor import tree
from castor._log import logger
from castor.actors.materia.messages import SESSION_VERBS, SessionEnding, SessionVerb
from castor.messages.errors import ActorCrashed, CastorError, Conflict, Internal, InvalidParams, NotFound, Timeout
from castor.messages.inspection import at_or_under
from castor.ports.agent import TurnOutcome, TurnRequest, enqueues_only
from castor.ports.host_context import CompactionRequest
from castor.scaleout.utility_tasks import (
    COMMAND_LEASE_S,
    GRANT_KEY_PREFIX,
    GRANT_NAMESPACE,
    LEASE_MARGIN_S,
    grant_holder,
    grant_key,
    holder_of,
)
from castor.supervision import Actor, ChildSpec, handles
from castor.supervision.threads import start_thread
from castor.version import __version__

RAY_NAMESPACE = "castor"
DRAIN_WAIT_S = 1.0
# under the endpoint's 15 s ask deadline, so the castor error is the one seen
CALL_TIMEOUT_S = 14.0
# A host not drained this long takes itself for lost and exits (host.SilenceFence): longer than a
# drain may take on a slow cluster (DRAIN_WAIT_S + the 30 s the drain's get allows).
FENCE_AFTER_S = 45.0
HOST_START_TIMEOUT_S = 60.0
"""How long a started cast host has to answer its first call (``_await_host``): its process
started on a busy cluster, castor imported, its runtime up. One that does not is ended, its grant
revoked."""
FIRST_DRAIN_MARGIN_S = 15.0
"""How much longer than the start allowance a host waits for its first drain: between the answer
the serving process accepts and the first drain reaching the host, a thread starts and one Ray call
travels, on a cluster that may be slow."""
FENCE_MARGIN_S = 15.0  # how much longer a recovery waits for a lost host's leases
# A host whose drains have not answered this long is taken for lost (a stopped or frozen process, a
# node that cannot reach this one while the cluster still lists it): shorter than FENCE_AFTER_S.
LOST_AFTER_SILENCE_S = 30.0
REVOKE_TIMEOUT_S = 5.0  # how long revoking a lost host's grant may wait for the GCS
PLACE_TIMEOUT_S = 60.0  # how long a lost host's session, moving, waits for a live cast host (a replacement starting)
# What a session opening leaves of the runtime's session_open_timeout_s for the rest of the session's start:
# its placement is bounded by the rest, so the opening answers within its own deadline.
OPEN_MARGIN_S = 1.0
# How long closing a session waits for its host to close it there (best effort: see close_session).
SESSION_CLOSE_WAIT_S = 3.0
ENDING_VERB = SessionEnding.verb  # what a session's close asks of its materia actor first (component._on_close)
HOSTS_VIEW_TIMEOUT_S = 5.0  # ops.hosts: how long the live hosts, asked at once, have to answer
SHUTDOWN_TIMEOUT_S = 30.0  # how long the live hosts, asked at once, have to stop (their runtimes take up to 20 s)
HELD = ("active", "awaiting_refinement", "interrupted")  # a listing's statuses of a cast someone runs
RESUMING_VERBS = frozenset({"recast", "continue", "revive"})
"""Materia verbs that run a cast again: after a lost host, its commands are held (see ``call``)."""
READ_ONLY_VERBS = frozenset({"status", "list", "grid", "loadouts", "validate"})
"""Materia verbs that change nothing: safe to ask again of the next host after a host is lost."""


class RayBackendSettings(BaseModel):
    """How the serving process uses the cluster (CLI flags; never project files)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    address: str | None = None  # a running cluster (``ray start --head``); None starts one of its own
    hosts: int | None = Field(default=None, ge=1, le=1024)  # default: one per alive node
    host_utility_slots: int = Field(default=16, ge=1, le=1024)
    replace_lost_hosts: bool = True
    fence_after_s: float = Field(default=FENCE_AFTER_S, gt=0)  # see host.SilenceFence
    # T: a utility command lives only while its lease holds (see utility_tasks.COMMAND_LEASE_S)
    command_lease_s: float = Field(default=COMMAND_LEASE_S, ge=0.5, le=3600)
    # a host whose drains go unanswered this long is taken for lost (see LOST_AFTER_SILENCE_S)
    lost_after_silence_s: float = Field(default=LOST_AFTER_SILENCE_S, gt=0)
    # how long a started host has to answer (HOST_START_TIMEOUT_S); it waits that long, and
    # FIRST_DRAIN_MARGIN_S more, for its first drain (see first_drain_within_s)
    host_start_timeout_s: float = Field(default=HOST_START_TIMEOUT_S, gt=0)

    @property
    def first_drain_within_s(self) -> float:
        """How long a cast host waits for its first drain before its silence fence ends it: the
        start allowance and ``FIRST_DRAIN_MARGIN_S``, and never less than ``fence_after_s``.

        The fence counts from the host's construction; the serving process gives the host
        ``host_start_timeout_s`` from its submission to answer, and drains it as soon as it
        answers. Before, the host waited ``fence_after_s`` (45 s) for that first drain, less than
        the 60 s it may take to answer: a host whose answer was slow to arrive was accepted, then
        found ended by its own fence (its casts lost with it), or ended itself undrained while the
        serving process still waited for it. Derived from the start allowance, the host never
        gives up before the serving process does; a host the serving process gives up on has its
        grant revoked and ends itself on finding it gone."""
        return max(self.fence_after_s, self.host_start_timeout_s + FIRST_DRAIN_MARGIN_S)


@dataclass
class HostRef:
    host_id: str
    actor: Any
    node_id: str = ""
    pid: int = 0
    alive: bool = True
    sessions: set[str] = field(default_factory=set)
    lost_at: float | None = None  # when its grant was revoked (its casts are recast T + margin later)
    drainer: threading.Thread | None = None
    grant: str | None = None  # its fencing token (utility_tasks.grant_key), deleted when it is lost


@dataclass
class _Placed:
    ctx: Any  # castor.runtime.SessionContext (the serving process's session)
    host_id: str | None = None
    ready: threading.Event = field(default_factory=threading.Event)  # set: no placement under way
    failure: CastorError | None = None  # why the last placement failed: the next call places it again
    placing: threading.Lock = field(default_factory=threading.Lock)  # one placement again at a time
    # until when (time.monotonic()) a cast it runs again may meet the commands of a host it lost
    fenced_until: float = 0.0


def ray_errors() -> tuple[type[BaseException], ...]:
    import ray.exceptions as rex

    return (rex.RayActorError,)


_VERSIONS = re.compile(r"Ray:\s*(\S+)\s*Python:\s*(\S+)")


def refusal_of_ray_init(exc: RuntimeError, address: str) -> CastorError:
    """The typed error for a ``RuntimeError`` of ``ray.init``. Ray refuses a driver whose Ray or
    Python version differs from the cluster's (``Version mismatch``, over several lines): that is
    ``conflict`` with reason ``ray_version_mismatch``, naming both sides' versions on one line.
    Any other refusal is ``not_found`` with reason ``ray_connect_failed`` and Ray's words."""
    text = str(exc)
    if text.startswith("Version mismatch"):
        found = _VERSIONS.findall(text)
        if len(found) == 2:
            (cluster_ray, cluster_py), (own_ray, own_py) = found
            shown = (f"the cluster runs Ray {cluster_ray} on Python {cluster_py}, this process Ray {own_ray} on "
                     f"Python {own_py}")
        else:
            shown = " ".join(text.split())
        return Conflict(f"cannot join the Ray cluster at {address}: {shown}; the driver (castor) must run the "
                        "cluster's Ray and Python versions: install castor where they match, or start the "
                        "cluster with this machine's", data={"reason": "ray_version_mismatch", "address": address})
    return NotFound(f"cannot connect to the Ray cluster at {address}: {' '.join(text.split())}",
                    data={"reason": "ray_connect_failed", "address": address})


def keep_ray_messages_off_stdout() -> None:
    """Send the cluster's error messages that Ray prints in every driver to castor's log (stderr)
    instead of stdout. Ray's driver prints them -- a node marked dead, "Raylet is terminated" with
    the last 20 lines of that raylet's log, a worker killed -- on ``sys.stdout`` whatever
    ``log_to_driver`` says, so a node lost mid-cast put some 25 lines of Ray's log among ``castor
    cast``'s output and in the JSON report of ``castor soak --json``. Idempotent; a Ray without the
    function it patches (another minor) is left as it is."""
    import importlib

    worker = importlib.import_module("ray._private.worker")  # no public name for it
    original = getattr(worker, "print_to_stdstream", None)
    if original is None or getattr(original, "castor_patched", False):
        return
    log = logger.bind(actor="/ray")

    def to_log(data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("is_err"):  # already stderr's: as Ray prints it
            original(data, ignore_prefix)
            return
        for message in data.get("lines") or []:
            first, _, rest = str(message).strip().partition("\n")
            log.warning("Ray ({who}): {first}{more}", who=data.get("pid", "?"), first=first,
                        more=f" (+{rest.count(chr(10)) + 1} lines: see the node's Ray logs)" if rest else "")
            if rest:
                log.debug("Ray ({who}), the rest: {rest}", who=data.get("pid", "?"), rest=rest)

    to_log.castor_patched = True  # type: ignore[attr-defined]
    setattr(worker, "print_to_stdstream", to_log)  # noqa: B010 - a module Ray types do not describe


#: A line of Ray's C++ log: ``[2026-12-07 00:04:54,230 W 22663 22663] network_util.cc:330: ...``.
_RAY_CORE_LOG_LINE = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ([DIWEF]) \d+ \d+\] ")


class _ToCastorLog(logging.Handler):
    """A record of Ray's Python loggers as a line of castor's log: below ERROR at INFO (shown with
    ``CASTOR_LOG_LEVEL=INFO``), ERROR and above as a castor warning."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            words = " ".join(record.getMessage().split())
        except Exception:  # noqa: BLE001 - a record whose arguments do not format: its template
            words = " ".join(str(record.msg).split())
        logger.bind(actor="/ray").log("WARNING" if record.levelno >= logging.ERROR else "INFO",
                                      "Ray ({name}): {words}", name=record.name, words=words)


_RAY_LOG_HANDLER = _ToCastorLog()


def keep_ray_logging_off_stderr() -> None:
    """Send the records of Ray's Python loggers to castor's log (:class:`_ToCastorLog`), one line
    each. Ray's own handler printed them on stderr among castor's lines. Idempotent."""
    ray_logger = logging.getLogger("ray")
    if ray_logger.handlers != [_RAY_LOG_HANDLER]:
        for handler in list(ray_logger.handlers):
            ray_logger.removeHandler(handler)
        ray_logger.addHandler(_RAY_LOG_HANDLER)
    ray_logger.propagate = False


@contextmanager
def ray_init_output_to_log() -> Iterator[None]:
    """Keep what ``ray.init`` prints out of castor's stderr, as castor log lines instead:

    - Ray's Python records. ``ray.init(configure_logging=False)`` drops every handler of Ray's
      logger, so its records met Python's last-resort handler, which printed them on stderr: a local
      Ray's start printed "Token authentication is enabled for this Ray cluster. Set
      RAY_AUTH_MODE=disabled to opt out. ..." in every ``castor cast --backend ray``. Meanwhile the
      last resort is :class:`_ToCastorLog`, and Ray's logger gets it back afterwards.
    - The lines Ray's C++ core writes to the process's stderr until the driver's log files exist
      (on a machine that cannot reach 8.8.8.8: ``[... W ...] network_util.cc:330: Failed to
      determine local IP via external connectivity ...``): each goes to castor's log (INFO; E and F
      lines as warnings). Whatever else reached stderr meanwhile (castor's own lines) is written
      back as it was, in its order. Processes started meanwhile keep their stderr in a file nobody
      reads (Ray sends its daemons' output to their own log files).
    """
    import os
    import sys
    import tempfile

    log = logger.bind(actor="/ray")
    sys.stderr.flush()
    saved = os.dup(2)
    last_resort = logging.lastResort
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        logging.lastResort = _RAY_LOG_HANDLER
        try:
            yield
        finally:
            logging.lastResort = last_resort
            keep_ray_logging_off_stderr()
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            for line in caught.read().decode(errors="replace").splitlines():
                found = _RAY_CORE_LOG_LINE.match(line)
                if found is None:
                    sys.stderr.write(line + "\n")
                    sys.stderr.flush()
                else:
                    log.log("WARNING" if found.group(1) in "EF" else "INFO", "Ray (core): {line}", line=line)


class RayBackend:
    """Cast hosts on a Ray cluster and the routing of sessions to them."""

    def __init__(
        self, settings: RayBackendSettings | None = None, *, host_runtime: dict[str, Any] | None = None
    ) -> None:
        import ray

        self.settings = settings or RayBackendSettings()
        self.log = logger.bind(actor="/ray")
        keep_ray_messages_off_stdout()  # before ray.init, which starts the thread that prints them
        keep_ray_logging_off_stderr()
        if not ray.is_initialized():
            try:
                # No address: a Ray of this process's own ("local"). Ray's default (None) joins the
                # cluster RAY_ADDRESS or the world-writable /tmp/ray/ray_current_cluster names: a
                # stale one (castor waited on it) or another user's.
                with ray_init_output_to_log():
                    ray.init(address=self.settings.address or "local", namespace=RAY_NAMESPACE,
                             log_to_driver=False, include_dashboard=False, configure_logging=False)
            except ConnectionError as exc:  # an OSError: the CLI would call it storage_unavailable
                address = self.settings.address or "auto"
                hint = "" if address == "auto" else (
                    "; a cluster with token authentication also needs RAY_AUTH_MODE=token and its token "
                    "(RAY_AUTH_TOKEN or ~/.ray/auth_token) here: Ray never enables it for an explicit address")
                raise NotFound(f"cannot connect to the Ray cluster at {address}: {exc}{hint}",
                               data={"reason": "ray_connect_failed", "address": address}) from None
            except RuntimeError as exc:  # Ray's version check (and its other refusals): a traceback before
                raise refusal_of_ray_init(exc, self.settings.address or "local") from None
        self._ray = ray
        self._host_runtime = {"utility_slots": self.settings.host_utility_slots, **(host_runtime or {})}
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self.hosts: dict[str, HostRef] = {}
        self._placed: dict[str, _Placed] = {}
        self._counter = 0
        self._io = ThreadPoolExecutor(max_workers=8, thread_name_prefix="castor-ray-relay-io")
        self.recoveries: list[dict[str, Any]] = []  # host lost -> casts running again (for bench/ops)
        self._holder = self._own_job()
        self.sweep_ended_holders_grants()
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        count = self.settings.hosts or max(1, len(nodes))
        refs = [self._start_host(nodes[i % len(nodes)]["NodeID"] if nodes else None) for i in range(count)]
        self._await_hosts(refs)

    # -- hosts -----------------------------------------------------------------
    def _start_host(self, node_id: str | None) -> HostRef:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from castor.scaleout.host import CastHost

        with self._lock:
            self._counter += 1
            host_id = f"host-{self._counter}"
        options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 64, "max_restarts": 0,
                                   "name": f"castor-{host_id}-{id(self):x}", "lifetime": None}
        if node_id:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
        grant = f"{host_id}-{uuid.uuid4().hex}"  # unique on the cluster, whoever else serves on it
        self._hold_grant(grant)  # before the host starts: it ends itself as soon as it finds none
        try:
            actor = self._ray.remote(CastHost).options(**options).remote(
                host_id, self._host_runtime, self.settings.fence_after_s, self.settings.command_lease_s, grant,
                self.settings.first_drain_within_s)
        except BaseException:
            self._revoke(HostRef(host_id=host_id, actor=None, grant=grant))  # no host holds it
            raise
        ref = HostRef(host_id=host_id, actor=actor, grant=grant)
        with self._lock:
            self.hosts[host_id] = ref
        return ref

    def _await_hosts(self, refs: list[HostRef]) -> None:
        """Wait for every started host at once, each drained as soon as it answers; the first
        failure is raised once each has answered or failed. Before, they were awaited in turn: a
        host up early waited undrained while an earlier one started (up to 60 s on a busy cluster),
        and its silence fence (``fence_after_s``, counted from its start) ended it first: the
        serving process's start failed ``could not start (ActorDiedError)``."""
        with ThreadPoolExecutor(max_workers=max(1, min(32, len(refs))),
                                thread_name_prefix="castor-ray-host-start") as starting:
            waits = [starting.submit(self._await_host, ref) for ref in refs]
        for wait in waits:
            failure = wait.exception()
            if failure is not None:
                raise failure

    def _await_host(self, ref: HostRef, timeout_s: float | None = None) -> None:
        """Wait for a started host to answer (within ``timeout_s``, by default the settings'
        ``host_start_timeout_s``), then drain it. A host that does not start (in time, or at all:
        its node died first) is taken for not alive and its actor killed, so a late start leaves
        no host that ``ops.hosts`` lists alive, replacements count, or nobody drains."""
        import ray.exceptions as rex

        if timeout_s is None:
            timeout_s = self.settings.host_start_timeout_s
        try:
            info = self._ray.get(ref.actor.ping.remote(), timeout=timeout_s)
        except rex.RayError as exc:
            with self._lock:
                ref.alive = False
                ref.lost_at = time.monotonic()
            self._revoke(ref)
            try:
                self._ray.kill(ref.actor, no_restart=True)
            except Exception as gone:  # noqa: BLE001 - already gone: nothing to end
                self.log.info("cast host {host} that did not start: {exc}", host=ref.host_id, exc=type(gone).__name__)
            if isinstance(exc, rex.GetTimeoutError):  # a TimeoutError, so an OSError: the CLI said storage_unavailable
                raise Timeout(f"cast host {ref.host_id} did not start within {timeout_s:.0f}s: the cluster is too busy "
                              "or short of memory to start its process", may_have_started=False,
                              data={"host_id": ref.host_id, "reason": "host_start_timeout"}) from None
            raise ActorCrashed(f"cast host {ref.host_id} could not start ({type(exc).__name__})",
                               may_have_started=False, data={"host_id": ref.host_id}) from None
        ref.node_id, ref.pid = info["node_id"], info["pid"]
        theirs = str(info.get("castor_version", "unknown"))
        if theirs != __version__:  # the node runs another castor: its host speaks another protocol
            with self._lock:
                ref.alive = False
                ref.lost_at = time.monotonic()
            self._revoke(ref)
            self._ray.kill(ref.actor, no_restart=True)
            raise Conflict(f"cast host {ref.host_id} on node {ref.node_id[:12]} runs castor {theirs}, this process "
                           f"castor {__version__}: every node must run this process's castor version",
                           may_have_started=False, data={"host_id": ref.host_id, "node_id": ref.node_id,
                                                         "reason": "castor_version_mismatch"})
        ref.drainer = start_thread(self._drain, args=(ref,), name=f"castor-ray-drain-{ref.host_id}",
                                   owner="/scaleout", purpose="drains a cast host's events")
        self.log.info("cast host {host} up on node {node} (pid {pid})", host=ref.host_id, node=ref.node_id[:12],
                      pid=ref.pid)

    def live_hosts(self) -> list[HostRef]:
        with self._lock:
            return [h for h in self.hosts.values() if h.alive]

    def hosts_view(self, timeout_s: float = HOSTS_VIEW_TIMEOUT_S) -> list[dict[str, Any]]:
        """Every host, its node, its sessions and (for live ones) its live casts. Live hosts are
        asked at once, with one deadline: a host that does not answer within ``timeout_s`` (its
        node cut off from the cluster, not declared dead yet) gets ``error`` saying so. Before,
        each was asked in turn for up to 5 s, so a few cut-off hosts made ``ops.hosts`` outlast
        its caller's deadline, and the table showed such a host alive with no casts."""
        hosts = list(self.hosts.values())
        asked: dict[str, Any] = {}
        for ref in hosts:
            if ref.alive:
                try:
                    asked[ref.host_id] = ref.actor.ping.remote()
                except Exception as exc:  # noqa: BLE001 - shown as it is
                    asked[ref.host_id] = exc
        pending = [r for r in asked.values() if not isinstance(r, Exception)]
        ready = set(self._ray.wait(pending, num_returns=len(pending), timeout=timeout_s)[0]) if pending else set()
        out = []
        for ref in hosts:
            row: dict[str, Any] = {"host_id": ref.host_id, "node_id": ref.node_id, "pid": ref.pid, "alive": ref.alive,
                                   "sessions": sorted(ref.sessions), "casts": []}
            answer = asked.get(ref.host_id)
            if isinstance(answer, Exception):
                row["error"] = type(answer).__name__
            elif answer is not None and answer not in ready:
                row["error"] = (f"no answer within {timeout_s:g} s: its node may be cut off from the cluster "
                                "(taken for lost once the cluster declares it dead)")
            elif answer is not None:
                try:
                    row["casts"] = self._ray.get(answer, timeout=1.0)["casts"]
                except Exception as exc:  # noqa: BLE001 - shown as it is
                    row["error"] = type(exc).__name__
            out.append(row)
        return out

    def host_actors(self, prefix: str = "", timeout_s: float = 3.0) -> list[dict[str, Any]]:
        """The actors of each live host's sessions under ``prefix`` (casts, sockets, their
        supervisors), each labelled ``host``: what ``ops.actors`` adds to the serving process's own
        tree. A host that does not answer within ``timeout_s`` adds nothing (``ops.hosts`` says why)."""
        hosts = self.live_hosts()
        refs = [h.actor.snapshot.remote() for h in hosts]
        if not refs:
            return []
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        out: list[dict[str, Any]] = []
        for host, ref in zip(hosts, refs, strict=True):
            if ref not in ready:
                continue
            try:
                actors = self._ray.get(ref, timeout=0.1)
            except Exception:  # noqa: BLE001 - a host lost meanwhile: the drain takes it for lost
                continue
            with self._lock:
                sessions = set(host.sessions)
            for actor in actors:
                path = str(actor.get("path", ""))
                parts = path.split("/")
                if len(parts) < 5 or parts[1:3] != ["root", "session"] or parts[3] not in sessions:
                    continue  # the host's own root and session supervisors: the serving process shows its own
                if not at_or_under(path, prefix):
                    continue
                actor["labels"] = {**(actor.get("labels") or {}), "host": host.host_id}
                out.append(actor)
        return out

    # -- sessions ----------------------------------------------------------------
    def open_session(self, ctx: Any, timeout_s: float = PLACE_TIMEOUT_S) -> str | None:
        """Place the session on the least-loaded live host within ``timeout_s`` (the caller's own
        deadline: the session opening's). A placement that fails in time (no live host, or the
        host did not answer) is kept as the session's ``failure``, and the session opens all the
        same: each later call places it again within that call's own deadline (``host_of``),
        failing with the placement's typed error. Before, an opening waited up to 60 s for a host,
        past its caller's deadline, and placed the session behind the caller's back."""
        sid = ctx.info.session_id
        with self._lock:
            placed = self._placed.setdefault(sid, _Placed(ctx=ctx))
            placed.ctx = ctx
            held_by = self.hosts.get(placed.host_id or "")
            if held_by is not None and held_by.alive and sid in held_by.sessions and placed.ready.is_set():
                return held_by.host_id  # open there already (its actor here restarted): kept
        try:
            host_id = self._place(placed, deadline=time.monotonic() + timeout_s, ready=False)
        except CastorError as exc:
            placed.failure = exc
            self.log.warning("session {sid} is not placed yet (its next call tries again): {exc}", sid=sid, exc=exc)
            return None
        finally:
            placed.ready.set()
        placed.failure = None
        return host_id

    def _place(self, placed: _Placed, avoid: str | None = None, *, ready: bool = True,
               deadline: float | None = None) -> str:
        """Open the session on the least-loaded live host by ``deadline`` (default: in
        ``PLACE_TIMEOUT_S``). With ``ready=False`` callers keep waiting (``host_of``) until the
        placer sets ``placed.ready`` itself. A host that does not answer the opening in time, or
        answers once the session was closed, is told to close it again (best effort), so no host
        keeps a session nobody holds."""
        sid = placed.ctx.info.session_id
        began = time.monotonic()
        deadline = began + PLACE_TIMEOUT_S if deadline is None else deadline
        while True:
            with self._lock:
                live = [h for h in self.hosts.values() if h.alive and h.host_id != avoid and h.drainer is not None]
                if not live:
                    live = [h for h in self.hosts.values() if h.alive and h.drainer is not None]
            if live:
                break
            if time.monotonic() >= deadline:
                raise Timeout(f"no live cast host on the cluster to open session {sid!r} on within "
                              f"{deadline - began:.1f} s (every host lost, and none could be started again: "
                              "see `castor inspect hosts` and the cluster's nodes)", may_have_started=False,
                              data={"session_id": sid, "reason": "no_live_cast_host"})
            self._closed.wait(min(0.05, max(0.0, deadline - time.monotonic())))
        host = min(live, key=lambda h: (len(h.sessions), h.host_id))
        has_context = bool(placed.ctx.harness.host_context and placed.ctx.harness.host_context.has_context)
        label = str(getattr(placed.ctx.harness.agent, "agent_label", "Pi agent"))
        try:
            # the harness's kind: the host's session names the commands of the surface the user is on
            # (/materia recast in a harness session, castor recast ID from a castor command)
            answer = self._get(host, host.actor.open_session.remote(placed.ctx.info.model_dump(), has_context, None,
                                                                    label, str(placed.ctx.harness.kind)),
                               timeout_s=max(0.1, deadline - time.monotonic()))
        except Timeout:
            self._release(host, sid)  # it may open the session once the caller has gone
            raise
        if "error" in answer:
            raise CastorError.from_wire(answer["error"])
        with self._lock:
            held = self._placed.get(sid) is placed and not self._closed.is_set()
            if held:
                host.sessions.add(sid)
                placed.host_id = host.host_id
                if ready:
                    placed.ready.set()
        if not held:  # closed while its opening ran: nobody holds it
            self._release(host, sid)
            raise NotFound(f"session {sid!r} was closed while it was being placed", data={"session_id": sid})
        self.log.info("session {sid} placed on {host}", sid=sid, host=host.host_id)
        return host.host_id

    def _release(self, host: HostRef, sid: str) -> None:
        """Ask ``host`` to close ``sid`` without waiting for its answer (best effort)."""
        try:
            host.actor.close_session.remote(sid)
        except Exception as exc:  # noqa: BLE001 - the host is gone: so is its session
            self.log.info("releasing session {sid} on {host}: {exc}", sid=sid, host=host.host_id,
                          exc=type(exc).__name__)

    def close_session(self, sid: str, wait_s: float = SESSION_CLOSE_WAIT_S) -> None:
        """Forget the session at once (relay items for it are answered ``not_found``), then ask its
        host to close it there and wait up to ``wait_s`` for the answer. The host's close is best
        effort: one that does not answer in time (its node cut off) is logged and left to finish
        there, or to the host's fence (a host nobody drains stops its casts, saved, and exits).
        Before, closing waited up to 30 s for a cut-off host."""
        with self._lock:
            placed = self._placed.pop(sid, None)
            host = self.hosts.get(placed.host_id) if placed and placed.host_id else None
            if host is not None:
                host.sessions.discard(sid)
        if host is not None and host.alive:
            try:
                self._ray.get(host.actor.close_session.remote(sid), timeout=wait_s)
            except Exception as exc:  # noqa: BLE001 - the host may be gone; its casts stay on disk
                self.log.warning("closing session {sid} on {host} (it goes on there, best effort): {exc}", sid=sid,
                                 host=host.host_id, exc=type(exc).__name__)

    def host_of(self, sid: str, timeout_s: float) -> HostRef:
        """The session's host, within ``timeout_s``: waiting for a placement under way (a lost
        host's sessions moving), or placing the session again when its last placement failed."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            placed = self._placed.get(sid)
        if placed is None:
            raise NotFound(f"session {sid!r} has no cast host", data={"session_id": sid})
        if not placed.ready.wait(timeout_s):
            raise Timeout(f"session {sid!r} is being placed on a new cast host", may_have_started=False,
                          data={"session_id": sid})
        if placed.failure is not None:
            self._place_again(placed, deadline)
        with self._lock:
            return self.hosts[placed.host_id or ""]

    def _place_again(self, placed: _Placed, deadline: float) -> None:
        """Place a session whose last placement failed, by ``deadline`` (one caller at a time)."""
        if not placed.placing.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise Timeout(f"session {placed.ctx.info.session_id!r} is being placed on a cast host",
                          may_have_started=False, data={"session_id": placed.ctx.info.session_id})
        try:
            if placed.failure is None:
                return
            try:
                self._place(placed, deadline=deadline)
            except CastorError as exc:
                placed.failure = exc
                raise
            placed.failure = None
        finally:
            placed.placing.release()

    def call(self, sid: str, verb: str, params: dict[str, Any], timeout_s: float = CALL_TIMEOUT_S) -> dict[str, Any]:
        """Run one materia verb on the session's host. A read-only verb that meets a lost host is
        asked again of the host the session moves to (it changed nothing); any other verb fails
        ``actor_crashed`` with ``may_have_started: true``, because the lost host may have run it.
        The session's closing verb (``session_end``, best effort) has ``SESSION_CLOSE_WAIT_S`` at
        most, and nothing to do for a session never placed."""
        if verb == ENDING_VERB:
            with self._lock:
                placed = self._placed.get(sid)
            if placed is None or placed.failure is not None:
                return {}  # never placed (or closed already): nothing of it runs on a host
            timeout_s = min(timeout_s, SESSION_CLOSE_WAIT_S)
        started = time.monotonic()
        while True:
            host = self.host_of(sid, max(0.1, timeout_s - (time.monotonic() - started)))
            left = max(0.1, timeout_s - (time.monotonic() - started))
            try:
                if verb in RESUMING_VERBS:
                    self._hold_if_fenced(host, sid, params, left)
                return self._call_on(host, sid, verb, params, left)
            except ActorCrashed:
                if verb not in READ_ONLY_VERBS or time.monotonic() - started >= timeout_s:
                    raise

    def _hold_if_fenced(self, host: HostRef, sid: str, params: dict[str, Any], timeout_s: float) -> None:
        """Before a cast of ``sid`` is run again by hand (``recast``, ``continue``, ``revive``):
        while a host the session lost may still run commands (its grant revoked less than
        ``command_lease_s`` + ``LEASE_MARGIN_S`` ago), the cast's new host is told to start none
        of its commands until then, as the recovery's own recasts are."""
        with self._lock:
            placed = self._placed.get(sid)
        left = (placed.fenced_until if placed is not None else 0.0) - time.monotonic()
        if left <= 0:
            return
        cast_id = params.get("cast_id") or self._call_on(host, sid, "status", {}, timeout_s).get("cast_id")
        if cast_id:
            self._get(host, host.actor.hold_commands.remote([str(cast_id)], left), timeout_s=timeout_s)

    def _call_on(self, host: HostRef, sid: str, verb: str, params: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """One materia verb on ``host``, whether or not the session's placement is ready."""
        answer = self._get(host, host.actor.call.remote(sid, verb, params, timeout_s), timeout_s=timeout_s + 0.5)
        if "error" in answer:
            raise CastorError.from_wire(answer["error"])
        result: dict[str, Any] = answer["ok"]
        return result

    def _get(self, host: HostRef, ref: Any, timeout_s: float = 30.0) -> Any:
        """``ray.get`` with Ray's failures as castor's typed errors (``may_have_started`` truthful)."""
        import ray.exceptions as rex

        try:
            return self._ray.get(ref, timeout=timeout_s)
        except rex.GetTimeoutError:
            raise Timeout(f"cast host {host.host_id} did not answer within {timeout_s:.1f}s", may_have_started=True,
                          data={"host_id": host.host_id}) from None
        except rex.RayActorError as exc:
            self._host_lost(host, type(exc).__name__)
            raise ActorCrashed(f"cast host {host.host_id} was lost ({type(exc).__name__})", may_have_started=True,
                               data={"host_id": host.host_id}) from None
        except rex.RayTaskError as exc:  # the host's method raised: castor's own error, or a bug named
            cause = exc.cause if isinstance(exc.cause, BaseException) else exc
            if isinstance(cause, CastorError):
                raise cause from None
            words = " ".join(str(cause).split())[:300]
            raise Internal(f"cast host {host.host_id} failed: {type(cause).__name__}: {words}", may_have_started=True,
                           data={"host_id": host.host_id}) from None
        except rex.RayError as exc:
            words = " ".join(str(exc).split())[:300]
            raise Internal(f"cluster error on {host.host_id}: {type(exc).__name__}: {words}", may_have_started=True,
                           data={"host_id": host.host_id}) from None

    # -- the relay -----------------------------------------------------------------
    def _drain(self, host: HostRef) -> None:
        """Drain ``host`` until it is lost. A host whose drains have gone unanswered for
        ``lost_after_silence_s`` is taken for lost too, and killed (best effort: a stopped process
        on a live node is, a cut-off one cannot be): before, a stopped host (SIGSTOP, a frozen VM)
        was drained for ever, every call for its sessions timed out and its casts never moved."""
        errors = ray_errors()
        silence_s = self.settings.lost_after_silence_s
        heard = time.monotonic()
        while not self._closed.is_set() and host.alive:
            wait_s = DRAIN_WAIT_S + max(0.5, min(30.0, heard + silence_s - time.monotonic()))
            try:
                items = self._ray.get(host.actor.drain.remote(256, DRAIN_WAIT_S), timeout=wait_s)
            except errors as exc:
                self._host_lost(host, type(exc).__name__)
                return
            except Exception as exc:  # noqa: BLE001 - a slow cluster: try again, up to the silence
                if self._closed.is_set():
                    return
                if time.monotonic() - heard >= silence_s:
                    self._host_lost(host, f"no answer to its drains for {silence_s:g} s")
                    self._kill_quietly(host)
                    return
                self.log.warning("draining {host}: {exc}", host=host.host_id, exc=type(exc).__name__)
                continue
            heard = time.monotonic()
            for item in items:
                try:
                    self._deliver(host, item)
                except Exception as exc:  # noqa: BLE001 - one bad item must not stop the relay
                    self.log.opt(exception=exc).error("relay item {op} of {sid} failed", op=item.get("op"),
                                                      sid=item.get("session_id"))

    def _deliver(self, host: HostRef, item: dict[str, Any]) -> None:
        sid, op, args, request_id = item["session_id"], item["op"], item["args"], item.get("request_id")
        with self._lock:
            placed = self._placed.get(sid)
        if placed is None:
            if request_id is not None:
                host.actor.answer.remote(request_id, False, NotFound("session closed").to_wire())
            return
        harness = placed.ctx.harness
        if op == "run_turn":
            def reply(outcome: TurnOutcome, host: HostRef = host) -> None:
                if self._closed.is_set() or not host.alive:
                    return  # its cast is gone with its host (re-placed casts re-dispatch) or we are closing
                try:
                    host.actor.turn_ended.remote(sid, outcome.model_dump(mode="json"))
                except Exception as exc:  # noqa: BLE001 - a late answer to a lost host is dropped
                    self.log.info("turn {turn} answered after its host went: {exc}", turn=outcome.turn_id,
                                  exc=type(exc).__name__)

            if harness.agent is None:
                reply(TurnOutcome(turn_id=args["turn_id"], stop_reason="error"))
                return
            harness.agent.run_turn(TurnRequest.model_validate(args), enqueues_only(reply))
        elif op == "cancel":
            if harness.agent is not None:
                note = getattr(harness.agent, "note_stop_reason", None)
                if note is not None and args.get("reason"):
                    note(args["turn_id"], args["reason"])  # agent.abort_turn carries why (cast_aborted, …)
                harness.agent.cancel(args["turn_id"])
        elif op == "notify":
            if harness.ui is not None:
                harness.ui.notify(args["message"], args.get("level", "info"), code=args.get("code"))
        elif op == "status":
            if harness.ui is not None:
                harness.ui.set_status(args["key"], args.get("text"))
        elif op == "send_message":
            if harness.ui is not None:
                harness.ui.send_message(args["custom_type"], args["content"], display=args["display"],
                                        trigger_turn=args.get("trigger_turn", False))
        elif op in ("append_entry", "context_usage", "compact"):
            self._io.submit(self._answer_request, host, harness, op, args, int(request_id or 0))
        else:
            raise InvalidParams(f"unknown relay op {op!r}")

    def _answer_request(self, host: HostRef, harness: Any, op: str, args: dict[str, Any], request_id: int) -> None:
        try:
            if op == "append_entry":
                if harness.session_log is not None:
                    harness.session_log.append_entry(args["custom_type"], args["data"],
                                                     time.monotonic() + float(args.get("timeout_s", 10.0)),
                                                     expires=bool(args.get("expires", False)))
                value: Any = None
            elif op == "context_usage":
                usage = harness.host_context.context_usage(float(args["timeout_s"])) if harness.host_context else None
                value = usage.usage_map() if usage is not None else None
            else:
                done = threading.Event()
                out: list[Any] = []

                def compacted(outcome: Any) -> None:
                    out.append(outcome.model_dump(mode="json"))
                    done.set()

                harness.host_context.compact(CompactionRequest.model_validate(args["request"]), compacted,
                                             timeout_s=float(args["timeout_s"]))
                done.wait(float(args["timeout_s"]) + 1)
                value = out[0] if out else None
            host.actor.answer.remote(request_id, True, value)
        except CastorError as exc:
            host.actor.answer.remote(request_id, False, exc.to_wire())

    # -- faults ----------------------------------------------------------------------
    def _kill_quietly(self, host: HostRef) -> None:
        """End a host taken for lost (best effort: a host on a node cut off cannot be reached)."""
        try:
            self._ray.kill(host.actor, no_restart=True)
        except Exception as exc:  # noqa: BLE001 - gone already, or out of reach: its grant is revoked
            self.log.info("ending lost cast host {host}: {exc}", host=host.host_id, exc=type(exc).__name__)

    def _grant_store(self) -> Any:
        """The GCS's client of this driver (its key-value calls take a timeout), or None for a Ray
        Client driver (``ray://``), whose store is reached through ``ray.experimental.internal_kv``."""
        return getattr(self._ray._private.worker.global_worker, "gcs_client", None)  # noqa: SLF001 - bounded calls

    def _own_job(self) -> bytes:
        """What this serving process's grant keys hold: its Ray job (:func:`grant_holder`), or
        ``held`` when Ray does not say (then no later serving process sweeps them)."""
        try:
            return grant_holder(str(self._ray.get_runtime_context().get_job_id()))
        except Exception:  # noqa: BLE001 - a driver without a job id: its keys are only never swept
            return b"held"

    def sweep_ended_holders_grants(self) -> list[str]:
        """Delete the grant keys whose holder, a serving process, has ended; answer the grants
        deleted. A serving process killed outright (``kill -9``) deletes nothing: its live hosts'
        keys stayed in the cluster's key-value store for as long as the cluster ran, one per host
        (Ray ends those hosts with their owner). Each key names its holder's Ray job, so the next
        serving process on the cluster deletes the keys of every job the cluster lists as ended.

        Safe whoever else serves on the cluster: a key is deleted only when its own job is listed
        dead, never a live job's, nor a key that names no job (an earlier castor's); and a deletion
        only ever revokes: a host of an ended job, and its commands, end on finding it gone, as a
        lost host's do. Best effort: a store or job table that does not answer is logged, and a Ray
        Client driver (``ray://``), which has no job table at hand, sweeps nothing."""
        client = self._grant_store()
        if client is None:
            return []
        try:
            jobs = client.get_all_job_info(skip_submission_job_info_field=True, skip_is_running_tasks_field=True,
                                           timeout=REVOKE_TIMEOUT_S)
            ended = {bytes(info.job_id).hex() for info in jobs.values() if info.is_dead}
            keys = client.internal_kv_keys(GRANT_KEY_PREFIX, GRANT_NAMESPACE, timeout=REVOKE_TIMEOUT_S)
            held = client.internal_kv_multi_get(keys, GRANT_NAMESPACE, timeout=REVOKE_TIMEOUT_S) if keys else {}
        except Exception as exc:  # noqa: BLE001 - the control plane is slow: the keys wait for the next serve
            self.log.warning("cannot sweep the grant keys of ended serving processes: {exc}", exc=type(exc).__name__)
            return []
        swept = []
        for key, value in held.items():
            if holder_of(value) not in ended:
                continue
            try:
                client.internal_kv_del(key, False, GRANT_NAMESPACE, timeout=REVOKE_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - as above
                self.log.warning("cannot delete grant key {key}: {exc}", key=key, exc=type(exc).__name__)
                continue
            swept.append(key[len(GRANT_KEY_PREFIX):].decode(errors="replace"))
        if swept:
            self.log.info("deleted {n} grant key(s) of ended serving processes: {grants}", n=len(swept),
                          grants=", ".join(swept))
        return swept

    def _hold_grant(self, grant: str) -> None:
        """Write ``grant``'s key (:func:`castor.scaleout.utility_tasks.grant_key`): the host it is
        given to, and its commands, run only while the key is there. A store that does not take it
        fails the host's start (the host would find itself revoked at once)."""
        client = self._grant_store()
        try:
            if client is not None:
                client.internal_kv_put(grant_key(grant), self._holder, True, GRANT_NAMESPACE,
                                       timeout=REVOKE_TIMEOUT_S)
            else:
                from ray.experimental import internal_kv

                internal_kv._internal_kv_put(grant_key(grant), self._holder, namespace=GRANT_NAMESPACE)  # noqa: SLF001
        except Exception as exc:  # noqa: BLE001 - the control plane does not answer: no host can start
            raise ActorCrashed(f"cannot start a cast host: the cluster's key-value store did not take its grant "
                               f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})", may_have_started=False,
                               data={"reason": "grant_not_stored"}) from None

    def _revoke(self, host: HostRef) -> None:
        """Revoke ``host``'s grant: delete its key from the GCS's key-value store. Its commands end
        at their next lease renewal (those that cannot ask, when their lease lapses), none starts
        any more, and the host ends itself once it learns it. The key is the whole record: a lost
        host leaves nothing in the store, and a stale one that runs again later still finds no key.
        A deletion the GCS does not take is logged: the host's commands then end only with the
        host, or with their node."""
        if host.grant is None:
            return
        key = grant_key(host.grant)
        client = self._grant_store()
        try:
            if client is not None:
                client.internal_kv_del(key, False, GRANT_NAMESPACE, timeout=REVOKE_TIMEOUT_S)
            else:  # a Ray Client driver (ray://): its KV goes through the client server
                from ray.experimental import internal_kv

                internal_kv._internal_kv_del(key, namespace=GRANT_NAMESPACE)  # noqa: SLF001 - Ray's KV
        except Exception as exc:  # noqa: BLE001 - the control plane does not answer: said, the fence still waits
            self.log.error("cannot revoke the grant of lost cast host {host} ({exc}): its commands on live nodes "
                           "may run on until the host ends", host=host.host_id, exc=exc)

    def _host_lost(self, host: HostRef, why: str) -> None:
        with self._lock:
            if not host.alive or self._closed.is_set():
                return
            host.alive = False
        self._revoke(host)  # before lost_at: every renewal its commands got was asked before then
        with self._lock:
            host.lost_at = time.monotonic()
            sessions = sorted(host.sessions)
            host.sessions.clear()
            for sid in sessions:
                placed = self._placed.get(sid)
                if placed is not None:
                    placed.ready.clear()
        self.log.warning("cast host {host} lost ({why}); re-placing {n} session(s)", host=host.host_id, why=why,
                         n=len(sessions))
        if not self._closed.is_set():
            start_thread(self._recover, args=(host, sessions), name=f"castor-ray-recover-{host.host_id}",
                         owner="/scaleout", purpose="moves a lost host's sessions to another host")

    def _recover(self, lost: HostRef, sessions: list[str]) -> None:
        started = time.monotonic()
        # The host's grant was revoked at lost_at: each command it started, on any node, ends at its
        # next lease renewal, or once its lease lapses when its node cannot ask (cut off; a host
        # whose node died may be only cut off, and a stopped one may run again). Its casts are
        # recast at once, but their new host starts none of their commands before then, so no
        # command of theirs runs twice, nor beside the old host's.
        fenced_until = (lost.lost_at or started) + self.settings.command_lease_s + LEASE_MARGIN_S
        if self.settings.replace_lost_hosts:
            candidates: list[str | None] = list(self._nodes_for_replacement(lost)) or [None]
            for node_id in candidates[:2]:  # the next one if the first is dying
                try:
                    ref = self._start_host(node_id)
                    self._await_host(ref)
                    break
                except Exception as exc:  # noqa: BLE001 - the other live hosts take the sessions
                    self.log.warning("no replacement for {host} on node {node}: {exc}", host=lost.host_id,
                                     node=(node_id or "?")[:12], exc=exc)
        recast = 0
        for sid in sessions:
            with self._lock:
                placed = self._placed.get(sid)
            if placed is None:
                continue
            for turn_id in list(getattr(placed.ctx.harness.agent, "pending_turns", lambda: [])()):
                placed.ctx.harness.agent.cancel(turn_id)  # the dead host's turns: their answers go nowhere
            placed.fenced_until = max(fenced_until, placed.fenced_until)  # see _hold_if_fenced
            try:
                # Callers wait until the lost host's casts are recast: a cast the harness started
                # on the new host first would take the session's cast slot and refuse the recast.
                host_id = self._place(placed, avoid=lost.host_id, ready=False)
                with self._lock:
                    host = self.hosts[host_id]
                # A lost host whose process lives on still holds its casts' leases until its fence
                # ends it: re-list until none is held, recasting each as it comes free.
                until = (lost.lost_at or time.monotonic()) + self.settings.fence_after_s + FENCE_MARGIN_S
                while True:
                    orphaned, held = self._casts_left(host, sid)
                    wait = fenced_until - time.monotonic()
                    if orphaned and wait > 0:  # recast at once; their commands wait on the new host
                        self.log.warning("session {sid}: the casts of lost host {host} run their next command in "
                                         "{s:.0f} s, once the leases of the commands it started have lapsed",
                                         sid=sid, host=lost.host_id, s=wait)
                        self._get(host, host.actor.hold_commands.remote(orphaned, wait), timeout_s=CALL_TIMEOUT_S)
                    for cast_id in orphaned:
                        self._call_on(host, sid, "recast", {"cast_id": cast_id}, CALL_TIMEOUT_S)
                        recast += 1
                    if not held or time.monotonic() >= until or self._closed.wait(1.0):
                        break
                if held:
                    self.log.error("casts {ids} of session {sid} are still held {s:.0f} s after their host {host} "
                                   "was lost; recast them once it has ended", ids=held, sid=sid,
                                   s=self.settings.fence_after_s + FENCE_MARGIN_S, host=lost.host_id)
            except CastorError as exc:
                self.log.error("re-placing session {sid}: {exc}", sid=sid, exc=exc)
                if placed.host_id == lost.host_id:  # not moved: its next call places it again
                    placed.failure = exc
            finally:
                placed.ready.set()  # callers go on: with the recast casts, or get the host's own error
        self.recoveries.append({"host_id": lost.host_id, "sessions": len(sessions), "recast": recast,
                                "finished_at": time.monotonic(),
                                "seconds": time.monotonic() - started})

    def _nodes_for_replacement(self, lost: HostRef) -> list[str]:
        """Where a lost host's replacement may start, best first: the live nodes by how few live
        hosts they run, the lost host's own node last among equals (it may be dying: a node just
        removed is still listed alive for a moment). Hosts start one per node; before, every
        replacement went to the first node Ray listed, so a host killed on one node came back on
        another that had one already, and the first node gathered them all."""
        nodes = [str(n["NodeID"]) for n in self._ray.nodes() if n.get("Alive")]
        with self._lock:
            counts = dict.fromkeys(nodes, 0)
            for host in self.hosts.values():
                if host.alive and host.node_id in counts:
                    counts[host.node_id] += 1
        return sorted(nodes, key=lambda node: (counts[node], node == lost.node_id))

    def _casts_left(self, host: HostRef, sid: str) -> tuple[list[str], list[str]]:
        """The session's casts a lost host left: those ``orphaned`` (their lease free: recast them
        now) and those still held (running, not resumable: the lost host may still live)."""
        orphaned: list[str] = []
        held: list[str] = []
        cursor = None
        while True:  # ``list`` is paged
            listing = self._call_on(host, sid, "list", {"limit": 1000, "cursor": cursor}, CALL_TIMEOUT_S)
            for cast in listing.get("casts", []):
                if cast.get("status") == "orphaned":
                    orphaned.append(cast["cast_id"])
                elif cast.get("status") in HELD and not cast.get("resumable"):
                    held.append(cast["cast_id"])
            cursor = listing.get("next_cursor")
            if not cursor:
                return orphaned, held

    def kill_host(self, host_id: str) -> None:
        """Fault injection (``--allow-faults``): SIGKILL a host's process."""
        self._ray.kill(self.hosts[host_id].actor, no_restart=True)

    def shutdown(self) -> None:
        """Stop every live host (each saves its casts) and end its process. The hosts are asked at
        once and have ``SHUTDOWN_TIMEOUT_S`` together: before, each had 30 s in turn, so stopping
        ``castor serve`` while a few hosts' nodes were cut off took 30 s per such host; and a kill
        that raised left the hosts after it running."""
        self._closed.set()
        live = [ref for ref in list(self.hosts.values()) if ref.alive]
        asked = []
        for ref in live:
            try:
                asked.append(ref.actor.shutdown.remote())
            except Exception:  # noqa: BLE001 - best effort: casts persist their state
                pass
        if asked:
            try:
                self._ray.wait(asked, num_returns=len(asked), timeout=SHUTDOWN_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - the cluster is going: the kills below end what is left
                pass
        for ref in live:
            try:
                self._ray.kill(ref.actor, no_restart=True)
            except Exception as exc:  # noqa: BLE001 - already gone with its node
                self.log.info("ending cast host {host}: {exc}", host=ref.host_id, exc=type(exc).__name__)
            self._revoke(ref)  # its key leaves the store with it (a host cut off ends itself on finding none)
        self._io.shutdown(wait=False)


class RemoteSessionActor(Actor):
    """``/root/session/<sid>/materia`` of the Ray backend: each verb runs on the session's cast host."""

    def __init__(self, ctx: Any, backend: RayBackend) -> None:
        super().__init__()
        self.ctx = ctx
        self.backend = backend

    def on_start(self) -> None:
        # Bounded by the session opening's own deadline (the runtime's spawn of the session).
        opening = self.ctx.runtime.settings.session_open_timeout_s
        self.backend.open_session(self.ctx, timeout_s=max(0.1, opening - OPEN_MARGIN_S))

    @handles(*SESSION_VERBS.values())
    def _on_call(self, call: SessionVerb) -> dict[str, Any]:
        return self.backend.call(self.ctx.info.session_id, call.verb, call.arguments())

    def on_terminate(self, cause: str) -> None:
        self.backend.close_session(self.ctx.info.session_id)


def ray_materia_component(backend: RayBackend) -> Any:
    """The materia session component with every cast on the cluster (same events and close hook)."""
    from castor.actors.materia import component as local
    from castor.ports.session_component import SessionComponent

    def children(ctx: Any) -> list[ChildSpec]:
        return [tree.MATERIA.child_spec(lambda: RemoteSessionActor(ctx, backend))]

    def on_close(ctx: Any) -> None:
        """The local close hook (``session_end`` on the host), then the session's release there:
        here, not only when its actor terminates, which an actor killed for overrunning its stop
        never does (the session stayed placed on its host, held by nobody)."""
        try:
            local.on_materia_close(ctx)
        finally:
            backend.close_session(ctx.info.session_id)

    return SessionComponent(name="materia", children=children, on_event=local.on_materia_event,
                            on_close=on_close)
