"""ActorHandle: the stable address of one supervised child.

A handle outlives the incarnations of its actor: a restart binds a new
:class:`~castor.supervision.actor.Actor` to the same handle and the same
mailbox, so senders keep their handle and queued messages (all but the one
that crashed) are handled by the next incarnation. A *retirement* is the
exception: the mailbox is closed and every queued request rejected; only a
later send creates new demand, which gets a fresh mailbox and a fresh
incarnation (never the old messages).

Guarantees of :meth:`ActorHandle.ask`:

* it always returns or raises by its deadline (default
  :data:`DEFAULT_ASK_TIMEOUT`); nothing can strand it;
* on timeout the queued request is withdrawn if it had not started, and the
  :class:`~castor.messages.errors.Timeout` says ``may_have_started``;
* when the actor stops, crashes for good or retires, the ask fails with
  :class:`ActorStopped` / :class:`Retired` saying whether work began.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from typing import TYPE_CHECKING, Any, Callable

from castor.messages.errors import ActorCrashed, ActorStopped, CastorError, InvalidParams, Timeout
from castor.messages.inspection import ActorSnapshot
from castor.supervision.fault_plan import FaultPlan
from castor.supervision.incarnation import Incarnation
from castor.supervision.kinds import ControlKind, ExitKind, HandleState, ReviveChild
from castor.supervision.mailbox import (
    STARTED,
    TYPE_NAMES,
    Control,
    Envelope,
    Latch,
    Mailbox,
    MailboxClosed,
    Reply,
    find_type_name,
)
from castor.supervision.meters import BUCKETS, FIRST_BOUND

if TYPE_CHECKING:
    from castor.supervision.registry import Registry

DEFAULT_ASK_TIMEOUT = 10.0
"""Seconds an ask waits when the caller names no deadline."""
START_TIMEOUT = 30.0
"""Seconds ``launch`` waits for an incarnation's ``on_start``."""
MAX_ASK_TIMEOUT = threading.TIMEOUT_MAX
"""The longest ``timeout`` an ask takes (what a lock wait can be given); NaN, infinity and
anything longer are refused ``invalid_params`` before anything is sent."""


def _refuse_timeout(timeout: float) -> InvalidParams:
    return InvalidParams(f"an ask's timeout must be a number of seconds up to {MAX_ASK_TIMEOUT:.0f}, not {timeout!r}",
                         data={"timeout": repr(timeout)})


class PendingAsk:
    """An ask in flight; :meth:`result` waits for it under the ask's deadline."""

    __slots__ = ("_handle", "_envelope", "_mailbox", "_deadline", "_sent")

    def __init__(self, handle: ActorHandle, envelope: Envelope, mailbox: Mailbox, deadline: float,
                 sent: float = 0.0) -> None:
        self._handle = handle
        self._envelope = envelope
        self._mailbox = mailbox
        self._deadline = deadline
        self._sent = sent

    @property
    def done(self) -> bool:
        reply = self._envelope.reply
        return reply is not None and reply.done

    @property
    def envelope(self) -> Envelope:
        """The envelope this ask sent (its reply slot holds the answer once ``done``)."""
        return self._envelope

    def result(self) -> Any:
        reply = self._envelope.reply
        assert reply is not None
        if not reply.wait(self._deadline - time.monotonic()):
            withdrawn = self._mailbox.cancel(self._envelope)
            if withdrawn or not reply.done:
                self._handle.registry.meters.count("ask_timeouts", self._handle.kind)
                raise Timeout(
                    f"ask {self._envelope.type_name} to {self._handle.path} timed out",
                    data={"path": self._handle.path, "message_type": self._envelope.type_name},
                    may_have_started=not withdrawn,
                )
        if self._sent:
            self._handle.registry.meters.observe("ask_seconds", self._handle.kind, time.monotonic() - self._sent)
        error = reply.error
        if error is None:
            return reply.value
        raise _answer_error(self._handle, self._envelope.type_name, error)


def _answer_error(handle: ActorHandle, type_name: str, error: BaseException) -> BaseException:
    """What an ask raises for a handler's error: a ``CastorError`` as it is (an answer), anything
    else (a crash) as ``ActorCrashed`` chained to it."""
    if isinstance(error, CastorError):
        return error
    crashed = ActorCrashed(
        f"{handle.path} crashed handling {type_name}: {type(error).__name__}",
        data={"path": handle.path, "message_type": type_name, "error_type": type(error).__name__},
        may_have_started=True,
    )
    crashed.__cause__ = error
    return crashed


class _InlineReply:
    """The reply slot of an inline ask: resolved and read on the asking thread, so no lock or gate.

    Slotted, no ``__init__`` (no type call's frame, no ``__dict__`` made at the first store): the
    asker that makes one sets ``done`` False and ``error`` None itself (ActorHandle.ask). The first
    outcome wins, as for any reply."""

    __slots__ = ("done", "value", "error")
    done: bool
    value: Any
    error: BaseException | None

    def set(self, value: Any) -> bool:
        if self.done:
            return False
        self.done = True
        self.value = value
        return True

    def fail(self, error: BaseException) -> bool:
        if self.done:
            return False
        self.done = True
        self.error = error
        return True

    def wait(self, timeout: float | None) -> bool:
        return self.done


_new_envelope = object.__new__  # an inline ask's Envelope, its slots set by the asker (see Envelope)

#: What an ActorHandle's inline-ask latency cell is until a launch binds its kind's (never used:
#: an inline ask needs an incarnation whose launch bound it).
_UNBOUND_LATENCY: tuple[threading.Lock, list[float]] = (threading.Lock(), [0.0] * (len(BUCKETS) + 2))


def _scalars(data: dict[str, Any]) -> dict[str, Any]:
    """An activity's data as msgpack/JSON-safe scalars (anything else becomes its ``str``)."""
    return {str(k): v if v is None or isinstance(v, (str, int, float, bool)) else str(v) for k, v in data.items()}


#: How many of the oldest queued messages a snapshot describes (``MailboxSnapshot.queued``).
QUEUED_SHOWN = 10


def _queued(mailbox: Mailbox, now: float) -> list[dict[str, Any]]:
    """The oldest queued messages as a snapshot lists them; a message whose own description fails
    is listed without one (a snapshot never fails on what it only adds)."""
    out = []
    for envelope in mailbox.peek(QUEUED_SHOWN):
        try:
            detail = _scalars(envelope.message.queued_detail(now))
        except Exception:  # noqa: BLE001 - a description must never fail the snapshot
            detail = {}
        out.append({"message_type": envelope.type_name, "age_s": max(0.0, now - envelope.enqueued_at),
                    "is_ask": envelope.reply is not None, "detail": detail})
    return out


# How often wait_gone looks whether a child whose removal is pending was restarted instead.
_GONE_RECHECK_S = 0.01


class ActorHandle:
    """Send to, inspect and control one supervised child, across its incarnations."""

    def __init__(
        self,
        path: str,
        *,
        factory: Callable[[], Incarnation],
        supervisor: ActorHandle | None,
        registry: Registry[ActorHandle],
        mailbox_capacity: int | None = None,
        revive_on_demand: bool = True,
    ) -> None:
        self.path = path
        self.kind = "?"
        #: ``ask_seconds`` of this handle's kind for the inline path (its lock and row, see
        #: Meters.histogram_cell), bound by each launch of a class that takes inline asks before its
        #: incarnation is visible; an inline ask needs such an incarnation, so it always finds it.
        self._inline_ask_latency: tuple[threading.Lock, list[float]] = _UNBOUND_LATENCY
        self.factory = factory
        self.supervisor = supervisor
        self.registry = registry
        self.mailbox_capacity = mailbox_capacity
        self.revive_on_demand = revive_on_demand
        self.faults = FaultPlan()
        self._lock = threading.Lock()
        self._mailbox = Mailbox(mailbox_capacity)
        self._actor: Incarnation | None = None
        self._exited = Latch()  # the first incarnation's; each later one gets its own
        self.state = HandleState.STARTING
        self.incarnation = 0
        self.restarts = 0
        self.processed = 0
        self.failed = 0
        self.dead_letters = 0
        #: rejections of the mailboxes a retirement replaced, and of sends no fresh mailbox took
        #: (the snapshot adds the current mailbox's: the count spans the handle's whole life)
        self._rejected_before = 0
        self.started_at: float | None = None
        self.current: Envelope | None = None
        self.current_since = 0.0
        self.retired_reason: str | None = None
        self.last_error: BaseException | None = None
        # (error type, message type or None, monotonic, wall clock) of the last crash
        self.last_failure: tuple[str, str | None, float, float] | None = None
        # What the actor says it does: (kind, text, data, since (monotonic), envelope or None,
        # deadline (monotonic) or None). Written by the actor's own thread (one assignment), read
        # by snapshots; see Actor.report_activity. ``describe`` is a callable giving (kind, text,
        # data, since) or (kind, text, data, since, deadline), evaluated only when a snapshot is
        # taken (a cast describes its state that way).
        self.activity: tuple[str, str, dict[str, Any], float, Any, float | None] | None = None
        self.describe: Callable[[], tuple[Any, ...] | None] | None = None
        self.idle_since: float | None = None
        self.labels: dict[str, str] = {}
        #: (``"self"`` or ``"children"``, the supervisor's intensity record: ``max_restarts``,
        #: ``within_seconds``, ``times``), set by the supervisor that applies it; see RestartBudget.
        self.restart_budget: tuple[str, Any] | None = None
        #: Called with (handle, incarnation, exit kind) when an incarnation ends, on its thread;
        #: set by whoever supervises this handle (a supervisor, or the system for the root).
        self.on_exit: Callable[[ActorHandle, int, ExitKind], None] | None = None
        self.closed = Latch()  # set once the handle is closed for good
        #: Held while a message is handled, on the loop thread or inline (see :meth:`ask`).
        self.turn = threading.Lock()
        self._closing = threading.Lock()  # serialises close(): see there

    # -- sending -----------------------------------------------------------
    def tell(self, message: Any) -> None:
        """Queue a message; raises at once if the actor cannot take it (never blocks)."""
        self._enqueue(Envelope(message, None))

    def ask(self, message: Any, *, timeout: float | None = None) -> Any:
        """Send and wait for the answer, at most ``timeout`` seconds.

        For a class that opts in (:attr:`Actor.inline_asks`) an ask that finds the incarnation
        idle -- its loop parked on an empty, open mailbox -- runs the handler on this thread
        instead, holding the handle's :attr:`turn`: a message sent meanwhile queues behind it
        (the loop waits for the turn), so the order is the order of arrival as ever, and a
        stop, kill or retirement is carried out by the loop thread before it takes anything
        else. Otherwise (busy, starting, retired) the ask queues as usual.
        """
        if timeout is not None and not timeout <= MAX_ASK_TIMEOUT:  # NaN fails this too
            raise _refuse_timeout(timeout)
        actor = self._actor
        if actor is not None and actor.inline_asks:
            mailbox = self._mailbox
            turn = self.turn
            if mailbox.claim_idle(turn):
                # Idle: handle it here. No deadline is kept: nothing here waits (the class
                # bounds its handlers' run time itself, see Actor.inline_asks).
                reply: _InlineReply | None = None
                try:
                    if actor is self._actor and actor.inbox is mailbox and not actor.is_ending:
                        # Envelope's own slots, set here without its __init__ (see Envelope).
                        envelope = _new_envelope(Envelope)
                        envelope.message = message
                        envelope.reply = reply = _InlineReply()
                        reply.done, reply.error = False, None
                        envelope.enqueued_at = started = time.monotonic()
                        envelope.state = STARTED
                        envelope.type_name = TYPE_NAMES.get(type(message)) or find_type_name(message)
                        actor.handle_envelope(envelope, self, started)
                        # The handler's end: handle_envelope's own clock reading (idle_since, read
                        # while this thread holds the turn, so no other handling has written it
                        # since), unless the incarnation is ending (cut loose: it wrote none).
                        finished = self.idle_since
                        if actor.is_ending:
                            mailbox.put_control(Control(ControlKind.HONOUR))  # the loop thread ends the incarnation
                            finished = time.monotonic()
                finally:
                    mailbox.end_inline(turn)
                if reply is not None:
                    # Latency is observed for every ask, inline or queued (the /metrics histogram),
                    # as Meters.observe records it, without its frame (see Meters.histogram_cell).
                    seconds = (finished or started) - started
                    lock, row = self._inline_ask_latency
                    # An inline ask's commonest bucket is the first: one float comparison, no bisect.
                    index = 0 if seconds <= FIRST_BOUND else bisect_left(BUCKETS, seconds)
                    with lock:
                        row[index] += 1
                        row[-1] += seconds
                    error = reply.error
                    if error is None:
                        return reply.value
                    raise _answer_error(self, envelope.type_name, error)
                # replaced, rebound or ending meanwhile: queue it as usual
        return self.ask_pending(message, timeout=timeout).result()

    def ask_pending(self, message: Any, *, timeout: float | None = None) -> PendingAsk:
        """Send now, wait later (fan-out); the deadline starts now. A ``timeout`` that is NaN,
        infinite or past :data:`MAX_ASK_TIMEOUT` is refused ``invalid_params``, nothing sent."""
        if timeout is not None and not timeout <= MAX_ASK_TIMEOUT:  # NaN fails this too
            raise _refuse_timeout(timeout)
        envelope = Envelope(message, Reply())
        mailbox = self._mailbox
        try:
            mailbox.put(envelope)  # _enqueue, inline (a queued ask's hot path)
        except MailboxClosed as closed:
            mailbox = self._enqueue_closed(envelope, mailbox, closed)
        now = time.monotonic()
        return PendingAsk(self, envelope, mailbox, now + (DEFAULT_ASK_TIMEOUT if timeout is None else timeout), now)

    def _enqueue(self, envelope: Envelope) -> Mailbox:
        mailbox = self._mailbox
        try:
            mailbox.put(envelope)
            return mailbox
        except MailboxClosed as closed:
            return self._enqueue_closed(envelope, mailbox, closed)

    def _enqueue_closed(self, envelope: Envelope, mailbox: Mailbox, closed: MailboxClosed) -> Mailbox:
        """``mailbox`` refused ``envelope`` as closed: raise the closing error, or (closed by a
        retirement) create new demand and queue it in the fresh mailbox."""
        if not closed.revivable:
            raise closed.error from None
        fresh = self._demand_fresh_incarnation(mailbox)
        if fresh is None:
            with self._lock:
                self._rejected_before += 1  # refused after all (the mailbox did not count it)
            raise closed.error from None
        try:
            fresh.put(envelope)
        except MailboxClosed as again:
            if again.revivable:  # closed by a retirement again meanwhile: not counted by it
                with self._lock:
                    self._rejected_before += 1
            raise again.error from None
        return fresh

    def _demand_fresh_incarnation(self, retired_mailbox: Mailbox) -> Mailbox | None:
        """New demand after retirement: a fresh mailbox and a request to the supervisor."""
        with self._lock:
            if self._mailbox is not retired_mailbox:
                return self._mailbox  # someone else already created the demand
            if self.supervisor is None or not self.revive_on_demand:
                return None
            fresh = Mailbox(self.mailbox_capacity)
            self._rejected_before += retired_mailbox.rejected  # closed: its count is final
            self._mailbox = fresh
            self.state = HandleState.STARTING
        try:
            self.supervisor.tell(ReviveChild(path=self.path))
        except CastorError:
            self.reject_all("supervisor gone", ActorStopped, revivable=False)
            return None
        return fresh

    # -- lifecycle (used by supervisors and the system) ----------------------
    def launch(self, *, start_timeout: float = START_TIMEOUT) -> None:
        """Start a new incarnation on the current mailbox (by its supervisor only).

        Returns once the incarnation's ``on_start`` has finished (OTP's
        synchronous start): a supervisor's children therefore exist, all the
        way down, when its own start returns. An ``on_start`` that takes
        longer than ``start_timeout`` is logged and left to finish on its own.
        A class that keeps the base (no-op) ``on_start`` is not waited for:
        there is nothing to order, and its messages queue meanwhile.
        """
        started = self.begin_launch()
        if started is not None and not started.wait(start_timeout):
            self.log_slow_start(start_timeout)

    def begin_launch(self) -> Latch | None:
        """:meth:`launch` without the wait: the incarnation's loop is running (or queued to run)
        when this returns; the latch, if any, is set once its ``on_start`` has finished. (A class
        that starts on the caller has finished ``on_start`` here already: see
        :attr:`Actor.start_on_caller`.)"""
        actor = self.prepare_launch()
        actor.begin_incarnation()
        return actor.start_latch

    def prepare_launch(self) -> Incarnation:
        """Make, bind and register the next incarnation without starting it; the caller starts
        it with ``actor.begin_incarnation()`` (a direct start does so outside its supervisor's
        table lock)."""
        actor = self.factory()
        with self._lock:
            self.incarnation += 1
            if self._exited.is_set():
                self._exited = Latch()
            self._mailbox.clear_control()  # a stop/kill left for the previous incarnation is not for this one
            actor.bind_to(self, self._mailbox, self.incarnation)
            kind = type(actor).__name__
            if actor.inline_asks:  # bound before the incarnation is visible (launches are rare)
                self._inline_ask_latency = self.registry.meters.histogram_cell("ask_seconds", kind)
            self._actor = actor
            self.kind = kind
            self.registry.meters.count("starts", self.kind)
            self.state = HandleState.RUNNING
            self.started_at = time.monotonic()
            self.idle_since = self.started_at
            self.activity = None
            self.describe = None
            self.retired_reason = None
        self.registry.register(self)
        return actor

    def log_slow_start(self, waited: float) -> None:
        """Log that an incarnation's ``on_start`` outran the ``waited`` seconds its starter gave it."""
        from castor._log import logger

        logger.bind(actor=self.path).warning("on_start still running after {s}s; not waiting longer", s=waited)

    def incarnation_ended(self, actor: Incarnation, kind: ExitKind) -> None:
        """Called on the ending actor's thread, last thing it does; ignored for an incarnation
        that is no longer this handle's (cut loose, or replaced)."""
        with self._lock:
            if actor is not self._actor:
                return
            self._actor = None
            self.state = HandleState.after(kind)
            incarnation = self.incarnation
            exited = self._exited
        exited.set()
        if self.on_exit is not None:
            self.on_exit(self, incarnation, kind)

    def stop(self, timeout: float) -> bool:
        """Ask the current incarnation to stop after its current message; True if it ended in time."""
        with self._lock:
            actor = self._actor
            exited = self._exited
            if actor is None:
                return True
            self.state = HandleState.STOPPING
        self._mailbox.put_control(Control(ControlKind.STOP))
        return exited.wait(timeout)

    def abandon(self) -> None:
        """Brutal kill: kill owned processes and cut the incarnation loose (its thread may linger)."""
        with self._lock:
            actor = self._actor
            self._actor = None
            exited = self._exited
            if actor is not None:
                # The cut-loose thread keeps the turn it holds until its handler returns, which
                # may be never: the next incarnation takes turns on a lock of its own.
                self.turn = threading.Lock()
        if actor is not None:
            actor.cut_loose()
            # The ask whose handler overran is answered now, not at its own deadline: nothing
            # will ever take its late reply (the first outcome wins).
            current = self.current
            if current is not None and type(current.reply) is Reply:
                current.reply.fail(ActorStopped(
                    f"{self.path} was cut loose while handling {current.type_name}",
                    data={"path": self.path, "message_type": current.type_name}, may_have_started=True))
            self.current = None  # answered: no longer in flight, whatever the cut-loose thread still runs
            try:
                self._kill_owned(actor)
            finally:
                self.state = HandleState.STOPPED
                exited.set()

    def kill(self, reason: str = "killed") -> bool:
        """Crash the actor from outside: owned processes die now, the loop crashes at the next
        boundary. False, and nothing done, when no incarnation runs to crash (retired and dormant,
        stopped, or between two incarnations: the next one would never see it)."""
        return self._control_running(Control(ControlKind.KILL, reason))

    def retire(self, reason: str) -> bool:
        """Retire from outside: owned processes die now, the mailbox is rejected at the next
        boundary. False, and nothing done, when no incarnation runs to retire (as :meth:`kill`)."""
        return self._control_running(Control(ControlKind.RETIRE, reason))

    def _control_running(self, item: Control) -> bool:
        """Queue ``item`` for the running incarnation and kill what it owns; False when none runs.
        Queued under the handle's lock, so no launch in between clears it as left for an earlier
        incarnation."""
        with self._lock:
            actor = self._actor
            if actor is None or not self._mailbox.put_control(item):
                return False
        self._kill_owned(actor)
        return True

    def _kill_owned(self, actor: Incarnation) -> None:
        """Kill what ``actor`` owns from this (not its) thread; a failure of the actor's own
        ``owned_pids``/``kill_owned`` is logged, so the kill, retirement or brutal stop that
        asked for it still happens (and a supervisor still stops its other children)."""
        try:
            actor.kill_owned()
        except Exception as exc:  # noqa: BLE001 - the actor's bug must not stop the caller's
            from castor._log import logger

            logger.bind(actor=self.path).opt(exception=exc).error("killing what the actor owns failed")

    def kill_process(self) -> list[int]:
        """Kill the OS processes the actor owns (fault injection); returns their pids."""
        actor = self._actor
        if actor is None:
            return []
        pids = actor.owned_pids()
        actor.kill_owned()
        return pids

    def close(self, reason: str) -> None:
        """Close for good: every queued ask fails ActorStopped(may_have_started=False).

        Safe to call from several threads at once (a temporary child's own exit and its
        supervisor's stop may both close it): ``closed`` is set only after every queued ask
        has been failed, whichever caller drained them.
        """
        with self._closing:
            self.reject_all(reason, ActorStopped, revivable=False)
        self.closed.set()
        with self._lock:
            if self._actor is None and self.state is not HandleState.RETIRED:
                self.state = HandleState.STOPPED
        self.registry.unregister(self)

    def reject_all(self, reason: str, error: type[CastorError], *, revivable: bool,
                   mailbox: Mailbox | None = None) -> None:
        """Close the mailbox and fail every queued ask with ``error`` (``may_have_started=False``);
        ``revivable``: a later send may create new demand (after a retirement). ``mailbox``: the
        one a retiring incarnation was bound to (by then a send may have put a fresh one in its
        place, which is the next incarnation's); the handle's current one when None."""
        path = self.path

        def make() -> CastorError:
            return error(
                f"{path}: {reason}",
                data={"path": path, "reason": reason},
                may_have_started=False,
            )

        closing = self._mailbox if mailbox is None else mailbox
        for envelope in closing.close(make, revivable=revivable and self.revive_on_demand):
            if envelope.reply is not None:
                envelope.reply.fail(make())
            else:
                self.dead_letters += 1

    @property
    def has_new_demand(self) -> bool:
        """True when a send after retirement installed a fresh, open mailbox."""
        return not self._mailbox.closed

    @property
    def mailbox_closed(self) -> bool:
        """True while the current mailbox is closed: by a retirement (until a send puts a fresh
        one in its place) or for good."""
        return self._mailbox.closed

    def wait_exited(self, timeout: float) -> bool:
        """True once the current incarnation has ended. Its supervisor may not have bookkept the
        exit yet (a ``ChildExited`` is handled on the supervisor's thread): see :meth:`wait_gone`."""
        return self._exited.wait(timeout)

    def wait_gone(self, timeout: float) -> bool:
        """True once the actor has ended and been removed for good (``closed``: its supervisor
        took it out of its table, so a new child may start under the same id).

        False when the timeout passes, or when it runs again (its supervisor restarted it)
        -- which ends the wait early, as a restart is no removal. Polls ``alive`` every
        ``_GONE_RECHECK_S`` while the removal is pending (usually well under a millisecond).
        """
        deadline = time.monotonic() + timeout
        if self.alive and not self._exited.wait(timeout):
            return False
        while not self.alive:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self.closed.wait(min(remaining, _GONE_RECHECK_S)):
                return True
        return False

    @property
    def alive(self) -> bool:
        return self._actor is not None

    @property
    def actor(self) -> Incarnation | None:
        """The current incarnation (tests and faults only; never call it directly)."""
        return self._actor

    # -- inspection --------------------------------------------------------
    def snapshot(self) -> ActorSnapshot:
        """The actor's state, mailbox figures and activity, typed; consumes nothing, messages nobody."""
        return ActorSnapshot.model_validate(self.snapshot_data())

    def snapshot_data(self) -> dict[str, Any]:
        """:meth:`snapshot` as plain data, the shape of ``ActorSnapshot.model_dump(mode="json")``
        (msgpack- and JSON-ready), built without a model: watching 1,000 busy casts stays cheap
        (bench/snapshot.py). ``ops.actors`` and the console send this."""
        # read before the mailbox: a retirement's swap adds the old mailbox's count first, so a
        # swap in between can only leave its rejections out of this one snapshot, never twice
        rejected_before = self._rejected_before
        mailbox = self._mailbox
        depth, oldest, by_type = mailbox.snapshot()
        current = self.current
        now = time.monotonic()
        in_flight = None
        if current is not None:
            in_flight = {"message_type": current.type_name, "since_s": max(0.0, now - self.current_since),
                         "is_ask": current.reply is not None}
        failure = self.last_failure
        return {
            "path": self.path,
            "kind": self.kind,
            "state": self.state.value,
            "incarnation": self.incarnation,
            "restarts": self.restarts,
            "uptime_s": (now - self.started_at) if (self.started_at and self._actor is not None) else None,
            "retired_reason": self.retired_reason,
            "mailbox": {
                "depth": depth,
                "capacity": mailbox.capacity,
                "oldest_age_s": oldest,
                "by_type": by_type,
                "in_flight": in_flight,
                "processed": self.processed,
                "failed": self.failed,
                "rejected": rejected_before + mailbox.rejected,
                "dead_letters": self.dead_letters,
                "queued": _queued(mailbox, now) if depth else [],
            },
            "activity": self._activity(now, in_flight),
            "last_failure": {"error_type": failure[0], "message_type": failure[1],
                             "age_s": max(0.0, now - failure[2]), "at": failure[3]} if failure is not None else None,
            "labels": dict(self.labels),
            "restart_budget": _budget(self.restart_budget, now),
        }

    def _activity(self, now: float, in_flight: dict[str, Any] | None) -> dict[str, Any] | None:
        """What the actor does now: its own report or description, else derived from its mailbox."""
        if self._actor is None:
            return None
        reported = self.activity
        if reported is not None and reported[4] is not None and reported[4] is not self.current:
            reported = None  # said while handling a message that is done now
        chosen: tuple[Any, ...] | None = (*reported[:4], reported[5]) if reported is not None else None
        if chosen is None and self.describe is not None:
            try:
                chosen = self.describe()
            except Exception as exc:  # noqa: BLE001 - a snapshot must never fail on a description
                chosen = ("unknown", f"activity unavailable ({type(exc).__name__})", {}, now)
        if chosen is not None:
            deadline = chosen[4] if len(chosen) > 4 else None
            return {"kind": str(chosen[0]), "text": str(chosen[1]), "age_s": max(0.0, now - chosen[3]),
                    "data": _scalars(chosen[2]), "deadline_in_s": None if deadline is None else deadline - now}
        if in_flight is not None:
            return {"kind": "handling", "text": f"handling {in_flight['message_type']}", "age_s": in_flight["since_s"],
                    "data": {"message_type": in_flight["message_type"]}, "deadline_in_s": None}
        since = self.idle_since if self.idle_since is not None else now
        return {"kind": "idle", "text": "idle", "age_s": max(0.0, now - since), "data": {}, "deadline_in_s": None}

    def __repr__(self) -> str:
        return f"<ActorHandle {self.path} {self.state} #{self.incarnation}>"


def _budget(budget: tuple[str, Any] | None, now: float) -> dict[str, Any] | None:
    """A snapshot's ``restart_budget``: the restarts the limit's window holds now, read without a
    lock (the supervisor appends on its own thread: a copy that meets a change is read again)."""
    if budget is None:
        return None
    applies_to, intensity = budget
    for _attempt in range(3):
        try:
            times = tuple(intensity.times)
            break
        except RuntimeError:  # the deque changed while it was copied
            continue
    else:
        times = ()
    window = intensity.within_seconds
    return {"applies_to": applies_to, "restarts": sum(1 for t in times if now - t <= window),
            "max_restarts": intensity.max_restarts, "within_s": window}
