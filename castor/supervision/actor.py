"""The supervised actor: pykka's thread and identity, castor's loop.

An :class:`Actor` is one *incarnation* behind an
:class:`~castor.supervision.handle.ActorHandle`. castor replaces pykka's
receive loop to give one failure model and no silent deaths:

======================================  ===========================================  ===========================================
trigger                                 what the runtime does                        what the caller sees
======================================  ===========================================  ===========================================
handler returns                         reply resolved, ``processed`` += 1           the value
handler raises a ``CastorError``        reply failed; the actor keeps running        that error (an *answer*, not a crash)
handler raises anything else            reply failed; incarnation ends ``crashed``;  the exception; queued messages wait for
(tell or ask alike)                     supervisor told ``ChildExited``; the         the next incarnation or are rejected
                                        failing message is never redelivered         with ``ActorStopped(may_have_started=False)``
``retire(reason)`` (inside or out)      owned resources killed, mailbox closed,      queued asks fail ``Retired`` (or the
                                        every queued ask rejected, incarnation ends  actor's chosen error), never replayed;
                                        (asked by a handler: closed before that      a send after the handler's answer is
                                        handler's own answer is delivered)           new demand (a fresh incarnation)
``Control("stop")``                     ``on_terminate``; incarnation ends           queued messages kept for the supervisor
                                        ``stopped``                                  to hand on or reject
``Control("kill")`` / injected crash    treated exactly as a crash                   as a crash
``BaseException`` in a handler          treated as a crash of this actor only        (pykka would stop every actor)
======================================  ===========================================  ===========================================
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import contextvars
import functools
import sys
import threading
import time
import uuid
from typing import Any, Callable, ClassVar, TypeVar

import pykka

from castor._log import logger
from castor.messages.errors import ActorStopped, CastorError, Retired
from castor.supervision.fault_plan import kill_process_trees
from castor.supervision.handle import ActorHandle
from castor.supervision.kinds import ActorKilled, ControlKind, ExitKind, InjectedCrash
from castor.supervision.mailbox import REJECTED, Control, Envelope, Latch, Mailbox, _Resumer
from castor.supervision.threads import LOOP_THREADS
from castor.supervision.timers import CancelToken, call_later, tell_later

F = TypeVar("F", bound=Callable[..., Any])


_RESUME_RETRY_S = 0.01
"""How soon a resume that found no thread is tried again (doubling up to _RESUME_RETRY_MAX_S)."""
_RESUME_RETRY_MAX_S = 1.0

_ON_LOOP = threading.local()
"""The handle whose incarnation's loop runs on this thread (set once per incarnation)."""


def running_actor() -> ActorHandle | None:
    """The handle of the actor whose loop runs on the calling thread, else None: lets a stop
    asked for from inside the actor it would wait for not wait for itself (see ActorSystem)."""
    return getattr(_ON_LOOP, "handle", None)


def error_text(exc: BaseException, *, as_repr: bool = False) -> str:
    """``str(exc)`` (``repr`` with ``as_repr``) for logs and exit reports, never raising: a
    handler's exception whose ``__str__`` or ``__repr__`` itself raises must still crash its
    actor cleanly (logged, bookkept, restarted), not kill the loop that reports the crash."""
    try:
        return repr(exc) if as_repr else str(exc)
    except BaseException:  # noqa: BLE001 - any failure to render is replaced, whatever it is
        return f"<{type(exc).__name__}: its {'repr' if as_repr else 'str'}() raised>"


def handles(*message_types: type) -> Callable[[F], F]:
    """Mark a method as the handler of the given message classes."""

    def mark(method: F) -> F:
        method.__castor_handles__ = message_types  # type: ignore[attr-defined]  # the handler registry marks the function object itself
        return method

    return mark


class Actor(pykka.ThreadingActor):
    """Base class of every castor actor.

    Subclasses implement handlers with :func:`handles` (or override
    :meth:`receive`), release what they own in :meth:`on_terminate`, and
    list OS processes they own in :meth:`owned_pids` so faults and
    retirement can kill them from any thread.
    """

    use_daemon_thread = True  # a stuck handler must never keep the process alive
    #: Run ``on_start`` on the thread that starts the incarnation (inside ``spawn``, or the
    #: supervisor's thread for a restart), not on the loop thread: ``spawn`` then returns once it
    #: has run (whatever ``await_start`` says), with no thread hand-off for it, and an
    #: incarnation that ends in ``on_start`` never takes a loop thread (see :meth:`begin_incarnation`).
    #: Only for classes whose ``on_start`` never blocks and never asks its starter: the starter
    #: waits for it without ``start_timeout``. castor's SocketActor opts in.
    start_on_caller: ClassVar[bool] = False
    #: Let :meth:`ActorHandle.ask` run the handler on the asking thread when the incarnation is
    #: idle (parked on an empty mailbox): no thread hand-off either way. The handle's *turn* lock
    #: keeps one message at a time, in arrival order (see ActorHandle.ask); a stop, kill or
    #: retirement still happens on the loop thread, at the next message boundary. Only for classes
    #: whose handlers bound their own run time (the ask's timeout cannot interrupt a handler that
    #: runs on the asker's thread) and never ask their own actor. castor's IcarusWorkerActor opts in.
    inline_asks: ClassVar[bool] = False
    #: How long an idle loop keeps its thread, waiting for the next message, before it leaves it
    #: (see :meth:`_handle_messages`): mail that comes sooner is taken without a thread hand-off.
    idle_linger_seconds: ClassVar[float] = 0.005
    _dispatch: ClassVar[dict[type, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        table: dict[type, str] = {}
        for klass in reversed(cls.__mro__):
            for name, member in vars(klass).items():
                for message_type in getattr(member, "__castor_handles__", ()):
                    table[message_type] = name
        cls._dispatch = table

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        # pykka's __init__ is skipped on purpose: castor addresses actors by handle and
        # binds the handle's mailbox (see _bind), so pykka's identity (urn, ref, stopped
        # event) is made only if something asks for it (the properties below).
        pass

    @functools.cached_property
    def actor_urn(self) -> str:  # type: ignore[override]  # pykka declares it an attribute; castor computes it
        return uuid.uuid4().urn

    @functools.cached_property
    def _actor_ref(self) -> pykka.ActorRef[Any]:  # type: ignore[override]  # pykka declares it an attribute; castor computes it
        return pykka.ActorRef(self)

    @functools.cached_property
    def actor_stopped(self) -> threading.Event:  # type: ignore[override]  # pykka declares it an attribute; castor computes it
        stopped = threading.Event()
        if self.__dict__.get("_loop_ended"):
            stopped.set()
        return stopped

    @functools.cached_property
    def log(self) -> Any:
        """This incarnation's logger, bound to its path and number (made on first use); a line
        that names no ``msg_type`` gets the type of the message being handled ("-" between).
        ``configure_logging`` gives every record ``msg_type`` "-" by default: that counts as none."""
        handle = self.handle

        def patch(record: Any) -> None:
            extra = record["extra"]
            if extra.get("msg_type", "-") == "-":
                current = handle.current
                extra["msg_type"] = current.type_name if current is not None else "-"

        return logger.bind(actor=handle.path, incarnation=self.incarnation).patch(patch)

    @staticmethod
    def _create_actor_inbox() -> Any:
        return None  # castor binds the handle's mailbox instead (see bind_to)

    def begin_incarnation(self) -> None:
        """Start this bound, registered incarnation.

        Normally its whole loop, ``on_start`` included, goes to a loop thread. A class that
        :attr:`starts on the caller <start_on_caller>` runs ``on_start`` here first, in a fresh
        context (what a loop thread gives its loop); the rest of the loop then goes to a loop
        thread, or runs here too when ``on_start`` has ended the incarnation (a stop, a
        retirement, a crash): what is left of it cannot block, so it needs no thread. No thread
        to be had for the loop is a failed start, so a crash.
        """
        if not self.start_on_caller:
            self._start_actor_loop(self._actor_loop)
            return
        context = contextvars.Context()
        context.run(self._actor_loop_setup)
        if self._exit_kind is None and self._retire_request is None and not self._stop_requested:
            try:
                self._start_actor_loop(self._actor_loop_after_start)
                return
            except Exception as exc:  # noqa: BLE001 - e.g. "can't start new thread"
                context.run(self._crash, exc, None)
        context.run(self._actor_loop_after_start)

    def _actor_loop(self) -> None:
        self._actor_loop_setup()
        if self._actor_loop_running():
            self._actor_loop_teardown()

    def _actor_loop_after_start(self) -> None:
        if self._actor_loop_running():
            self._actor_loop_teardown()

    def _actor_loop_resumed(self) -> None:
        if self._actor_loop_running(resumed=True):
            self._actor_loop_teardown()

    def _resume_loop(self, resumer: _Resumer) -> None:
        """The mailbox has something for this incarnation, which left its loop thread while it
        waited (see :meth:`_handle_messages`): run the rest of the loop on a loop thread, in the
        context the loop left in (once: see mailbox._Resumer). Called under the mailbox's lock,
        on the thread that put."""
        try:
            LOOP_THREADS.run(functools.partial(resumer.run, self._actor_loop_resumed), type(self).__name__)
        except Exception as exc:
            # No thread to be had now. The resumer is spent (no later put would find it), and a
            # stop or a close may be the last thing that ever comes: retry on the timer thread
            # until a thread is had. Only when not even a timer can be set does the mailbox keep
            # the resumer for the next put (see mailbox._Resumer).
            owner = threading.Lock()  # one continuation: the timer's retry or the mailbox's
            try:
                self._retry_resume(resumer, _RESUME_RETRY_S, owner)
            except Exception:  # noqa: BLE001 - the mailbox's own retry (the next put) is left
                if owner.acquire(False):  # a retry queued with a timer that never started stays void
                    logger.opt(exception=exc).error(
                        f"{self.handle.path}: no thread to handle its mail; retried at the next")
                    raise exc from None
            logger.opt(exception=exc).error(f"{self.handle.path}: no thread to handle its mail; retried shortly")

    def _retry_resume(self, resumer: _Resumer, delay: float, owner: threading.Lock | None) -> None:
        """Try :meth:`_resume_loop`'s hand-off again in ``delay`` seconds, on the timer thread,
        backing off to :data:`_RESUME_RETRY_MAX_S` while no thread can be had. ``owner``: taken
        by the first retry (None once taken), unless the mailbox took the continuation back."""

        def retry() -> None:
            if owner is not None and not owner.acquire(False):
                return  # the timer could not be set after all: the mailbox's next put resumes
            try:
                LOOP_THREADS.run(functools.partial(resumer.run, self._actor_loop_resumed), type(self).__name__)
            except Exception as exc:  # noqa: BLE001 - still no thread: again, later
                logger.opt(exception=exc).error(f"{self.handle.path}: still no thread to handle its mail")
                self._retry_resume(resumer, min(delay * 2, _RESUME_RETRY_MAX_S), None)

        call_later(delay, retry, owner=self.handle.path)

    def _start_actor_loop(self, loop: Callable[[], None]) -> None:  # type: ignore[override]  # pykka's signature takes no loop; castor's start hands its own
        """Run ``loop`` (the whole loop, or what follows an on_start run on the caller) on a parked
        daemon thread (see threads.py), else a new one."""
        if not self.use_daemon_thread:
            threading.Thread(target=loop, name=type(self).__name__, daemon=False).start()
            return
        LOOP_THREADS.run(loop, type(self).__name__)

    # -- binding (called by the handle before the thread starts) -----------
    def bind_to(self, handle: ActorHandle, mailbox: Mailbox, incarnation: int) -> None:
        """Attach this incarnation to its handle and mailbox (the handle calls it, before the start)."""
        self.handle = handle
        self.inbox = mailbox
        # pykka's own name for the inbox, for pykka code that reads it (castor's loop replaces
        # pykka's, and castor's mailbox is not pykka's ActorInbox type: hence setattr).
        setattr(self, "actor_inbox", mailbox)  # noqa: B010 - see the line above
        self.incarnation = incarnation
        # The handlers as bound methods, made once per incarnation: a message then costs one
        # dict lookup, not a name lookup and a getattr. Empty for a class that overrides
        # receive (handle_envelope then calls its receive).
        self._handlers: dict[type, Callable[[Any], Any]] = (
            {message_type: getattr(self, name) for message_type, name in self._dispatch.items()}
            if type(self).receive is Actor.receive else {})
        self._exit_kind: ExitKind | None = None
        self._retire_request: tuple[str, type[CastorError]] | None = None
        self._retire_during: str | None = None  # the type of the message whose handler asked to retire
        self._stop_requested = False
        self._retire_closed = False  # the mailbox closed by this incarnation's retirement (once)
        self._abandoned = False
        #: True once this incarnation ended, was cut loose, or asked to stop or retire: one flag,
        #: set beside each of those four (an inline ask reads it twice), not a property over them.
        self.is_ending = False
        # launch waits for on_start (ordered start); with the base no-op there is nothing to wait for.
        self.start_latch: Latch | None = Latch() if type(self).on_start is not Actor.on_start else None

    @property
    def path(self) -> str:
        return self.handle.path

    def cut_loose(self) -> None:
        """Brutal shutdown (the handle's ``abandon``): the loop hands on whatever it takes next and ends."""
        # is_ending first: an inline ask that finds it unset after its handler has returned knows the
        # handling wrote its end (idle_since, skipped once _abandoned is set; see ActorHandle.ask).
        self.is_ending = True
        self._abandoned = True

    # -- hooks for subclasses --------------------------------------------
    def on_start(self) -> None:
        """Runs on the actor thread before the first message (on the starting thread for a class
        that :attr:`starts on the caller <start_on_caller>`); raising is a crash."""

    def receive(self, message: Any) -> Any:
        """Dispatch to the method registered for the message's class."""
        # handle_envelope finds a handler in the bound table itself; this is reached for a message
        # without one, or from a subclass that overrides receive and delegates here.
        name = self._dispatch.get(type(message))
        if name is None:
            raise TypeError(f"{type(self).__name__} has no handler for {type(message).__name__}")
        return getattr(self, name)(message)

    def on_terminate(self, cause: ExitKind) -> None:
        """Release what this incarnation owns. Runs once, on every kind of exit.

        ``cause`` is an :class:`~castor.supervision.kinds.ExitKind` (a ``str``: ``stopped``,
        ``crashed`` or ``retired``).
        """

    def owned_pids(self) -> list[int]:
        """OS processes this actor owns (for kill-process faults and retirement)."""
        return []

    def kill_owned(self) -> None:
        """Kill owned OS processes; safe from any thread. Default: SIGKILL each pid's tree."""
        kill_process_trees(self.owned_pids())

    # -- lifecycle requests from inside ------------------------------------
    def report_activity(self, kind: str | None, text: str = "", data: dict[str, Any] | None = None, *,
                        lasting: bool = False, since: float | None = None, deadline: float | None = None,
                        **more: Any) -> None:
        """Say what this actor is doing now, in words and data (scalars), for snapshots.

        Cheap (one assignment; nothing is built until a snapshot is taken). Said while handling
        a message, it lasts until that message is handled, unless ``lasting``; said elsewhere
        (``on_start``, or with ``lasting``) it lasts until replaced, cleared (``kind=None``) or
        the incarnation ends. ``since`` (monotonic) defaults to now. ``deadline`` (monotonic) is
        when the bound that ends this activity passes, if one does (snapshots show how far off
        it is: ``deadline_in_s``). ``data`` and keyword arguments are scalars (msgpack- and
        JSON-safe).
        """
        handle = self.handle
        if kind is None:
            handle.activity = None
            return
        facts = {**data, **more} if data is not None else more
        handle.activity = (kind, text, facts, time.monotonic() if since is None else since,
                           None if lasting else handle.current, deadline)

    def _fault_delay(self, seconds: float | None, message_type: str) -> None:
        """An injected delay (``delay_next``) says what it is while it lasts: an operator's drill
        must not read as a handler that hangs; over, the message's own handling shows."""
        if seconds is None:
            self.report_activity(None)
            return
        self.report_activity("fault_delay", f"injected delay of {seconds:g}s before handling {message_type}",
                             deadline=time.monotonic() + seconds, seconds=seconds, message_type=message_type)

    def count_metric(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``name`` of this actor's kind (``castor_<name>_total`` in /metrics)."""
        self.handle.registry.meters.count(name, self.handle.kind, n)

    def tally_metric(self, name: str) -> Callable[[], object]:
        """A callable that adds one to the counter ``name`` of this actor's kind, for a hot path:
        no lock and no Python frame per call (see ``Meters.tally``). Get it once, call it often."""
        return self.handle.registry.meters.tally(name, self.handle.kind)

    def observe_metric(self, name: str, seconds: float) -> None:
        """Record a duration in the histogram ``name`` of this actor's kind (``castor_<name>`` in /metrics)."""
        self.handle.registry.meters.observe(name, self.handle.kind, seconds)

    def describe_activity(self, describe: Callable[[], tuple[Any, ...] | None]) -> None:
        """Register ``describe() -> (kind, text, data, since[, deadline]) | None``, called only
        when a snapshot is taken (on the snapshotting thread: it must only read, and be quick);
        ``since`` and ``deadline`` are monotonic, as for :meth:`report_activity`."""
        self.handle.describe = describe

    def retire(self, reason: str, *, error: type[CastorError] = Retired) -> None:
        """Retire after the current handler: kill owned, reject everything queued, stop.

        Queued asks fail with ``error`` (``may_have_started=False``). The
        supervisor never restarts this incarnation or replays its mailbox.
        """
        self._retire_request = (reason, error)
        current = self.handle.current
        self._retire_during = current.type_name if current is not None else None  # for the log line
        self.is_ending = True

    def tell_self_later(self, message: Any, delay: float) -> CancelToken:
        """A timer as a message: ``message`` is told to this actor after ``delay`` seconds and handled
        like any other (on this actor's thread); cancel the token to call it off. The handle is the
        target, so a timer outlives a restart of this incarnation (see castor.supervision.timers)."""
        return tell_later(self.handle, message, delay)

    def stop_self(self) -> None:
        """End this incarnation normally after the current handler, or right after ``on_start`` when
        called there (``on_terminate("stopped")`` runs)."""
        self._stop_requested = True
        self.is_ending = True

    # -- the loop (replaces pykka's) ---------------------------------------
    def _actor_loop_setup(self) -> None:
        try:
            self.on_start()
        except BaseException as exc:  # noqa: BLE001 - a failed start is a crash
            self._crash(exc, None)
        finally:
            if self.start_latch is not None:
                self.start_latch.set()

    def _actor_loop_running(self, resumed: bool = False) -> bool:  # type: ignore[override]  # pykka's returns None; castor's says whether the loop ended
        """Handle messages until the incarnation ends (True) or, waiting on an empty mailbox,
        leaves this thread (False: the mailbox resumes the loop on a loop thread, see
        :meth:`_resume_loop`)."""
        outer = getattr(_ON_LOOP, "handle", None)  # an actor's thread that ran this one's on_start
        _ON_LOOP.handle = self.handle
        try:
            return self._handle_messages(resumed)
        finally:
            _ON_LOOP.handle = outer

    def _handle_messages(self, resumed: bool = False) -> bool:
        mailbox = self.inbox
        handle = self.handle
        if not resumed:
            self._honour_requests()  # a stop or retire asked for by on_start
        turn = handle.turn
        # An idle incarnation holds no thread: past idle_linger_seconds on an empty mailbox, the
        # loop returns its thread to the park, and the mailbox hands the rest of the loop to a
        # loop thread when mail comes. Not for a class on its own non-daemon thread
        # (use_daemon_thread False).
        resume = self._resume_loop if self.use_daemon_thread else None
        linger = self.idle_linger_seconds
        while self._exit_kind is None:
            item = mailbox.get(resume, linger)
            if item is None:
                return False  # left for the mailbox to resume (see Mailbox.get)
            if self._abandoned:
                # Cut loose by a brutal shutdown: this item belongs to the next incarnation.
                mailbox.put_back(item)
                if type(item) is Envelope and item.state == REJECTED and item.reply is not None:
                    item.reply.fail(ActorStopped(f"{self.handle.path} stopped", may_have_started=False))
                return True
            with turn:  # an inline ask (see inline_asks) may be running a handler: wait for it
                if self._exit_kind is not None or self._retire_request is not None or self._stop_requested:
                    # That handler ended this incarnation or asked it to end: honour it first, and
                    # hand this item on as if it had stayed queued (rejected by a retirement).
                    if type(item) is Envelope or item.kind is not ControlKind.HONOUR:
                        mailbox.put_back(item)
                        if type(item) is Envelope and item.state == REJECTED and item.reply is not None:
                            item.reply.fail(self._retired_error())
                    self._honour_requests()
                    break
                if type(item) is Envelope:
                    self.handle_envelope(item, handle)
                else:
                    self._control(item)
                if self._exit_kind is not None:
                    break
                if self._retire_request is not None or self._stop_requested:  # asked by that handler
                    self._honour_requests()
        return True

    def _honour_requests(self) -> None:
        """Act on ``retire`` / ``stop_self`` asked for by the handler (or ``on_start``) that just ran."""
        if self._exit_kind is not None:
            return
        if self._retire_request is not None:
            self._retire_now(*self._retire_request)
        elif self._stop_requested:
            self._terminate(ExitKind.STOPPED)
            self._exit_kind = ExitKind.STOPPED
            self.is_ending = True

    def _actor_loop_teardown(self) -> None:
        kind = self._exit_kind or ExitKind.STOPPED
        self._loop_ended = True
        stopped = self.__dict__.get("actor_stopped")
        if stopped is not None:
            stopped.set()
        if self._abandoned:
            self.after_cut_loose()
            return
        self.handle.incarnation_ended(self, kind)

    def after_cut_loose(self) -> None:
        """Runs on a cut-loose incarnation's own thread once its loop has ended (the overrunning
        handler returned): what must not outlive it even so. Nothing by default; a supervisor
        stops its children."""

    def handle_envelope(self, envelope: Envelope, handle: ActorHandle, since: float | None = None) -> None:
        """Handle one message (faults first) and resolve its reply; a crash ends the incarnation.

        ``since`` is when its handling began (monotonic), when the caller has just read the clock
        (an inline ask: the envelope's own time); None reads it here."""
        reply = envelope.reply
        handle.current = envelope
        handle.current_since = time.monotonic() if since is None else since
        try:
            if handle.faults.pending:
                handle.faults.apply_before(envelope.type_name, self._fault_delay)
            message = envelope.message
            handler = self._handlers.get(type(message))
            result = handler(message) if handler is not None else self.receive(message)
        except CastorError as exc:
            handle.failed += 1
            if self._retire_request is not None:
                self._close_for_retirement(*self._retire_request)  # before the answer: see there
            if reply is not None:
                reply.fail(exc)
            else:
                self.log.bind(msg_type=envelope.type_name).warning(
                    "told message answered with {code}: {message}", code=exc.code, message=exc.message
                )
        except BaseException as exc:  # noqa: BLE001 - crash of this actor only
            handle.failed += 1
            if reply is not None:
                reply.fail(exc)
            self._crash(exc, envelope)
        else:
            handle.processed += 1
            if self._retire_request is not None:
                self._close_for_retirement(*self._retire_request)
            if reply is not None:
                reply.set(result)
        finally:
            if not self._abandoned:  # a cut-loose handler's end is not its successor's idleness
                handle.current = None
                handle.idle_since = time.monotonic()

    def _retired_error(self) -> CastorError:
        """What a message taken just before a retirement gets (as the queue it was in)."""
        reason, error = self._retire_request or (self.handle.retired_reason or "retired", Retired)
        path = self.handle.path
        return error(f"{path}: {reason}", data={"path": path, "reason": reason}, may_have_started=False)

    def _control(self, item: Control) -> None:
        if item.kind is ControlKind.STOP:
            self._terminate(ExitKind.STOPPED)
            self._exit_kind = ExitKind.STOPPED
            self.is_ending = True
        elif item.kind is ControlKind.KILL:
            self._crash(ActorKilled(str(item.payload or "killed")), None)
        elif item.kind is ControlKind.RETIRE:
            self._retire_now(str(item.payload), Retired)

    def _crash(self, exc: BaseException, envelope: Envelope | None) -> None:
        msg_type = envelope.type_name if envelope is not None else "-"
        self.log.bind(msg_type=msg_type).opt(exception=exc).error(
            "actor crashed: {kind}: {exc}", kind=type(exc).__name__, exc=error_text(exc)
        )
        self.handle.last_error = exc
        self.handle.registry.meters.count("crashes", self.handle.kind)
        self.handle.last_failure = (type(exc).__name__, envelope.type_name if envelope is not None else None,
                                    time.monotonic(), time.time())
        self._terminate(ExitKind.CRASHED)
        self._exit_kind = ExitKind.CRASHED
        self.is_ending = True

    def _close_for_retirement(self, reason: str, error: type[CastorError]) -> None:
        """The first half of a retirement: kill what this incarnation owns, close its mailbox and
        reject every queued ask. Once only; nothing for an incarnation cut loose (the mailbox is
        its successor's).

        A handler that asked to retire has this done *before* its own answer is delivered
        (handle_envelope), on whichever thread ran it: an asker that sends its next message the
        moment it sees that answer finds the mailbox closed, so the send is new demand (a fresh
        incarnation) or refused by the rule in force (not revivable) -- never queued in the
        retiring mailbox and refused by its retirement, however long this thread is descheduled
        between the answer and the rest of the retirement."""
        if self._retire_closed or self._abandoned:
            return
        self._retire_closed = True
        handle = self.handle
        # Once the handler that asked for it has returned: the line names the message it decided on.
        self.log.bind(msg_type=self._retire_during or "-").warning("retiring: {reason}", reason=reason)
        handle.retired_reason = reason
        handle.registry.meters.count("retirements", handle.kind)
        try:
            self.kill_owned()
        except BaseException:  # noqa: BLE001 - the mailbox closes and the answer goes out all the same
            self.log.opt(exception=sys.exc_info()[1]).error("killing what the actor owns failed")
        # Reject the queue before any slow cleanup (on_terminate): callers learn at once.
        handle.reject_all(reason, error, revivable=True, mailbox=self.inbox)

    def _retire_now(self, reason: str, error: type[CastorError]) -> None:
        self._close_for_retirement(reason, error)
        self._terminate(ExitKind.RETIRED)
        self._exit_kind = ExitKind.RETIRED
        self.is_ending = True

    def _terminate(self, cause: ExitKind) -> None:
        if cause is not ExitKind.STOPPED:  # a clean stop releases through on_terminate alone
            try:
                self.kill_owned()
            except BaseException:  # noqa: BLE001 - on_terminate runs all the same
                self.log.opt(exception=sys.exc_info()[1]).error("killing what the actor owns failed")
        try:
            self.on_terminate(cause)
        except BaseException:  # noqa: BLE001 - cleanup must not mask the exit
            self.log.opt(exception=sys.exc_info()[1]).error("on_terminate failed")


__all__ = ["Actor", "ActorKilled", "InjectedCrash", "error_text", "handles", "running_actor"]
