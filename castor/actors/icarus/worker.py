"""IcarusWorkerActor: the bridge's one persistent Python worker, as a supervised actor.

One incarnation owns at most one worker process (a :class:`WorkerProcessPort`,
implemented by :class:`castor.adapters.icarus.worker_process.WorkerProcess`),
started lazily by the first call. The mailbox *is* the bridge's pending queue:
calls run one at a time, in arrival order.

Failure table (codes are ``castor.messages.errors`` codes):

=====================================  =========================  ======================================  ==========
event                                  the call itself            every queued call                       worker
=====================================  =========================  ======================================  ==========
backend function raised                ``internal``               unaffected                              kept
                                       (``IcarusCallError``)
non-protocol line on the worker stdout ``internal``               unaffected                              kept
                                       (``WorkerProtocolError``)
deadline passes while running          ``timeout``                ``worker_retired``                      killed, actor retires
                                       (may_have_started)         (never started, never replayed)
cancel token fired while running       ``cancelled``              ``worker_retired``                      killed, actor retires
                                       (may_have_started)
cancel token fired / deadline passed   ``cancelled`` / ``timeout``  unaffected                            kept
before the call was submitted          (not started, not sent)
worker crashed / exited / killed       ``worker_crashed``         ``worker_crashed``                      gone, actor retires
worker died idle, seen only once the   runs on a fresh worker     unaffected                              replaced
request sat unread in its pipe (or its
stdout found ended before the request
was written, or writing it failed)
spawn failed                           ``worker_crashed``         ``worker_crashed``                      none, actor retires
the session's worker is given up       ``worker_retired``         each refused the same way when it is    none started
(crash loop, below)                    (``reason: crash_loop``,   handled
                                       not started)
=====================================  =========================  ======================================  ==========

Crash loop: the deaths above (crash, exit, kill, spawn failure; not a death while idle) are counted
per session across incarnations (:class:`WorkerCrashLoop`, the rule in
:mod:`castor.domain.icarus.crash_loop`). Past the limit the worker is given up: calls are refused at
once, no process is started, until the cool-down ends and one call probes a fresh worker.

After a retirement the supervision core never restarts the incarnation with
its old mailbox; a *new* call creates new demand, a fresh incarnation and,
lazily, a fresh worker. Nothing here re-runs session initialisation (that is
the hook controller's business, and it must not either).

Use :class:`IcarusWorkerClient` from other actors/threads: it implements the
``WorkerCalls`` port (:mod:`castor.ports.worker`) over the handle.
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from castor import tree
from castor.domain.icarus.crash_loop import CrashLoop, CrashLoopLimit
from castor.domain.icarus.worker_protocol import death_words, reply_result
from castor.messages.base import LocalMessage
from castor.messages.built import NEW, SET_DICT, SET_EXTRA, SET_FIELDS_SET, SET_PRIVATE
from castor.messages.errors import (
    ActorStopped,
    Cancelled,
    CastorError,
    Retired,
    Timeout,
    WorkerCrashed,
    WorkerRetired,
)
from castor.ports.icarus_backend import WorkerProcessPort
from castor.supervision.actor import Actor, handles
from castor.supervision.handle import ActorHandle, PendingAsk
from castor.supervision.supervisor import ChildSpec
from castor.supervision.timers import CancelToken

DEFAULT_TIMEOUT_MS = 30000
ASK_GRACE_S = 5.0
"""Extra seconds a client's ask waits beyond the call deadline (kill + reap + reply)."""


class WorkerCall(LocalMessage, type_name="icarus.worker.call"):
    """Run ``icarus.<module>.<function>(*args, **kwargs)`` in the worker."""

    module: str
    function: str
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    deadline: float | None = None  # time.monotonic(); None: the actor's timeoutMs from the start of the call
    token: CancelToken | None = None

    def queued_detail(self, now: float) -> dict[str, str | int | float | bool | None]:
        """Its target and deadline while it waits (never its arguments: a prompt, a memory)."""
        detail: dict[str, str | int | float | bool | None] = {"target": f"{self.module}.{self.function}"}
        if self.deadline is not None:
            detail["deadline_in_s"] = round(self.deadline - now, 3)
        if self.token is not None and self.token.cancelled:
            detail["cancelled"] = True
        return detail


# ``castor.messages.built.built`` for this one class, spelled out: the instance state validation
# sets (its field values in declaration order, the fields given, no extra, no private state),
# stored through the model's own slot descriptors. ``built(WorkerCall, **fields)`` packed the
# fields into keyword arguments, merged them over the defaults and made the fields set from them:
# 12.5k instructions a call against 8.2k (callgrind), on every worker call.
_CALL_FIELDS = frozenset(("module", "function", "args", "kwargs", "deadline", "token"))
#: The fields set every built call shares (as ``built`` shares a frozen model's): nothing adds to it
#: -- the message is frozen, and ``model_copy`` copies the set before adding an update's names.
_CALL_FIELDS_SET = set(_CALL_FIELDS)


def _worker_call(module: str, function: str, args: list[Any], kwargs: dict[str, Any], deadline: float,
                 token: CancelToken) -> WorkerCall:
    """A ``WorkerCall`` from values that already have its field types (the client's hot path):
    built, not validated -- validation would only copy what the client has just made (a test pins
    it equal to the validated model: the same fields, the same fields set, frozen)."""
    call = NEW(WorkerCall)
    SET_DICT(call, {"module": module, "function": function, "args": args, "kwargs": kwargs, "deadline": deadline,
                     "token": token})
    SET_FIELDS_SET(call, _CALL_FIELDS_SET)
    SET_EXTRA(call, None)
    SET_PRIVATE(call, None)
    return call


class WorkerInspect(LocalMessage, type_name="icarus.worker.inspect"):
    """The worker process's stats (None before the first call)."""


class WorkerCrashLoop:
    """A session's :class:`CrashLoop` shared by every incarnation of its worker actor (any thread).

    ``dirty`` is read without the lock on the call path: only a worker that died since the last
    answered call costs the lock on the next answer."""

    def __init__(self, limit: CrashLoopLimit | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._loop = CrashLoop(limit or CrashLoopLimit())
        self._clock = clock
        self.dirty = False

    @property
    def limit(self) -> CrashLoopLimit:
        return self._loop.limit

    def admit(self) -> float | None:
        """None: a worker may be started now; else the seconds until one may."""
        if not self.dirty:
            return None
        with self._lock:
            return self._loop.admit(self._clock())

    def death(self, how: str) -> bool:
        with self._lock:
            self.dirty = True
            return self._loop.death(self._clock(), how)

    def answered(self) -> bool:
        with self._lock:
            recovered = self._loop.answered()
            self.dirty = False
            return recovered

    def view(self) -> dict[str, Any]:
        with self._lock:
            return self._loop.view(self._clock())

    def given_up(self) -> tuple[str, float, float, dict[str, Any]] | None:
        """(words, since, until, data) while calls are refused, else None (for a snapshot)."""
        with self._lock:
            loop = self._loop
            now = self._clock()
            if loop.until is None or now >= loop.until or loop.given_up_at is None:
                return None
            view = loop.view(now)
            return (_given_up_words(view), loop.given_up_at, loop.until,
                    {key: view[key] for key in ("max_deaths", "within_s", "give_ups", "refused", "last_death")})


def _given_up_words(view: dict[str, Any]) -> str:
    last = f" (last: {view['last_death']})" if view.get("last_death") else ""
    return (f"worker given up: it died {view['max_deaths']} times within {view['within_s']:g} s{last}; calls "
            f"fail worker_retired (crash_loop) until the cool-down ends, then one call tries a fresh worker")


class IcarusWorkerActor(Actor):
    """See the module docstring; one incarnation, at most one worker process."""

    # An idle worker actor runs a call on the asker's thread (no hand-off to its loop thread and
    # back): every call is bounded by its own deadline, which kills the worker when it passes.
    inline_asks = True

    def __init__(self, spawn: Callable[[], WorkerProcessPort], next_id: Callable[[], int], *,
                 timeout_ms: int = DEFAULT_TIMEOUT_MS, crash_loop: WorkerCrashLoop | None = None) -> None:
        super().__init__()
        self._spawn = spawn
        self._crash_loop = crash_loop if crash_loop is not None else WorkerCrashLoop()
        self._next_id = next_id
        self._timeout_s = timeout_ms / 1000.0
        self._worker: WorkerProcessPort | None = None
        # The call being run: (the call, since (monotonic), worker, deadline (monotonic)), for the
        # activity the snapshot describes (describe_activity: nothing is built per call); None
        # between calls.
        self._running: tuple[WorkerCall, float, WorkerProcessPort, float] | None = None
        self._count_call: Callable[[], object] = _no_tally  # the worker_calls tally, from the first spawn
        # What a cancelled call's token calls: kill this incarnation's current worker (set with it).
        self._kill_on_cancel: Callable[[], None] = _no_worker_to_kill

    # -- ownership -----------------------------------------------------------
    def owned_pids(self) -> list[int]:
        worker = self._worker
        pid = worker.running_pid if worker is not None else None
        return [pid] if pid is not None else []

    def on_terminate(self, cause: str) -> None:
        if self._worker is not None:
            self._worker.kill_tree(cause)

    # -- handlers --------------------------------------------------------------
    @handles(WorkerInspect)
    def _on_inspect(self, _message: WorkerInspect) -> Any:
        return self._worker.stats() if self._worker is not None else None

    @handles(WorkerCall)
    def _on_call(self, call: WorkerCall) -> Any:
        # The hot path of every worker call: locals, no helper calls where a test would do.
        token = call.token
        now = time.monotonic()
        deadline = call.deadline
        if deadline is None:
            deadline = now + self._timeout_s
        if token is not None and token.cancelled:
            target = f"{call.module}.{call.function}"
            raise Cancelled(f"icarus call {target} cancelled before it was sent",
                            data={"target": target}, may_have_started=False)
        if now >= deadline:
            target = f"{call.module}.{call.function}"
            raise Timeout(f"icarus call {target} expired in the queue; it was never sent",
                          data={"target": target}, may_have_started=False)
        worker = self._worker
        if worker is None or worker.exited_while_idle():
            wait_s = self._crash_loop.admit()
            if wait_s is not None:
                self._refuse(call, wait_s)
            worker = self._fresh_worker(worker)
        kill: Callable[[], None] | None = None
        if token is not None:
            # Before this the call is rejected unsent; after it, cancelling kills the worker tree
            # (the worker's own callback, made with it: no closure per call).
            kill = self._kill_on_cancel
            if not token.on_cancel(kill):
                target = f"{call.module}.{call.function}"
                raise Cancelled(f"icarus call {target} cancelled before it was sent",
                                data={"target": target}, may_have_started=False)
        # What a snapshot shows meanwhile (see _describe; the target is formatted there, and on
        # the error paths below, not on every call).
        self._running = (call, now, worker, deadline)
        self._count_call()
        try:
            reply = worker.call(self._next_id(), call.module, call.function, call.args, call.kwargs, deadline)
        except Timeout:
            target = f"{call.module}.{call.function}"
            self.count_metric("worker_timeouts")
            self.retire(f"call {target} timed out", error=WorkerRetired)
            raise
        except WorkerRetired as exc:
            target = f"{call.module}.{call.function}"
            self.retire(f"worker killed during {target}", error=WorkerRetired)
            if token is not None and token.cancelled:
                raise Cancelled(f"icarus call {target} cancelled; the worker was retired",
                                data={"target": target}, may_have_started=True) from None
            raise exc
        except WorkerCrashed as crash:
            if not crash.data.get("died_idle"):
                target = f"{call.module}.{call.function}"
                words = _exit_words(crash)
                gave_up = self._crash_loop.death(words.strip(" ()") or str(crash.data.get("reason") or "crashed"))
                tail = self._gave_up() if gave_up else ""
                self.retire(f"worker crashed during {target}{words}{tail}", error=WorkerCrashed)
                raise
            reply = None  # it died idle and the request never reached it: a fresh worker runs it
        finally:
            self._running = None
            if token is not None and kill is not None:
                token.disarm(kill)  # the same callback object that was armed
        if reply is None:
            return self._on_call_again(call)
        if self._crash_loop.dirty and self._crash_loop.answered():
            self.log.info("icarus worker answered again after it was given up; the crash-loop record is cleared")
        if reply.get("ok") is True:
            return reply.get("result")
        return reply_result(reply, f"{call.module}.{call.function}")

    def _refuse(self, call: WorkerCall, wait_s: float) -> None:
        """Refuse a call while the session's worker is given up: at once, nothing started."""
        self._bind()
        self.count_metric("worker_calls_refused")
        target = f"{call.module}.{call.function}"
        view = self._crash_loop.view()
        raise WorkerRetired(f"icarus call {target} refused (a fresh worker is tried in {wait_s:.0f} s): "
                            f"{_given_up_words(view)}",
                            data={"reason": "crash_loop", "target": target, "retry_in_s": round(wait_s, 3),
                                  "deaths": view["max_deaths"], "within_s": view["within_s"],
                                  "last_death": view["last_death"]},
                            may_have_started=False)

    def _gave_up(self) -> str:
        """Say once that the session's worker is given up (the log, the counter); the words the
        retired reason gets."""
        limit = self._crash_loop.limit
        give_ups = self._crash_loop.view()["give_ups"]
        self.count_metric("worker_give_ups")
        why = (f"it died {limit.max_deaths} times within {limit.within_s:g} s" if give_ups <= 1 else
               f"the worker tried after the cool-down died too (given up {give_ups} times)")
        self.log.bind(max_deaths=limit.max_deaths, within_s=limit.within_s, cool_down_s=limit.cool_down_s,
                      give_ups=give_ups).warning(
            f"icarus worker given up: {why}; calls are refused (worker_retired, crash_loop) for "
            f"{limit.cool_down_s:g} s, then one call tries a fresh worker")
        return f"; given up for {limit.cool_down_s:g} s: {why}"

    def _bind(self) -> None:
        """Once per incarnation (the handle is bound by now): the call counter and the snapshot's
        description."""
        if self._count_call is _no_tally:
            self._count_call = self.tally_metric("worker_calls")
            self.describe_activity(self._describe)

    def _on_call_again(self, call: WorkerCall) -> Any:
        """The call again, on a fresh worker: the last one had died idle, which showed only once
        this call's request was in its pipe, unread (``died_idle``). Its fresh worker answers
        ``died_idle`` never (it has served no call before), so this runs at most once."""
        self.log.warning("worker pid died idle (seen only by the next call); starting a fresh one")
        self._worker = None  # _crash killed and reaped it already
        self._fresh_worker(None)
        return self._on_call(call)

    def _describe(self) -> tuple[str, str, dict[str, Any], float, float] | None:
        """The activity while a call runs, with the deadline that kills the worker (read by
        snapshots only; None between calls)."""
        running = self._running
        if running is None:
            given_up = self._crash_loop.given_up() if self._crash_loop.dirty else None
            if given_up is None:
                return None
            words, since, until, data = given_up
            return "given_up", words, data, since, until
        call, since, worker, deadline = running
        target = f"{call.module}.{call.function}"
        return "worker_call", "worker call " + target, {"target": target, "pid": worker.running_pid}, since, deadline

    def _fresh_worker(self, gone: WorkerProcessPort | None) -> WorkerProcessPort:
        """The first worker of this incarnation, or a fresh one for ``gone``, which exited while
        idle: nothing was pending, so nothing is lost or replayed; this call simply gets a fresh
        worker. Session start-up is not re-run."""
        if gone is not None:
            self.log.warning("worker pid exited while idle; starting a fresh one for the next call")
            gone.kill_tree("exited while idle")
            self._worker = None
        self._bind()
        worker = self._worker = self._spawn()
        self._kill_on_cancel = functools.partial(worker.kill_tree, "cancelled")
        return worker


def _exit_words(crash: WorkerCrashed) -> str:
    """`` (killed by SIGKILL)`` / `` (exit code 4)``: how the worker ended, for the retired reason
    an operator reads (a kill -9 or the OOM killer, or the backend's own exit)."""
    words = death_words((crash.data or {}).get("exit_code"))
    return f" ({words})" if words else ""


def _no_worker_to_kill() -> None:
    """What a token would call before the incarnation's first worker exists (never armed: every
    call that arms it has a worker by then)."""


def _no_tally() -> None:
    """The call counter before the first spawn has fetched the real one (never called)."""


def icarus_worker_spec(id: str, spawn: Callable[[], WorkerProcessPort], next_id: Callable[[], int], *,
                       timeout_ms: int = DEFAULT_TIMEOUT_MS, mailbox_capacity: int | None = None,
                       crash_loop: WorkerCrashLoop | None = None) -> ChildSpec:
    """A ChildSpec for one bridge: revived on demand after retirement, never replayed.

    ``spawn`` must *construct* the worker without starting it (the first call
    starts it), so a fresh incarnation costs nothing until it is used. ``crash_loop`` is shared by
    every incarnation (one is made when none is given): the deaths it counts outlive retirements.
    """
    shared = crash_loop if crash_loop is not None else WorkerCrashLoop()
    return tree.ICARUS_WORKER.child_spec(
        lambda: IcarusWorkerActor(spawn, next_id, timeout_ms=timeout_ms, crash_loop=shared), id=id,
        mailbox_capacity=mailbox_capacity, revive_on_demand=True)


class PendingWorkerCall:
    """A worker call sent by :meth:`IcarusWorkerClient.submit`, its answer not read yet.

    :meth:`result` waits for it and fails as :meth:`IcarusWorkerClient.call` does. A failure
    that retired the worker is seen only once the old incarnation has closed its mailbox (the
    supervision core closes it before the answer goes out), so a call sent right after the
    failure is seen reaches a fresh worker (it is never refused by the retiring one). Calls
    queued behind the failed one were refused by the retirement as ever (``worker_retired``,
    never started)."""

    __slots__ = ("_after_failure", "_pending")

    def __init__(self, after_failure: Callable[[CastorError], CastorError], pending: PendingAsk) -> None:
        self._after_failure = after_failure
        self._pending = pending

    @property
    def done(self) -> bool:
        return self._pending.done

    def result(self) -> Any:
        try:
            return self._pending.result()
        except (Retired, Timeout) as exc:  # see _after_failure
            failure = self._after_failure(exc)
            if failure is exc:
                raise
            raise failure from None


class IcarusWorkerClient:
    """The ``WorkerCalls`` port over an :class:`IcarusWorkerActor` handle (any thread).

    ``call`` blocks the calling thread until the result, a typed error, or the
    call deadline plus :data:`ASK_GRACE_S`. ``close`` cancels this client's
    outstanding calls (the running one fails ``cancelled``, queued ones
    ``worker_retired``) and retires the actor, killing the worker; a later
    ``call`` lazily gets a fresh worker. An ``actor_retired`` rejection (a
    retirement from outside, e.g. ``close``) is reported as ``worker_retired``.
    """

    def __init__(self, handle: ActorHandle, *, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        self._handle = handle
        self._timeout_s = timeout_ms / 1000.0
        self._outstanding: set[CancelToken] = set()

    def call(self, module: str, function: str, args: list[Any] | None = None,
             kwargs: dict[str, Any] | None = None, timeout: float | None = None,
             token: CancelToken | None = None) -> Any:
        timeout_s = self._timeout_s if timeout is None else timeout
        token = token or CancelToken()
        message = _worker_call(module, function, list(args or []), dict(kwargs or {}),
                               time.monotonic() + timeout_s, token)
        outstanding = self._outstanding
        outstanding.add(token)  # set.add / discard / list(set) are atomic (the GIL): no lock
        try:
            return self._handle.ask(message, timeout=timeout_s + ASK_GRACE_S)
        except (Retired, Timeout) as exc:  # see _after_failure
            failure = self._after_failure(exc)
            if failure is exc:
                raise
            raise failure from None
        finally:
            outstanding.discard(token)

    def _after_failure(self, exc: CastorError) -> CastorError:
        """What a failed call raises: an ``actor_retired`` rejection is reported as ``worker_retired``.

        A failure the actor answered needs no wait before the caller's next call: when it retired
        the worker (a timeout or a cancel once the call started, a crash), the supervision core
        closed the old mailbox before the answer went out, so the next call -- a ``call`` or a
        ``submit`` -- reaches a fresh worker. Only an ask whose own deadline passed (the call's
        deadline plus :data:`ASK_GRACE_S`) before any answer waits, bounded, for the handler it
        left running: see :meth:`_await_running_call`."""
        if isinstance(exc, Timeout) and exc.may_have_started and exc.data.get("message_type") == WorkerCall.type_name:
            self._await_running_call()
        if isinstance(exc, Retired) and exc.data.get("reason") != "crash_loop":
            # (crash_loop: refused by a live incarnation, which does not retire; already worker_retired)
            reason = exc.data.get("reason")
            if exc.may_have_started is False and isinstance(reason, str):
                # Refused unsent by a retirement another call caused: said so, so that a tool call
                # queued behind a hung retrieval does not read as its own timeout.
                return WorkerRetired(f"not sent: the icarus worker was retired before this call ran ({reason})",
                                     data=exc.data)
            return WorkerRetired(exc.message, data=exc.data)
        return exc

    def _await_running_call(self, bound_s: float = 1.0) -> None:
        """Return once the call an ask gave up on has ended, or its incarnation has closed its
        mailbox (it retires), or ``bound_s`` has passed.

        The handler outlived the ask's deadline (a host loaded enough to run it late): a call
        sent at once would queue behind it, in the mailbox its retirement closes, and be refused
        with the old worker's error instead of reaching a fresh worker."""
        handle = self._handle
        incarnation = handle.incarnation
        deadline = time.monotonic() + bound_s
        while (handle.incarnation == incarnation and handle.current is not None and not handle.mailbox_closed
               and time.monotonic() < deadline):
            time.sleep(0.0005)

    def submit(self, module: str, function: str, args: list[Any] | None = None,
               kwargs: dict[str, Any] | None = None, timeout: float | None = None,
               token: CancelToken | None = None) -> PendingWorkerCall:
        """Send now, wait later: the answer is :meth:`PendingWorkerCall.result`, which fails as
        :meth:`call` does (a failure that retires the worker returns once it has)."""
        timeout_s = self._timeout_s if timeout is None else timeout
        message = WorkerCall(module=module, function=function, args=list(args or []), kwargs=dict(kwargs or {}),
                             deadline=time.monotonic() + timeout_s, token=token)
        pending = self._handle.ask_pending(message, timeout=timeout_s + ASK_GRACE_S)
        return PendingWorkerCall(self._after_failure, pending)

    def stats(self, timeout: float = 5.0) -> Any:
        try:
            return self._handle.ask(WorkerInspect(), timeout=timeout)
        except (Retired, ActorStopped):
            return None

    def abandon_outstanding(self, grace_s: float, settle_s: float = 2.0) -> int:
        """Give this client's calls ``grace_s`` to end, then cancel those still outstanding: the
        running one fails ``cancelled`` (its worker killed, the actor retired), queued ones are
        refused unsent. Returns once they have all returned (at most ``settle_s`` more), so a call
        made next reaches a fresh worker. Returns how many were cancelled. The actor is not closed."""
        outstanding = self._outstanding
        deadline = time.monotonic() + grace_s
        while outstanding and time.monotonic() < deadline:
            time.sleep(0.005)
        tokens = list(outstanding)
        for token in tokens:
            token.cancel()
        deadline = time.monotonic() + settle_s
        while outstanding and time.monotonic() < deadline:
            time.sleep(0.005)
        return len(tokens)

    def close(self) -> None:
        tokens = list(self._outstanding)
        for token in tokens:
            token.cancel()
        self._handle.retire("closed")
