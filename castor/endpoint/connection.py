"""A bidirectional msgpack-rpc connection over one byte transport.

Both peers use this class: the server for each accepted client, the
:mod:`castor.client` for its side. Guarantees:

* **Reading never waits long for a handler, and fast calls cost no thread
  hop.** Exactly one thread at a time holds the *reader role* (leader/
  follower). A worker that decodes a request runs the handler itself, on
  the spot; if that handler runs longer than ``inline_grace`` (default
  1 ms) the process-wide watchdog wakes an idle worker (at most
  ``max_workers`` threads) which takes the reader role over, so a slow
  method delays reading by about a millisecond at most. When every worker
  is busy the reader queues requests for the next free worker and keeps
  reading. A thread waiting for the response to its own outgoing call
  reads the socket itself when the role is free (it pokes a client worker
  blocked in ``poll`` to hand the role over), so a reply wakes its caller
  directly. Responses are resolved by whoever reads; requests a caller
  reads are queued for a worker. The role is never left free with nobody
  bound to take it: a caller that gives it up, or that leaves without
  reading because its reply was read for it, lets a worker take it back
  within ``_RETAKE_AFTER`` (tests/endpoint/test_reader_handover.py).
* **Bounded everything.** At most ``max_in_flight`` incoming requests and
  notifications are accepted and unfinished; over it a request gets a
  ``mailbox_full`` error response and a notification is dropped with an
  ``error`` notification -- or, with ``notifications_wait_for_a_slot`` (the
  client's), a notification of a method served here waits for a slot: reading
  stops until one frees, unless a caller waits for its response (reading goes
  on for it, bounded by ``max_read_ahead_bytes``), so none is lost and no
  call deadlocks behind them. A notification of a method nobody serves takes no
  slot (it fails at once on the reading thread, logged), so a storm of them is
  never answered at all. Outbound frames wait in a queue bounded in bytes
  and frames; overflowing it closes the connection with a logged reason —
  a producer (a handler, another session's cast) never blocks on a slow or
  stuck peer.
* **Every outgoing call has a deadline.** It raises ``Timeout``
  (``may_have_started=True``) when it passes; a reply that arrives later is
  discarded and counted in ``late_replies``.
* **Close is prompt.** Every pending outgoing call fails with
  :class:`~castor.endpoint.errors.ConnectionClosed`; threads blocked in the
  transport are woken; close callbacks run once.
* **What the peer said before it went is not lost.** A write the peer refuses (it closed:
  ``EPIPE``, ``ECONNRESET``) closes the connection at once, but first what the peer sent before
  it went, still unread in the transport, is read (bounded: ``_DRAIN_MAX_BYTES``, and the reader
  role within ``_DRAIN_WAIT``): its answers resolve their calls and its notifications that run
  on the reading thread run, as if the end of stream had been read. When the peer ended the
  connection (end of stream, or a refused write) and ``peer_parting`` names its reason -- the
  client's: an ``error`` notification that was the last frame before the end, a refusal -- every
  call the close fails, and every call made after it, raises that typed error (its
  ``__cause__`` the ``ConnectionClosed``) instead of a bare ``cancelled``. A close of this side's
  own making (``close()``, an interrupt) fails them ``cancelled``
  (tests/endpoint/test_transports.py). A close that a write or the
  input stream caused (a failed write, the outbound queue overflowing, an
  undecodable frame) can happen on any thread that sends or reads -- an
  actor's, inside a handler -- so its callbacks run on a thread of their own:
  a callback that closes the connection's sessions waits for their actors,
  which would otherwise include the actor whose write found the peer gone
  (tests/actors/icarus/test_session_endpoint.py, the peer gone on the hooks'
  thread).
* **An interrupted call leaves a connection that works or one that is closed, and nothing
  hangs.** An exception raised into a call from outside -- a signal handler's, such as Ctrl-C's
  ``KeyboardInterrupt`` on the main thread -- propagates unchanged. Struck while the call wrote
  its request or waited for its reply, it closes the connection (reason ``interrupted``): it
  may have landed between a ``recv`` and the decoder or halfway through a write, so the stream
  is no longer trusted. Struck before the request was handed to the writer, or after the reply
  was taken, it leaves the connection as it was (a reply still to come is discarded when it
  arrives). The waits a call makes hold no lock while they wait (see ``PendingCall`` and
  ``_waiting_callers``), so no lock is left released under another thread's hold
  (tests/endpoint/test_interrupted_call.py).
* **Bad frames never crash anything.** See :mod:`castor.endpoint.framing`
  for which ones keep the connection open.
"""

from __future__ import annotations

import itertools
import os
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import msgpack
from pydantic import BaseModel, ConfigDict, Field

from castor._log import logger
from castor._spin import ReplySpin
from castor.domain.jsontext import wide_integers_as_floats
from castor.endpoint.dispatch import Context, Dispatcher
from castor.endpoint.errors import ConnectionClosed, error_from_wire
from castor.endpoint.framing import (
    MAX_MSGID,
    REQUEST,
    RESPONSE,
    BadFrame,
    BadParams,
    FrameDecoder,
    FrameLimits,
    Notification,
    PendingFrame,
    Request,
    Response,
    UndecodableStream,
    encode_error_notification,
    encode_notification,
    encode_response,
    over_limits,
    packers,
    parse_frame,
    undecodable,
)
from castor.endpoint.transport import SocketTransport, Transport, raised_by_the_os
from castor.messages.errors import CastorError, ErrorCode, Internal, InvalidParams, MailboxFull, Timeout
from castor.supervision.threads import start_thread

_conn_ids = itertools.count(1)
_INFINITY = float("inf")
_GATE_LOCK = threading.Lock()  # makes a PendingCall's wait gate once (slow path only)
_NOTHING = object()
# Request(msgid, method, params) without the namedtuple's Python-level __new__ (the reading hot path).
_new_request = tuple.__new__
#: A request as the worker's whole read decodes it: ``(msgid, method, params)``, a Request's fields.
_PlainRequest = tuple[int, str, dict[str, Any]]
_unpackb = msgpack.unpackb
_get_ident = threading.get_ident
_new_context = object.__new__
_DONTWAIT = socket.MSG_DONTWAIT


class ConnectionSettings(BaseModel):
    """Per-connection limits (all documented in docs/protocol.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    frame_limits: FrameLimits = FrameLimits()
    max_workers: int = Field(8, ge=2, le=256)  # one thread always holds the reader role
    max_in_flight: int = Field(64, ge=1)
    max_outbound_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    max_outbound_frames: int = Field(10_000, ge=1)
    default_call_timeout: float = Field(30.0, gt=0)
    drain_timeout: float = Field(2.0, ge=0)
    max_remembered_timeouts: int = Field(1024, ge=0)
    inline_grace: float = Field(0.001, gt=0, le=1.0)
    #: A worker holding the reader role waits in poll() (pokable, so a thread
    #: waiting for its own call's reply can take over reading) instead of a
    #: blocking recv. The client wants this; a server saves a syscall per frame.
    #: Pipes always poll (closing a pipe does not wake a blocked read).
    poll_workers: bool = False
    max_sessions: int = Field(32, ge=1)  # sessions one connection may hold open; one more is mailbox_full
    #: The runtime's last this-many session slots (at most half its limit) are kept for connections
    #: that hold no session yet: a connection's second and later sessions cannot take them, so a few
    #: connections opening all they may (or a plugin reconnecting in a loop) never leave another
    #: harness without its first session. 64, the server's default connection limit: with at most
    #: that many connections, every one of them can open one (``castor serve --max-connections``
    #: sets it to the limit it is given).
    sessions_kept_for_first: int = Field(64, ge=0)
    #: A notification of a method this side serves that finds every in-flight slot taken waits for
    #: one instead of being dropped (the client's choice; a server drops it with an ``error``
    #: notification, so a peer cannot make castor stop reading it). It is queued in order behind
    #: the slots, and reading stops until the queue is back under ``max_in_flight`` -- back-pressure
    #: on the peer -- except while a call of this side waits for its response, which may be behind
    #: those notifications: reading then goes on, queueing them, up to ``max_read_ahead_bytes``.
    notifications_wait_for_a_slot: bool = False
    #: What a reader waiting for its own call's response queues of notifications that wait for a
    #: slot; past it the call waits without reading (it ends at its deadline: ``timeout``).
    max_read_ahead_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    #: A worker idle this long ends, unless it is the connection's last: a burst of slow handlers
    #: grows the pool up to ``max_workers``, and a long-lived connection (a harness's, an
    #: operator's) gives those threads back afterwards instead of keeping them for its lifetime.
    worker_idle_exit: float = Field(10.0, gt=0)


# A worker takes back a reader role that callers left free after this long without a caller.
_RETAKE_AFTER = 0.002
# What _run returns for an inline request it ended itself (its in-flight slot released, the
# handler's grace over) in the lock section that would have counted its response as on its way:
# the reader role kept, or handed to the callers waiting for it. _read_as_worker's section after
# the write is then not needed: one lock section a request fewer.
_ENDED_HERE = 2
_ENDED_ROLE_HANDED = 3
# Longest a waiting caller sleeps before re-checking the reader role (a safety net).
_CALLER_RECHECK = 0.05
# The most a cork holds; a frame that would take it past this writes it out at once (the cork is
# for a handler's few small notifications, and what it holds is not yet under the outbound bound).
_CORK_MAX_BYTES = 64 * 1024
#: A failed notification is a warning at most this often per connection (see _notification_failed).
NOTIFICATION_FAILURE_LOG_INTERVAL_S = 10.0


class WarningGate:
    """One warning, then at most one every ``interval_s``, for a kind of line a peer can cause as
    fast as it likes: :meth:`passes` says whether this one is the warning, and how many were not
    since the last (each then a debug line). Thread-safe."""

    def __init__(self, interval_s: float = NOTIFICATION_FAILURE_LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.warned_at = float("-inf")  # when the last warning was let through
        self._quiet = 0  # lines kept at debug level since
        self._lock = threading.Lock()

    def passes(self) -> tuple[bool, int]:
        """(this line is a warning, how many were kept quiet since the last one)."""
        now = time.monotonic()
        with self._lock:
            quiet = self._quiet
            if now - self.warned_at >= self.interval_s:
                self.warned_at, self._quiet = now, 0
                return True, quiet
            self._quiet += 1
            return False, quiet
# A write the peer refused closes the connection after reading what it sent before it went:
# at most this much, and only if the reader role comes free (its holder sees the close) this soon.
_DRAIN_MAX_BYTES = 1024 * 1024
_DRAIN_WAIT = 0.25
# The reason a write failure gives a close (reasons are free text; this prefix is looked for).
_WRITE_FAILED = "write failed"
# A connection stays registered with the watchdog this long after its last frame. Registering
# wakes the watchdog's thread; a busy connection that dropped out between two calls and came back
# at the next one woke it about once a millisecond, a thread hand-off on one CPU. While frames
# flow it now stays registered (one tick a millisecond, as before, and no wake-up per call).
_WATCH_LINGER = 0.005


class PendingCall:
    """An outgoing request waiting for its response; ``result()`` honours the deadline.

    Resolved exactly once: only the thread that removed the call from the connection's pending
    table (the reader that matched its response, or close failing it) calls :meth:`resolve`, and
    :meth:`Connection.expire` removes it without resolving. The common path needs no lock: the
    caller usually reads its own response, so it resolves and reads the slot on one thread. A
    thread that must *wait* for another to resolve it makes a gate on the way (the waiter
    stores the gate and then re-reads ``settled``; the resolver stores ``settled`` and then reads the
    gate: one of the two always sees the other's store).

    The gate is a plain lock made locked, which the resolver releases once and each waiter passes
    on after taking it, not an ``Event``: an ``Event``'s wait re-takes an inner lock on its way out,
    and an exception raised into that wait by a signal handler (Ctrl-C's ``KeyboardInterrupt``) can
    leave that lock released under the resolver's hold. A plain lock's wait holds nothing while
    it waits, so an interrupted wait leaves nothing behind.
    """

    __slots__ = ("msgid", "method", "deadline", "_conn", "settled", "_value", "_error", "_gate", "_timed_out")

    def __init__(self, conn: Connection, msgid: int, method: str, deadline: float) -> None:
        self._conn = conn
        self.msgid = msgid
        self.method = method
        self.deadline = deadline
        #: Set once :meth:`resolve` ran (read without a lock on the reader's path).
        self.settled = False
        self._value: Any = None
        self._error: CastorError | None = None
        self._gate: threading.Lock | None = None
        self._timed_out = False

    @property
    def resolved(self) -> bool:
        """Whether :meth:`resolve` ran (read without a lock on the reader's path)."""
        return self.settled

    def resolve(self, error: CastorError | None, result: Any) -> None:
        """Settle the call with the peer's error or result (the connection calls it exactly once)."""
        if self.settled:
            return  # never reached (one resolver); kept so a second outcome could not win
        self._error = error
        self._value = result
        self.settled = True
        gate = self._gate
        if gate is not None:
            gate.release()  # made locked; released once, here (one resolver)

    def wait_resolved(self, timeout: float | None) -> bool:
        """Block until :meth:`resolve` ran or ``timeout`` passed; ``True`` if it ran."""
        if self.settled:
            return True
        gate = self._gate
        if gate is None:
            with _GATE_LOCK:
                gate = self._gate
                if gate is None:
                    gate = threading.Lock()
                    gate.acquire()
                    self._gate = gate
        if self.settled:  # resolved before the resolver could see the gate
            return True
        if not gate.acquire(True, -1 if timeout is None else max(0.0, timeout)):
            return self.settled
        gate.release()  # for the next waiter, if any
        return True

    def done(self) -> bool:
        return self.settled

    def result(self) -> Any:
        """The result, or raise the peer's error / ``Timeout`` / ``ConnectionClosed``."""
        if not self.settled and not self._timed_out:
            self._conn.await_reply(self)
        if not self.settled:
            if self._timed_out or self._conn.expire(self):
                self._timed_out = True
                raise Timeout(f"{self.method} got no reply in time", may_have_started=True,
                              data={"method": self.method, "msgid": self.msgid})
            try:
                self.wait_resolved(None)  # the reply won the race with the deadline: its reader is resolving it
            except BaseException as exc:
                self._conn.close_interrupted(threading.get_ident(), None, exc)
                raise
        error = self._error
        if error is not None:
            raise error
        return self._value


class _MadePendingCall(PendingCall):
    """A :class:`PendingCall` whose fields :meth:`Connection.call` stores in its own frame: made by a
    plain call of the class (no ``__init__`` frame), which costs less than ``object.__new__(cls)``
    (no argument tuple, no subtype check of the class against ``object``)."""

    __slots__ = ()
    __init__ = object.__init__  # the C slot itself: no frame


class Connection:
    """One msgpack-rpc peer. Create, :meth:`start`, then call / notify / close."""

    # Slots, not an instance dict: the round trip reads and writes some forty of these on each side,
    # and with seventy-odd attributes an instance dict is past what CPython 3.11 keeps as inline
    # values -- each access was a dict-with-hint look-up, or an unspecialised one where the hint
    # missed (a slot is a fixed offset). Every attribute a Connection holds is named here.
    __slots__ = ("_caller_recv", "_chunk", "_close_callbacks", "_closed", "_closed_event", "_closing_for", "_cond",
                 "_cork", "_cork_bytes", "_cork_thread", "_decoder", "_eof", "_expired", "_expired_set",
                 "_fds_released", "_fed", "_frame_bytes", "_frame_start", "_grace", "_idle", "_in_flight",
                 "_incomplete_at", "_inline_since", "_jobs", "_log", "_max_ext", "_max_frame", "_max_out_bytes",
                 "_max_read_ahead", "_msgids", "_mutex", "_name", "_notify_gate", "_out", "_out_bytes", "_parked",
                 "_parked_bytes", "_peer_fault_level", "_pending", "_pending_frame", "_plock", "_poked",
                 "_poll_workers", "_poller", "_polling", "_read_failed", "_recv_buffer", "_recv_into",
                 "_released_at", "_replied", "_role", "_room_waiter", "_smallest_limit", "_threads",
                 "_waiting_callers", "_wake_r", "_wake_w", "_watch_frames", "_watch_seen", "_watched", "_whole_max",
                 "_wlock", "_wmutex", "_worker_numbers", "_write_failed", "_writer_busy", "close_reason", "_counters",
                 "_frames_in", "_frames_out", "_calls_out",
                 "default_timeout", "dispatcher", "id", "parting_error", "peer_parting", "reply_spin", "settings",
                 "state", "transport", "__weakref__")

    @property
    def name(self) -> str:
        """The connection's name: its threads' owner (``/endpoint/NAME``) and its log lines' ``conn``."""
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        # A server renames what it accepts (``unix-N``) before starting it: the log must say the same
        # name as the threads, which take it at start.
        self._name = value
        self._log = logger.bind(conn=value, actor=f"/endpoint/{value}")  # as its threads' owner reads

    def __init__(self, transport: Transport, dispatcher: Dispatcher, *,
                 settings: ConnectionSettings | None = None, name: str | None = None) -> None:
        self.id = next(_conn_ids)
        self.transport = transport
        self.dispatcher = dispatcher
        self.settings = settings or ConnectionSettings()
        #: The deadline of a call made without ``timeout=`` (``settings.default_call_timeout``; a
        #: :class:`~castor.client.Client` sets its own ``default_timeout`` here).
        self.default_timeout: float = self.settings.default_call_timeout
        self.state: dict[str, Any] = {}
        self.close_reason: str | None = None
        # The reason this side decided to close for before its parting words went out (undecodable
        # input): a write of them that fails closes with it, not with the write's failure.
        self._closing_for: str | None = None
        #: The typed reason the peer gave for ending the connection, or None (set by its owner: the
        #: client's ``error`` notification read last before the end). Asked once, when a close the
        #: peer caused (end of stream, a refused write) fails the pending calls.
        self.peer_parting: Callable[[], CastorError | None] | None = None
        #: A caller's bounded spin before it blocks for its answer, and the poll it spins with (the
        #: socket, POLLIN): set by ``castor.client`` where the process may run on several CPUs.
        self.reply_spin: tuple[ReplySpin, Callable[[Any], list[Any]]] | None = None
        #: What ``peer_parting`` answered at the close (calls made after it raise it too).
        self.parting_error: CastorError | None = None
        self.name = name or f"conn-{self.id}"  # binds the log too (see the property)
        # The level of the lines a peer's own faults cost (bytes that are not msgpack, a reset
        # before its answer, an answer it does not read): DEBUG for a peer that has not
        # authenticated, so that anyone who can connect cannot write a line per connect.
        self._peer_fault_level = "WARNING"
        self._decoder = FrameDecoder(self.settings.frame_limits)
        self._closed = False
        self._closed_event = threading.Event()
        self._close_callbacks: list[Callable[[Connection], None]] = []
        # Worker/reader coordination.
        # ``with self._mutex`` (C-level) for plain critical sections; ``_cond`` (same lock)
        # only to wait/notify — Condition.__enter__ is Python code on the hot path.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._threads = 0
        self._worker_numbers = itertools.count(1)  # names only (workers end and start again)
        self._idle = 0
        self._role: int | None = None          # thread ident holding the reader role
        self._inline_since: float | None = None  # the role holder is running a handler
        self._released_at = 0.0
        self._watched = False  # registered with the process-wide watchdog
        self._watch_frames = -1  # frames_in at the watchdog's last look (see watchdog_check)
        self._watch_seen = 0.0  # when the watchdog last saw frames_in move
        # Callers waiting for the reader role, each as its gate: a lock made locked, which a thread
        # that frees the role (or reads a reply) releases; the caller takes it outside the mutex.
        # Not the condition the workers wait on: a wait on a condition re-takes the mutex on its
        # way out, and an exception a signal handler raises there (Ctrl-C on the main thread)
        # would leave the mutex released under another thread's hold.
        self._waiting_callers: list[threading.Lock] = []
        self._polling = False
        self._poked = False
        self._grace = self.settings.inline_grace
        self._wake_r, self._wake_w = os.pipe()
        self._poller = select.poll()
        self._poller.register(transport.read_fd, select.POLLIN | select.POLLPRI)
        self._poller.register(self._wake_r, select.POLLIN)
        self._fds_released = False
        self._poll_workers = self.settings.poll_workers or not getattr(transport, "interruptible", False)
        # A caller may block in recv itself when the socket has a receive timeout.
        self._caller_recv = bool(getattr(transport, "recv_timeout", None))
        self._fed = 0  # bytes fed to the unpacker (vs unpacker.tell(): is anything buffered?)
        # _fed when the reader last found the frame it decodes incomplete (-1: never): while it
        # still equals _fed, the reader waits for the rest of a frame (see incomplete_frame).
        self._incomplete_at = -1
        # Where the frame being decoded began. msgpack frees the bytes of a partly decoded value
        # (it keeps the objects built so far), so max_buffer_size alone does not bound a frame:
        # _fed - _frame_start does, checked once every whole frame buffered has been taken (a
        # read may end inside a frame and hold whole frames before it: they are not part of
        # it). Over the limit the stream is undecodable.
        self._frame_start = 0
        self._max_frame = self.settings.frame_limits.max_buffer_size
        # A read no longer than this that holds exactly one frame is decoded whole (``unpackb``), not
        # through the incremental decoder: every string, binary, array and map in it is then within
        # the frame limits by its length alone (each element takes a byte), and ext types are
        # bounded by ``max_ext_len`` given to unpackb -- the decoder's own limits, as it would apply them.
        self._whole_max = min(self.settings.frame_limits.smallest, self._max_frame)
        self._max_ext = self.settings.frame_limits.max_ext_len
        # A socket's read, made in the hot paths' own frames (SocketTransport.read_available's body;
        # None for a pipe, read through read_available): one Python call a read fewer.
        sock_transport = transport if isinstance(transport, SocketTransport) else None
        self._recv_into: Callable[[memoryview], int] | None = (
            sock_transport.recv_into if sock_transport is not None else None)
        self._recv_buffer: memoryview = (sock_transport.recv_buffer if sock_transport is not None
                                         else memoryview(b""))
        self._read_failed: Callable[[OSError], bytes | None] = (
            sock_transport.read_failed if sock_transport is not None else _reraise)
        # The bytes fed last (the read that left a frame incomplete holds its newest part), and the
        # header reader of the incomplete frame: a string, binary or ext announced over the limits
        # is refused at its header, not once the frame limit's worth of it arrived (PendingFrame).
        self._chunk: bytes = b""
        self._pending_frame: PendingFrame | None = None
        self._max_out_bytes = self.settings.max_outbound_bytes
        # over_limits' free case, read once: no frame this short can break a limit.
        self._smallest_limit = self.settings.frame_limits.smallest
        self._eof = False
        self._jobs: deque[Request | Notification] = deque()
        self._in_flight = 0
        # Notifications queued over max_in_flight (notifications_wait_for_a_slot): id of the frame
        # in _jobs -> its size in bytes, their total, the size of the frame read last, and whether
        # the reader waits for the queue to come back under the bound (finishing jobs wake it).
        self._parked: dict[int, int] = {}
        self._parked_bytes = 0
        self._max_read_ahead = self.settings.max_read_ahead_bytes  # (settings are frozen) read per call
        self._frame_bytes = 0
        self._room_waiter = False
        # Of those, the ones whose response is already on its way (counted before it is written,
        # released with their slot): a peer that waits for a reply before its next request is
        # never refused for a slot the finished request still held.
        self._replied = 0
        # Outbound queue.
        self._wmutex = threading.Lock()
        self._wlock = threading.Condition(self._wmutex)
        self._out: deque[bytes | memoryview] = deque()
        self._out_bytes = 0
        self._writer_busy = False
        self._write_failed = False  # the writer's write failed: it writes nothing more
        # The cork (under _wmutex): frames an inline handler sends wait here for its response and
        # go out with it in one write (see _send). At most one handler is corked at a time.
        self._cork: list[bytes | memoryview] | None = None
        self._cork_thread: int | None = None
        self._cork_bytes = 0
        # Outgoing calls.
        self._plock = threading.Lock()
        self._pending: dict[int, PendingCall] = {}
        self._msgids = itertools.count()
        self._expired: deque[int] = deque(maxlen=self.settings.max_remembered_timeouts)
        self._expired_set: set[int] = set()
        # The three counts a round trip moves are attributes (a slot's increment costs a fraction of a
        # dict item's); the rest are a dict. ``counters`` gives all of them.
        self._frames_in = 0
        self._frames_out = 0
        self._calls_out = 0
        self._counters = {
            "invalid_frames": 0, "late_replies": 0,
            "unmatched_replies": 0, "rejected_in_flight": 0, "call_timeouts": 0,
            "handler_errors": 0, "role_steals": 0, "workers_exited_idle": 0, "calls_interrupted": 0,
            "unauthenticated_notifications": 0, "notifications_failed": 0, "notifications_waited": 0,
        }
        self._notify_gate = WarningGate()  # a failed notification's warning lines

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Connection:
        start_thread(self._writer, name=f"castor-{self.name}-writer", owner=f"/endpoint/{self.name}",
                     purpose="write this connection's outgoing frames")
        with self._mutex:
            self._spawn_locked()
        return self

    @property
    def closed(self) -> bool:
        return self._closed

    def limit_frames(self, max_bytes: int | None) -> None:
        """Cap an incoming frame at ``max_bytes`` (a tighter bound than the settings', e.g. before
        a connection has authenticated); ``None`` restores the settings' own limit. Over it the
        stream is undecodable and the connection closes."""
        default = self.settings.frame_limits.max_buffer_size
        self._max_frame = default if max_bytes is None else min(max_bytes, default)
        self._whole_max = min(self.settings.frame_limits.smallest, self._max_frame)

    def limit_outbound(self, max_bytes: int | None) -> None:
        """Cap the answers queued for a peer that is not reading at ``max_bytes`` (a tighter bound
        than the settings', e.g. before a connection has authenticated); ``None`` restores the
        settings' own. Over it the connection closes (outbound overflow), as over the settings'."""
        default = self.settings.max_outbound_bytes
        self._max_out_bytes = default if max_bytes is None else min(max_bytes, default)

    def quiet_peer_faults(self, quiet: bool) -> None:
        """Log what the peer's own faults close the connection for at debug level (``True``: a
        peer that has not authenticated, whom a line per connect would let fill the log) or as
        warnings (``False``, the default). Counted either way."""
        self._peer_fault_level = "DEBUG" if quiet else "WARNING"

    def add_close_callback(self, fn: Callable[[Connection], None]) -> None:
        """Run ``fn(conn)`` once when the connection closes -- on the closing thread, or at once on
        the caller's if it already closed: never call this holding a lock ``fn`` takes."""
        with self._mutex:
            if not self._closed:
                self._close_callbacks.append(fn)
                return
        self._run_callback(fn)

    def wait_closed(self, timeout: float | None = None) -> bool:
        return self._closed_event.wait(timeout)

    def close(self, reason: str = "closed", *, flush_timeout: float = 0.0,
              callbacks_apart: bool = False, by_peer: bool = False) -> None:
        """Close once: optionally flush queued output, wake every thread, fail pending calls.

        The close callbacks run on this thread once the rest is done, or (``callbacks_apart``) on a
        thread of their own: for a close that happens on whichever thread wrote or read, possibly an
        actor's inside a handler, which the callbacks (closing sessions) would wait for.

        ``by_peer``: the peer ended the connection (its end of stream, a write it refused): the
        pending calls fail with its parting reason when ``peer_parting`` names one. A refused
        write's close reads what the peer sent before it went first (the module's note)."""
        if flush_timeout > 0 and not self._closed:
            self._uncork()  # a corked response (an auth refusal's) is flushed like the rest
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            if self._closing_for is not None:  # decided before the write that failed (see _on_undecodable)
                reason = self._closing_for
            self.close_reason = reason
            callbacks, self._close_callbacks = self._close_callbacks, []
            self._poke(force=True)  # under the lock: the wake fds cannot be released yet
            self._cond.notify_all()
            self._wake_callers_locked()
        if flush_timeout > 0:
            self._flush(flush_timeout)
        with self._wlock:
            dropped = len(self._out)
            self._out.clear()
            self._out_bytes = 0
            self._wlock.notify_all()
        if by_peer and reason.startswith(_WRITE_FAILED):
            self._drain_input()
            if self._closing_for is not None:  # what the peer sent before it went was undecodable
                reason = self.close_reason = self._closing_for
        parting = self._peer_parting() if by_peer else None
        self.parting_error = parting
        self.transport.close()
        self._fail_pending(reason, parting)
        with self._mutex:
            self._wake_callers_locked()  # callers waiting for the reader role see their failure
            self._maybe_release_fds()
        self._log.info("connection closed: {} (dropped {} queued frames)", reason, dropped)
        self._closed_event.set()
        if callbacks_apart and callbacks:
            start_thread(self._run_callbacks, args=(callbacks,), name=f"castor-{self.name}-closed",
                         owner=f"/endpoint/{self.name}",
                         purpose="run the close callbacks of a close a write or a read caused")
            return
        self._run_callbacks(callbacks)

    def _run_callbacks(self, callbacks: list[Callable[[Connection], None]]) -> None:
        for fn in callbacks:
            self._run_callback(fn)

    def _run_callback(self, fn: Callable[[Connection], None]) -> None:
        try:
            fn(self)
        except Exception:
            self._log.exception("close callback failed")

    def incomplete_frame(self) -> tuple[int, int] | None:
        """``(bytes of the frame begun, bytes read in all)`` while the reader waits for the rest of
        a frame the peer began, else None. Read without a lock: a caller that acts on it (the
        server's reaper) sees the same answer twice, a while apart, before it concludes anything."""
        fed, begun = self._fed, self._frame_start
        if self._incomplete_at != fed or fed <= begun:
            return None
        return fed - begun, fed

    @property
    def handlers_running(self) -> int:
        """Incoming requests and notifications admitted and not finished (``stats()["in_flight"]``),
        read without the lock or a dict built: the server's reaper asks it of every connection."""
        return self._in_flight

    @property
    def calls_pending(self) -> int:
        """Outgoing calls waiting for their response (``stats()["pending_calls"]``), read as
        :attr:`handlers_running` is."""
        return len(self._pending)

    def stats(self) -> dict[str, Any]:
        with self._mutex:
            workers = {"threads": self._threads, "idle": self._idle, "in_flight": self._in_flight,
                       "queued": len(self._jobs), "handler_running_inline": self._inline_since is not None,
                       "notifications_waiting_bytes": self._parked_bytes}
        return {"name": self.name, "peer": getattr(self.transport, "peer", "?"), "closed": self._closed,
                "close_reason": self.close_reason, "pending_calls": len(self._pending),
                "outbound_bytes": self._out_bytes, "outbound_frames": len(self._out),
                **workers, **self.counters}

    @property
    def counters(self) -> dict[str, int]:
        """The connection's counts (frames in and out, calls made, refusals, timeouts ...) as they
        are now: a snapshot, read without a lock."""
        return {"frames_in": self._frames_in, "frames_out": self._frames_out, "calls_out": self._calls_out,
                **self._counters}

    # ------------------------------------------------------------------ outgoing
    def call(self, method: str, params: dict[str, Any] | None = None, *, timeout: float | None = None,
             pending_only: bool = False) -> Any:
        """Send a request and wait for its result (raises the peer's error or ``Timeout``);
        ``pending_only``: return the :class:`PendingCall` once the request is sent (``call_async``).

        The common case runs in this frame: a caller that may read the socket itself (a receive
        timeout is set: the client's) and finds the reader role free takes it, reads once, and when
        that read is exactly this call's answer (a result, decoded whole) settles the call and hands
        the role back here. The deadline is read once a call, here: a read that brings nothing
        wakes at the receive timeout and the general loop looks at the deadline then, as ever.
        Anything else -- the role held by another thread, something buffered, another frame, part
        of one, an error answer, the end of stream -- goes on in ``_read_as_caller`` with the bytes
        already read, or in ``PendingCall.result``, exactly as it would have. An exception raised
        into the wait from outside closes the connection (:meth:`close_interrupted`), as one raised
        into ``await_reply`` does; one raised before the request was handed to the writer leaves
        the connection as it was."""
        timeout = self.default_timeout if timeout is None else timeout
        try:
            bounded = 0 < timeout < _INFINITY  # False for NaN, infinity, zero and below
        except TypeError:
            bounded = False
        if not bounded:
            raise _no_deadline(method, timeout)
        deadline = time.monotonic() + timeout
        if self._closed or self._eof:
            raise self._closed_error(method)
        # itertools.count is atomic under the GIL; a msgid repeats only after 2**32 calls.
        msgid = next(self._msgids) & MAX_MSGID
        call = _MadePendingCall()  # PendingCall.__init__, inlined (one frame a call fewer)
        call._conn = self  # noqa: SLF001 - PendingCall is this module's
        call.msgid = msgid
        call.method = method
        call.deadline = deadline
        call.settled = False
        call._value = None  # noqa: SLF001 - see above
        call._error = None  # noqa: SLF001 - see above
        call._gate = None  # noqa: SLF001 - see above
        call._timed_out = False  # noqa: SLF001 - see above
        try:
            self._pending[msgid] = call
            if self._closed or self._eof:  # lost a race with close() or the end of stream: it may
                self._pending.pop(msgid, None)  # have swapped the table already
                raise self._closed_error(method)
            try:  # encode_request's body, inlined (one frame a call fewer)
                try:
                    packer = packers.packer
                except AttributeError:
                    packer = packers.packer = msgpack.Packer(use_bin_type=True)
                try:
                    frame: bytes = packer.pack([REQUEST, msgid, method, [params or {}]])
                except BaseException:
                    packers.packer = msgpack.Packer(use_bin_type=True)  # never reuse a half-written buffer
                    raise
            except (TypeError, ValueError, OverflowError) as exc:
                self._forget(msgid)
                raise _unsendable(method, exc) from None
            too_big = (None if len(frame) <= self._smallest_limit
                       else over_limits(frame, params, self.settings.frame_limits))
            if too_big is not None:
                self._forget(msgid)
                raise InvalidParams(f"{method} not sent: {too_big}", may_have_started=False,
                                    data={"method": method, "reason": "params_too_large"})
            self._calls_out += 1
            # _send's common case, inlined (one frame a call fewer): no cork (a request never joins
            # one, it writes one out), nothing queued, the connection open; anything else is _send's.
            overflow = None
            handled = False
            try:
                with self._wmutex:
                    if self._cork is None and not self._out and not self._writer_busy and not self._closed:
                        handled = True
                        sent: int | OSError | None
                        send = self.transport.send_direct
                        if send is not None:  # SocketTransport.send_nowait's body, in this frame
                            try:
                                sent = send(frame, _DONTWAIT)
                            except (BlockingIOError, InterruptedError):
                                sent = 0
                            except OSError as exc:
                                sent = exc
                        else:
                            try:
                                sent = self.transport.send_nowait(frame)
                            except OSError as exc:
                                sent = exc
                        if sent == len(frame):
                            self._frames_out += 1
                        else:
                            overflow = self._queue_locked(frame, sent)
            except BaseException as exc:  # as _send: interrupted while writing, the connection closes
                self.close_interrupted(_get_ident(), None, exc)
                raise
            if not handled:
                self._send(frame, urgent=True)  # closes the connection if interrupted while writing
            elif overflow is not None:
                self._close_for_overflow(overflow)
        except CastorError:
            raise
        except BaseException:  # interrupted from outside (Ctrl-C): the call is not kept
            self._pending.pop(msgid, None)
            raise
        if pending_only:
            return call
        if not self._caller_recv:
            return call.result()
        me = _get_ident()
        mutex = self._mutex
        took = False
        try:
            with mutex:  # await_reply's taking of a free role
                if (self._role is None and not call.settled and not self._closed and not self._eof
                        and self._parked_bytes < self._max_read_ahead):
                    self._role = me
                    self._inline_since = None
                    took = True
            if took:
                if self._decoder.unpacker.tell() != self._fed:  # bytes buffered: the general loop
                    self._read_as_caller(call, me, False)
                    return call.result()
                recv_into = self._recv_into
                data: bytes | memoryview | None
                if recv_into is None:
                    data = self.transport.read_available()
                else:  # read_available's body (SocketTransport), in this frame, without its copy:
                    spin = self.reply_spin  # (a spin first, where set: castor._spin; the read is as ever)
                    if spin is not None and spin[0].wanted():
                        spin[0].poll(spin[1])
                    buffer = self._recv_buffer  # the read is decoded from the kept buffer itself and
                    try:  # copied only when it goes on to the decoder (it holds no reference to it)
                        data = buffer[:recv_into(buffer)]
                    except OSError as exc:
                        data = self._read_failed(exc)
                value: Any = _NOTHING
                if data and len(data) <= self._whole_max:
                    try:
                        value = _unpackb(data, max_ext_len=self._max_ext)
                    except Exception:  # not one whole frame, or not msgpack: the decoder says which
                        pass
                if type(value) is list and len(value) == 4:
                    kind, answered, error, result = value
                    if (error is None and answered == msgid and kind == 1 and type(kind) is int
                            and type(answered) is int):
                        self._frames_in += 1
                        pending = self._pending.pop(msgid, None)  # as _on_response
                        if pending is None:  # failed by a close meanwhile: counted there
                            self._on_response(msgid, None, result)
                        else:  # PendingCall.resolve, inlined (this thread is its one resolver)
                            pending._value = result  # noqa: SLF001 - see above
                            pending.settled = True
                            gate = pending._gate  # noqa: SLF001 - see above
                            if gate is not None:
                                gate.release()
                        released = time.monotonic()
                        with mutex:  # _read_as_caller's hand-back of the role
                            if self._role == me:
                                self._role = None
                                if self._waiting_callers:
                                    self._wake_callers_locked()
                                elif not self._closed:
                                    # A worker takes the role back unless another call comes soon.
                                    self._released_at = released
                                    if not self._watched:
                                        self._watch_locked()
                            if self._closed:
                                self._maybe_release_fds()
                        if pending is not None:
                            return result
                        return call.result()
                self._read_as_caller(call, me, False, have_read=True,
                                     read=bytes(data) if type(data) is memoryview else data)
        except BaseException as exc:
            self.close_interrupted(me, None, exc)
            raise
        return call.result()

    def call_async(self, method: str, params: dict[str, Any] | None = None, *,
                   timeout: float | None = None) -> PendingCall:
        """Send now, wait later: the :class:`PendingCall`, whose ``result()`` honours the deadline."""
        pending: PendingCall = self.call(method, params, timeout=timeout, pending_only=True)
        return pending

    def notify(self, method: str, params: dict[str, Any] | None = None) -> bool:
        """Queue a notification; ``False`` if the connection is closed or the notification is over
        the protocol's limits (never sent: the peer would drop the connection on it; logged).
        Params msgpack cannot carry (an object, nested past its depth) raise ``invalid_params``."""
        try:
            frame = encode_notification(method, params or {})
        except (TypeError, ValueError, OverflowError) as exc:
            raise _unsendable(method, exc) from None
        too_big = None if len(frame) <= self._smallest_limit else over_limits(frame, params, self.settings.frame_limits)
        if too_big is not None:
            self._log.error("{} not sent: {}", method, too_big)
            return False
        return self._send(frame)

    def _forget(self, msgid: int) -> None:
        with self._plock:
            self._pending.pop(msgid, None)

    def expire(self, pending: PendingCall) -> bool:
        """Forget ``pending`` (its caller's deadline passed; a late reply is counted, not matched);
        ``False`` if the reply raced in first. :meth:`PendingCall.result` calls it."""
        with self._plock:
            if self._pending.pop(pending.msgid, None) is None:
                return False
            if self._expired.maxlen:
                if len(self._expired) == self._expired.maxlen:
                    self._expired_set.discard(self._expired[0])
                self._expired.append(pending.msgid)
                self._expired_set.add(pending.msgid)
        self._counters["call_timeouts"] += 1
        return True

    def _on_response(self, msgid: int, error: Any, result: Any) -> None:
        pending = self._pending.pop(msgid, None)  # dict.pop is atomic under the GIL
        if pending is None:
            with self._plock:
                late = msgid in self._expired_set
                if late:
                    self._expired_set.discard(msgid)
            key = "late_replies" if late else "unmatched_replies"
            self._counters[key] += 1
            self._log.debug("discarded {} for msgid {}", key, msgid)
            return
        pending.resolve(None if error is None else error_from_wire(error), result)
        if self._waiting_callers:
            with self._mutex:
                self._wake_callers_locked()

    def _closed_error(self, method: str) -> CastorError:
        """What a call made on the closed connection -- or after the peer's end of stream, when no
        answer can come any more -- raises (nothing was sent)."""
        closed = ConnectionClosed(f"{method}: connection closed", may_have_started=False,
                                  data={"reason": self.close_reason or "eof"})
        return _as_parting(self.parting_error, closed)

    def _peer_parting(self) -> CastorError | None:
        """The peer's typed reason for ending the connection, when its owner can name one
        (``peer_parting``)."""
        if self.peer_parting is None:
            return None
        try:
            return self.peer_parting()
        except Exception:  # pragma: no cover - the owner's hook; the calls fail cancelled then
            self._log.exception("peer_parting failed")
            return None

    def _fail_pending(self, reason: str, parting: CastorError | None = None) -> None:
        with self._plock:
            old, self._pending = self._pending, {}
        for msgid in list(old):
            call = old.pop(msgid, None)  # a racing reply may have popped it: resolve exactly once
            if call is None:
                continue
            closed = ConnectionClosed(f"{call.method}: connection closed ({reason})",
                                      may_have_started=True, data={"reason": reason})
            call.resolve(_as_parting(parting, closed), None)

    # ------------------------------------------------------------------ writing
    def _send(self, data: bytes | memoryview, *, urgent: bool = False) -> bool:
        """Write now if the kernel takes it, else queue for the writer; never blocks.

        A frame sent by the thread running a corked inline handler (not ``urgent`` -- a request is, its
        caller waits for the answer -- and within ``_CORK_MAX_BYTES``) joins the cork; any other send first
        writes the cork out, so frames leave in the order ``_send`` was called. The cork is also
        written when the handler returns (with its response), when the watchdog finds it past
        ``inline_grace``, when it is overtaken, and before a close that flushes.

        An exception raised into it from outside (Ctrl-C on the main thread) may leave part of
        a frame on the wire and the rest nowhere: the connection closes (:meth:`close_interrupted`).
        """
        try:
            with self._wmutex:
                if self._closed:
                    return False
                cork = self._cork
                if cork is None:
                    frames = 1
                elif (not urgent and self._cork_thread == threading.get_ident()
                      and self._cork_bytes + len(data) <= _CORK_MAX_BYTES):
                    cork.append(data)
                    self._cork_bytes += len(data)
                    return True
                else:
                    self._cork = self._cork_thread = None
                    cork.append(data)
                    frames = len(cork)
                    data = b"".join(cork)
                if not self._out and not self._writer_busy:  # _write_locked inlined (each call sends here)
                    try:
                        sent: int | OSError | None = self.transport.send_nowait(data)
                    except OSError as exc:
                        sent = exc
                    if sent == len(data):
                        self._frames_out += frames
                        return True
                    overflow = self._queue_locked(data, sent)
                else:
                    overflow = self._queue_locked(data, 0)
                if overflow is None:
                    return True
        except BaseException as exc:
            self.close_interrupted(threading.get_ident(), None, exc)
            raise
        self._close_for_overflow(overflow)
        return False

    def _close_for_overflow(self, overflow: str) -> None:
        """Close after a write failed or overflowed, the close callbacks on a thread of their own:
        any thread writes (an actor's mid-handler, the watchdog's, a worker answering inline), and
        the callbacks end sessions that may wait on that very thread."""
        self._log.log(self._peer_fault_level, "closing connection: {}", overflow)
        self.close(overflow, callbacks_apart=True,  # any thread sends: an actor's, mid-handler
                   by_peer=overflow.startswith(_WRITE_FAILED))

    def _uncork(self, me: int | None = None, tail: bytes | None = None) -> None:
        """Write the corked frames out (only ``me``'s cork, if given) and end the cork; ``tail``
        (an inline handler's response) goes out last, in the same write when the cork is still
        ``me``'s, else as any other frame (the cork was overtaken and written meanwhile)."""
        with self._wmutex:
            cork = self._cork
            if cork is None or (me is not None and self._cork_thread != me):
                if tail is None:
                    return
                overflow = None  # not ours to end: the tail is sent below, outside the lock
            else:
                self._cork = self._cork_thread = None
                if tail is not None:
                    cork.append(tail)
                    tail = None
                if not cork or self._closed:
                    return
                frames = len(cork)
                overflow = self._write_locked(cork[0] if frames == 1 else b"".join(cork), frames)
                if overflow is None:
                    return
        if overflow is None:  # the tail, not ours to write with a cork
            if tail is not None:
                self._send(tail)
            return
        self._close_for_overflow(overflow)  # the watchdog's thread, or a handler's

    def _write_locked(self, data: bytes | memoryview, frames: int) -> str | None:
        """Write or queue ``data`` (``frames`` frames) under ``_wmutex``; the overflow reason, if any."""
        if not self._out and not self._writer_busy:
            try:
                sent: int | OSError | None = self.transport.send_nowait(data)
            except OSError as exc:
                sent = exc
            if sent == len(data):
                self._frames_out += frames
                return None
            return self._queue_locked(data, sent)
        return self._queue_locked(data, 0)

    def _queue_locked(self, data: bytes | memoryview, sent: int | OSError | None) -> str | None:
        """What ``_write_locked`` does once a write did not take the whole of ``data`` (``sent``: how
        much it took, or the write's error): queue the rest for the writer, in order, or say why
        the connection must close (the write failed, or the outbound queue would overflow)."""
        if isinstance(sent, OSError):
            if not raised_by_the_os(sent):
                raise sent
            return f"{_WRITE_FAILED}: {sent}"
        if sent:
            data = memoryview(data)[sent:]  # the writer sends the rest, in order
        if (self._out_bytes + len(data) > self._max_out_bytes
                or len(self._out) >= self.settings.max_outbound_frames):
            return (f"outbound queue overflow ({len(self._out)} frames, "
                    f"{self._out_bytes} bytes queued): peer is not reading")
        self._out.append(data)
        self._out_bytes += len(data)
        self._wlock.notify()
        return None

    def _writer(self) -> None:
        while True:
            with self._wlock:
                while not self._out:
                    if self._writer_busy:
                        self._writer_busy = False
                        self._wlock.notify_all()  # flushers wait for an idle writer
                    if self._closed:
                        return
                    self._wlock.wait()
                chunks = list(self._out)
                self._out.clear()
                self._writer_busy = True
            size = sum(len(c) for c in chunks)
            try:
                self.transport.sendall(b"".join(chunks))
            except OSError as exc:
                with self._wlock:
                    self._writer_busy = False
                    self._write_failed = True  # what is still queued is never written: flushes end
                    self._wlock.notify_all()
                if not self._closed:
                    self.close(f"{_WRITE_FAILED}: {exc}", by_peer=True)
                return
            with self._wlock:
                self._out_bytes = max(0, self._out_bytes - size)
                self._frames_out += len(chunks)

    def _flush(self, timeout: float) -> None:
        """Wait until the queued frames are written, for at most ``timeout``; at once when the
        writer's last write failed (the peer is gone: the rest would never be written)."""
        deadline = time.monotonic() + timeout
        with self._wlock:
            while (self._out or self._writer_busy) and not self._write_failed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._wlock.wait(remaining)

    # ------------------------------------------------------------------ reading and dispatch
    def _spawn_locked(self) -> None:
        self._threads += 1
        start_thread(self._worker, name=f"castor-{self.name}-w{next(self._worker_numbers)}",
                     owner=f"/endpoint/{self.name}", purpose="read and dispatch this connection's frames")

    def _maybe_release_fds(self) -> None:
        """Close the wake pipe once closed and no thread can poll or poke it (caller holds ``_cond``)."""
        if self._closed and not self._fds_released and self._threads == 0 and self._role is None:
            self._fds_released = True
            for fd in (self._wake_r, self._wake_w):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _poke(self, *, force: bool = False) -> None:
        """Wake the role holder out of ``poll`` (caller holds ``_cond``)."""
        if self._fds_released:
            return
        if force or (self._polling and not self._poked):
            self._poked = True
            try:
                os.write(self._wake_w, b"x")
            except OSError as exc:
                if not raised_by_the_os(exc):
                    raise

    def _worker(self) -> None:
        """Run a queued job, else take the free reader role, else steal it from a slow handler, else idle."""
        me = threading.get_ident()
        cond = self._cond
        mutex = self._mutex
        finished = False
        replied = 0
        stole = False
        idle_exit = self.settings.worker_idle_exit
        timed_out = False  # the last idle wait ended without a wake-up
        while True:
            job = None
            with mutex:
                if finished:
                    finished = False
                    self._in_flight -= 1
                    self._replied -= replied
                    if (self._eof and not self._in_flight) or self._room_waiter:
                        cond.notify_all()
                while True:
                    if self._closed:
                        self._threads -= 1
                        if self._role == me:
                            self._role = None
                        self._maybe_release_fds()
                        return
                    if self._jobs:
                        job = self._jobs.popleft()
                        if self._parked:
                            self._parked_bytes -= self._parked.pop(id(job), 0)
                        break
                    if not self._eof:
                        # A role a caller gave up is taken back only after _RETAKE_AFTER (the
                        # watchdog wakes a worker then): the caller's next call usually comes
                        # first, and a worker holding the role would have to be poked out of poll
                        # for it -- a hand-off each way. A worker that just ran a notification the
                        # caller read for it used to do exactly that at every call.
                        if (self._role is None and not self._waiting_callers
                                and time.monotonic() - self._released_at >= _RETAKE_AFTER):
                            self._role = me
                            break
                        since = self._inline_since
                        if since is not None and time.monotonic() - since >= self._grace:
                            # The holder is stuck in a handler: reading continues here.
                            self._role, self._inline_since = me, None
                            self._counters["role_steals"] += 1
                            stole = True
                            break
                    if timed_out and self._threads > 1:
                        # Idle for ``worker_idle_exit`` with nothing found to do (the checks above
                        # ran after the wait, so a wake-up lost to the timeout is not missed).
                        # Another thread remains: the watchdog spawns again if it is ever needed.
                        self._threads -= 1
                        self._counters["workers_exited_idle"] += 1
                        return
                    self._idle += 1
                    timed_out = not cond.wait(idle_exit)
                    self._idle -= 1
            if job is not None:
                replied = self._run(job)
                finished = True
            else:
                if stole:  # the overtaken handler's frames go out now (it may run for long)
                    stole = False
                    self._uncork()
                self._read_as_worker(me)

    def watchdog_check(self, now: float) -> bool:
        """Called by the watchdog every tick; ``True`` to stay watched.

        Wakes the workers when the role holder has been inside a handler for
        ``inline_grace`` (one steals the role), or when callers left the role
        free for ``_RETAKE_AFTER`` (one takes it back, so frames the peer
        sends on its own are read while no call is waiting). With nothing to
        watch, a connection whose frames still flow stays registered for
        ``_WATCH_LINGER`` after the last one the watchdog saw, so a busy
        connection does not wake the watchdog's thread again at its next call.

        The answers that ask nothing of the connection (a handler within its grace, a role freed
        less than ``_RETAKE_AFTER`` ago, frames that moved since the last tick) are read first
        without the mutex: each is "stay watched, nothing to do", a stale read of them only moves
        the look that acts to the next tick, and the watchdog's own marks (``_watch_frames``,
        ``_watch_seen``) are written by its thread alone. Anything else is decided under the mutex,
        as ever. With many connections (16 clients' and their server's) the watchdog looked at each
        under its mutex every millisecond, contending with the reader's and the caller's sections.
        """
        since = self._inline_since
        if since is not None:
            if now - since < self._grace:
                return True
        elif self._role is None:
            if now - self._released_at < _RETAKE_AFTER:
                return True
        else:
            frames = self._frames_in
            if frames != self._watch_frames:
                self._watch_frames, self._watch_seen = frames, now
                return True
            if now - self._watch_seen < _WATCH_LINGER:
                return True
        with self._mutex:
            if self._closed or self._eof:
                self._watched = False
                return False
            since = self._inline_since
            if since is not None:
                if now - since < self._grace:
                    return True
                self._wake_worker_locked()
            elif self._role is None and not self._waiting_callers:
                if now - self._released_at >= _RETAKE_AFTER:
                    self._wake_worker_locked()
                return True
            else:
                frames = self._frames_in
                if frames != self._watch_frames:
                    self._watch_frames, self._watch_seen = frames, now
                    return True
                if now - self._watch_seen < _WATCH_LINGER:
                    return True
                self._watched = False
                return False
        # A handler past its grace: the frames it sent are not held for its response. Written
        # outside the mutex (a failed write closes the connection, which takes it).
        self._uncork()
        return True

    @property
    def watched(self) -> bool:
        """Registered with the process-wide watchdog (it drops a connection that is not)."""
        return self._watched

    def _wake_worker_locked(self) -> None:
        if self._idle:
            # One idle worker is enough (all of them woke before, and all but one went back to
            # sleep: a switch each on one CPU). Callers wait on their own gates, not here.
            self._cond.notify()
        elif self._threads < self.settings.max_workers:
            self._spawn_locked()

    def _watch_locked(self) -> None:
        if not self._watched:
            self._watched = True
            _WATCHDOG.watch(self)

    def _read_as_worker(self, me: int) -> None:
        """Hold the reader role: read; run each request here unless no one could take over reading."""
        cond = self._cond
        mutex = self._mutex
        wmutex = self._wmutex
        max_in_flight = self.settings.max_in_flight
        max_workers = self.settings.max_workers
        wait_for_a_slot = self.settings.notifications_wait_for_a_slot
        unpacker = self._decoder.unpacker
        # A worker that blocks in recv (a socket's: it does not poll) reads here, in this frame,
        # the common case: nothing buffered, and one read that is exactly one well-formed request
        # (decoded whole: see _whole_max). Anything else -- part of a frame, several, a response, a
        # notification, not msgpack -- is fed to the decoder as it came and _read_frame goes on
        # from there with every check it makes.
        read_here = not self._poll_workers
        read_available = self.transport.read_available
        recv_into, recv_buffer = self._recv_into, self._recv_buffer  # read_available's body, inlined below
        monotonic = time.monotonic
        data: bytes | memoryview | None
        while True:
            frame: Request | Notification | _PlainRequest | None = None
            if read_here and unpacker.tell() == self._fed and not self._closed:
                if recv_into is None:
                    data = read_available()
                else:
                    try:  # without its copy: decoded from the kept buffer, copied only for the decoder
                        data = recv_buffer[:recv_into(recv_buffer)]
                    except OSError as exc:
                        data = self._read_failed(exc)
                if not data:
                    if data is not None:  # the end of stream (None: a spurious wake-up, read again)
                        self._begin_eof(me, in_worker=True)
                        return
                else:
                    value: Any = _NOTHING
                    size = len(data)
                    if size <= self._whole_max:
                        try:
                            value = _unpackb(data, max_ext_len=self._max_ext)
                        except Exception:  # two frames, part of one, or not msgpack: the decoder says which
                            pass
                    if type(value) is list and len(value) == 4:
                        kind, msgid, method, params = value
                        if (kind == 0 and type(kind) is int and type(msgid) is int and 0 <= msgid <= MAX_MSGID
                                and type(method) is str and method and type(params) is list and len(params) == 1
                                and type(params[0]) is dict):
                            self._frames_in += 1
                            self._frame_bytes = size
                            # A plain tuple, not a Request (tuple.__new__ on the subclass copies it): made a
                            # Request only where one is kept or refused (_run takes either).
                            frame = (msgid, method, params[0])
                    if frame is None:  # _take inlined: the decoder and _read_frame take it from here
                        data = bytes(data)  # the kept buffer is read into again: the decoder's chunk is a copy
                        try:
                            unpacker.feed(data)
                        except msgpack.BufferFull:
                            self._take_refused(me)
                            return
                        self._fed += size
                        self._chunk = data
            if frame is None:
                frame = self._read_frame(me, None)
                if frame is None:
                    return
            if type(frame) is Notification and not self.dispatcher.has(frame.method):
                self._run(frame)  # nobody serves it: its failure is logged here, it holds no slot
                continue
            # Admission and the inline decision in one critical section. A worker's thread runs
            # no signal handler, so acquire-then-try (cheaper than ``with``) is safe here only:
            # tests/endpoint/test_lock_sections.py.
            mutex.acquire()
            try:
                if self._in_flight - self._replied >= max_in_flight:
                    admitted = inline = False
                    if wait_for_a_slot and type(frame) is Notification:
                        self._park_locked(frame)
                        admitted = full = True
                else:
                    self._in_flight += 1
                    admitted = True
                    if self._idle or self._threads < max_workers:
                        self._inline_since = monotonic()
                        if not self._watched:
                            self._watch_locked()
                        inline = True
                    else:
                        self._jobs.append(_kept(frame))
                        inline = False
                        # Only a queue that reached the bound makes the reader wait for room.
                        full = self._in_flight - self._replied >= max_in_flight
            finally:
                mutex.release()
            if not admitted:
                self._refuse(_kept(frame))
                continue
            if not inline:
                if wait_for_a_slot and full and not self._wait_for_room(me):
                    return  # a caller reads from here on
                continue
            wmutex.acquire()  # cork what the inline handler sends (unless a cork is on already)
            try:
                if self._cork is None:
                    self._cork_thread = me
                    self._cork = []
                    self._cork_bytes = 0
            finally:
                wmutex.release()
            replied = self._run(frame, me)  # ends the cork
            if replied == _ENDED_HERE:
                continue
            if replied == _ENDED_ROLE_HANDED:
                return  # a caller reads from here on
            with mutex:
                self._in_flight -= 1
                self._replied -= replied
                if self._eof and not self._in_flight:
                    cond.notify_all()
                if self._role != me:
                    return  # stolen while the handler ran: back to the pool
                self._inline_since = None
                if self._waiting_callers:
                    self._role = None
                    self._wake_callers_locked()
                    return

    def await_reply(self, call: PendingCall) -> None:
        """Wait for ``call`` until its deadline, reading the transport ourselves when we can.

        A caller that waited for the role may leave without reading: its reply was read (and
        the role handed to the callers) by the holder meanwhile, or its deadline passed. The
        role may then be free with no caller left to take it, so on the way out the caller
        arranges, as ``_read_as_caller`` does, for a worker to take it back — else nothing
        would read what the peer sends next until the next outgoing call.

        An exception raised into the wait from outside (a signal handler's: Ctrl-C's
        ``KeyboardInterrupt`` on the main thread) ends the call and closes the connection
        (see :meth:`close_interrupted`); it propagates unchanged.
        """
        me = threading.get_ident()
        mutex = self._mutex
        waiting = self._waiting_callers
        waited = False
        gate: threading.Lock | None = None  # ours while registered in _waiting_callers
        try:
            waited = False  # an instruction ahead of the loop, inside the try: see _read_as_caller
            while not call.settled:
                remaining = call.deadline - time.monotonic()
                if remaining <= 0:
                    return
                with mutex:
                    if gate is not None:
                        waiting.remove(gate)
                        gate = None
                    if call.settled:
                        return
                    if self._closed or self._eof or self._parked_bytes >= self._max_read_ahead:
                        read, held = False, False  # (read ahead as far as allowed: a worker reads on)
                    elif self._role is None or self._role == me:
                        held = self._role == me  # a handler calling back its own peer
                        self._role = me
                        self._inline_since = None
                        read = True
                    else:
                        gate = threading.Lock()
                        gate.acquire()
                        waiting.append(gate)
                        self._poke()
                        if self._room_waiter:  # the holder waits for a slot, not in poll
                            self._cond.notify_all()
                        waited = True
                if gate is not None:  # the role holder releases it when it gives the role up
                    gate.acquire(True, min(remaining, _CALLER_RECHECK))
                    continue
                if not read:
                    call.wait_resolved(remaining)
                    return
                waited = False  # _read_as_caller hands the role back itself
                self._read_as_caller(call, me, held)
        except BaseException as exc:
            self.close_interrupted(me, gate, exc)
            raise
        finally:
            if gate is not None or waited:
                with mutex:
                    if gate is not None and gate in waiting:  # left at its deadline or settled
                        waiting.remove(gate)
                    if (waited and self._role is None and not waiting and not self._closed
                            and not self._eof):
                        self._released_at = time.monotonic()
                        self._watch_locked()

    def _wake_callers_locked(self) -> None:
        """Open the gate of every caller waiting for the reader role (caller holds the mutex);
        each takes its gate out of ``_waiting_callers`` itself when it next holds the mutex."""
        for gate in self._waiting_callers:
            if gate.locked():
                gate.release()

    def close_interrupted(self, me: int, gate: threading.Lock | None, exc: BaseException) -> None:
        """An exception not of the connection's own making left a call on thread ``me``.

        It may have struck anywhere: between a ``recv`` returning and its bytes reaching the
        decoder, halfway through writing a frame, inside the bookkeeping of the reader role. The
        stream can no longer be trusted either way, so the connection closes with reason
        ``interrupted``, as an HTTP client drops a connection whose request was interrupted:
        later calls raise ``ConnectionClosed`` at once, calls waiting on other threads fail with
        it, and the peer sees the connection end (and cancels what it ran for it, as for any
        client that goes away). The role and the caller's gate are handed back first, so every
        thread can see the close and leave.
        """
        try:
            with self._mutex:
                if gate is not None and gate in self._waiting_callers:
                    self._waiting_callers.remove(gate)
                if self._role == me:
                    self._role = None
                    self._inline_since = None
                if self._closed:
                    return  # closed already (by this interrupt's first catcher, or before it)
            self._counters["calls_interrupted"] += 1
            self._log.warning("closing connection: a call was interrupted by {}", type(exc).__name__)
            self.close("interrupted")
        except BaseException:  # a second interrupt while closing: close() can be called again
            pass

    def _read_as_caller(self, call: PendingCall, me: int, held: bool, *, have_read: bool = False,
                        read: bytes | None = None) -> None:
        """Read as the reader role's holder until ``call`` is settled, its deadline passes or the
        role is given up; hand the role back on the way out. ``have_read``: :meth:`call` read once
        with nothing buffered and ``read`` is what that brought (bytes, ``b""`` at the end of
        stream, ``None`` at the receive timeout), taken here as this function's own first read."""
        mutex = self._mutex
        try:
            if have_read or (not held and self._caller_recv and not self._closed
                             and self._decoder.unpacker.tell() == self._fed):
                # The common case, in this frame: nothing is buffered, and one read brings exactly
                # this call's answer (a whole frame, decoded at once). Anything else -- another
                # frame, part of one, two together, an error answer -- goes to the decoder and the
                # loop below, as if it had read the bytes itself.
                data = read if have_read else self.transport.read_available()
                if data:
                    value: Any = _NOTHING
                    if not have_read and len(data) <= self._whole_max:  # (call() tried its read whole)
                        try:
                            value = _unpackb(data, max_ext_len=self._max_ext)
                        except Exception:  # not one whole frame, or not msgpack: the decoder says which
                            pass
                    if type(value) is list and len(value) == 4:
                        kind, msgid, error, result = value
                    else:
                        kind = msgid = error = None
                    if (error is None and msgid == call.msgid and kind == 1 and type(kind) is int
                            and type(msgid) is int):
                        self._frames_in += 1
                        pending = self._pending.pop(msgid, None)  # as _on_response
                        if pending is None:  # expired or failed by a close meanwhile: counted there
                            self._on_response(msgid, None, result)
                        else:  # PendingCall.resolve, inlined (this thread is its one resolver)
                            pending._value = result  # noqa: SLF001 - PendingCall is this module's
                            pending.settled = True
                            gate = pending._gate  # noqa: SLF001 - see above
                            if gate is not None:
                                gate.release()
                        return
                    if not self._take(me, data):
                        return
                elif data is None:  # the receive timeout: a look at the deadline, as _read_frame's
                    if time.monotonic() >= call.deadline:
                        return
                else:
                    self._begin_eof(me, in_worker=False)
                    return
            # A statement ahead of the loop, inside the try. CPython 3.11 takes a pending signal
            # at a loop's backward jump after jumping, and looks its handler up at the
            # instruction *before* the loop's head: were that instruction outside the try, an
            # interrupt taken at ``continue`` would skip this ``finally`` (and the reader role
            # would stay with a thread that left). tests/endpoint/test_lock_sections.py checks
            # every loop in castor for it.
            cond = self._cond
            while not call.settled:
                frame = self._read_frame(me, call.deadline, call)
                if frame is None:
                    return
                if type(frame) is Notification and (not self.dispatcher.has(frame.method)
                                                    or self.dispatcher.runs_on_reading_thread(frame.method)):
                    self._run(frame)  # a notification has no response and no in-flight slot to hold
                    continue
                with mutex:  # a request for us: a worker runs it, this thread keeps waiting
                    admitted = self._in_flight - self._replied < self.settings.max_in_flight
                    if admitted:
                        self._in_flight += 1
                        self._jobs.append(frame)
                        if self._idle:
                            cond.notify()
                        elif self._threads < self.settings.max_workers:
                            self._spawn_locked()
                    elif self.settings.notifications_wait_for_a_slot and type(frame) is Notification:
                        # Queued, not dropped; this thread reads on for its response (which may be
                        # behind more of them) until the queue holds max_read_ahead_bytes.
                        self._park_locked(frame)
                        admitted = True
                if not admitted:
                    self._refuse(frame)
                elif self._parked_bytes >= self._max_read_ahead:
                    return  # await_reply waits without reading; a worker reads once there is room
        finally:
            with mutex:
                if self._role == me:
                    if held and not self._closed:
                        self._inline_since = time.monotonic()  # back inside the handler
                    else:
                        self._role = None
                        if self._waiting_callers:
                            self._wake_callers_locked()
                        elif not self._closed:
                            # A worker takes the role back unless another call comes soon.
                            self._released_at = time.monotonic()
                            if not self._watched:
                                self._watch_locked()
                if self._closed:
                    self._maybe_release_fds()

    def _read_frame(self, me: int, deadline: float | None,
                    call: PendingCall | None = None) -> Request | Notification | None:
        """As role holder, return the next request/notification (not yet admitted).

        ``None`` when ``call`` got its answer or its deadline passed (role
        kept), or the role was given up: EOF, close, undecodable input, or a
        worker yielding to a caller. Responses are resolved on the way.
        """
        unpacker = self._decoder.unpacker
        poll_workers = self._poll_workers
        caller_recv = self._caller_recv
        read_available = self.transport.read_available
        while True:
            if self._closed:
                self._release_role(me)
                return None
            value = _NOTHING
            buffered = unpacker.tell() != self._fed
            if buffered:  # unread bytes buffered: maybe a whole frame
                if deadline is not None and time.monotonic() >= deadline:
                    return None  # checked before each frame, not only when a read comes back empty:
                    # a peer that never stops sending other frames cannot hold a call past its
                    # deadline. (Not before a read: a caller's read wakes at its receive timeout,
                    # a poll at the deadline, and each checks it then.)
                try:
                    value = next(unpacker)
                except StopIteration:  # what is buffered is the start of one frame
                    self._incomplete_at = self._fed
                    if self._fed - self._frame_start > self._max_frame:
                        self._over_the_frame_limit(me)
                        return None
                    refused = self._refused_at_a_header()
                    if refused is not None:
                        self._release_role(me)
                        self._on_undecodable(UndecodableStream(refused))
                        return None
                except Exception as exc:  # msgpack format / limit errors: the stream is lost
                    self._release_role(me)
                    self._on_undecodable(undecodable(exc))
                    return None
                else:
                    end = unpacker.tell()
                    size = end - self._frame_start
                    if size > self._max_frame:  # whole, and over the limit
                        self._over_the_frame_limit(me)
                        return None
                    self._frame_bytes = size  # what a notification parked for a slot holds
                    self._frame_start = end
            if value is _NOTHING:
                # Inlined common case of _fill/_feed: a blocking recv that returns bytes.
                if (deadline is None and not poll_workers) or (deadline is not None and caller_recv):
                    data = read_available()
                    if not data:
                        if data is None:  # receive timeout
                            if deadline is not None and time.monotonic() >= deadline:
                                return None
                            continue
                        self._begin_eof(me, in_worker=deadline is None)
                        return None
                    if deadline is None and not buffered and len(data) <= self._whole_max:
                        # A worker's read, nothing buffered, a short one: usually exactly one frame,
                        # decoded whole (see _whole_max); anything else goes to the decoder below. (A
                        # caller's goes to the decoder: its deadline is looked at before each frame.)
                        try:
                            value = _unpackb(data, max_ext_len=self._max_ext)
                        except Exception:  # two frames, part of one, or not msgpack: the decoder says which
                            pass
                        else:
                            self._frame_bytes = len(data)
                    if value is _NOTHING:  # _take inlined
                        try:
                            unpacker.feed(data)
                        except msgpack.BufferFull:
                            self._take_refused(me)
                            return None
                        self._fed += len(data)
                        self._chunk = data
                        continue
                else:
                    filled = self._fill(me, deadline)
                    if filled is None:
                        return None
                    continue
            self._frames_in += 1
            # Fast paths for the commonest frames, well-formed (parse_frame's checks, inlined): a
            # response to our call, a request or a notification with its params in one map.
            if type(value) is list and len(value) == 4 and type(value[1]) is int and 0 <= value[1] <= MAX_MSGID:
                kind = value[0]
                if (kind == 1 and type(kind) is int
                        and (value[2] is None or (type(value[2]) is dict and type(value[2].get("code")) is str))):
                    self._on_response(value[1], value[2], value[3])
                    if call is not None and call.settled:
                        return None
                    continue
                if (kind == 0 and type(kind) is int and type(value[2]) is str and value[2]
                        and type(value[3]) is list and len(value[3]) == 1 and type(value[3][0]) is dict):
                    return _new_request(Request, (value[1], value[2], value[3][0]))
            elif (type(value) is list and len(value) == 3 and value[0] == 2 and type(value[0]) is int
                  and type(value[1]) is str and value[1] and type(value[2]) is list and len(value[2]) == 1
                  and type(value[2][0]) is dict):
                # A notification with its params in one map (a harness's footer, a server's toast).
                return _new_request(Notification, (value[1], value[2][0]))
            try:
                frame = parse_frame(value)
            except (BadParams, BadFrame) as exc:
                self._reject(exc, exc.msgid)
                answers = getattr(exc, "answers", None)
                if answers is not None:
                    # Its call is answered all the same, failed with the peer's own text and code
                    # (error_from_wire): dropped, it would wait for its whole deadline.
                    self._on_response(answers[0], answers[1], None)
                    if call is not None and call.settled:
                        return None
                continue
            if isinstance(frame, Response):  # no subclasses: as type() is
                self._on_response(frame.msgid, frame.error, frame.result)
                if call is not None and call.settled:
                    return None
                continue
            return frame

    def _fill(self, me: int, deadline: float | None) -> bool | None:
        """Wait for bytes and feed them: ``True`` fed, ``False`` try again, ``None`` stop reading.

        Three ways to wait, cheapest first:

        * a server worker on a socket blocks in ``recv`` (close() wakes it by shutdown);
        * a caller on a socket with a receive timeout blocks in ``recv`` and
          re-checks its deadline each time the timeout expires;
        * otherwise ``poll`` on the transport and the wake pipe, so a caller
          can poke a worker into handing the reader role over, and close()
          can wake a pipe reader.
        """
        transport = self.transport
        if deadline is None:
            if not self._poll_workers:
                return self._feed(me, transport.read_available(), True)
            # Flag protocol with await_reply (which adds to _waiting_callers, then
            # pokes if _polling): one of the two always sees the other's write.
            self._polling = True
            if self._waiting_callers:
                self._polling = False
                with self._mutex:
                    if self._waiting_callers:
                        self._role = None  # a caller reads from here on
                        self._wake_callers_locked()
                        return None
                return False
            timeout_ms = None
        else:
            if self._caller_recv:
                data = transport.read_available()
                if data is None:  # receive timeout: check the deadline and go on
                    return None if time.monotonic() >= deadline else False
                return self._feed(me, data, False)
            timeout_ms = max(0, int((deadline - time.monotonic()) * 1000) + 1)
        try:
            events = self._poller.poll(timeout_ms)
        except InterruptedError:
            events = []
        self._polling = False
        if len(events) != 1 or events[0][0] != transport.read_fd:
            if any(fd == self._wake_r for fd, _ in events):
                try:
                    os.read(self._wake_r, 64)
                except OSError as exc:
                    if not raised_by_the_os(exc):
                        raise
                self._poked = False
                return False
            if not events:
                return None if deadline is not None and time.monotonic() >= deadline else False
        return self._feed(me, transport.read_available(), deadline is None)

    def _feed(self, me: int, data: bytes | None, in_worker: bool) -> bool | None:
        if data is None:
            return False  # spurious wake-up or receive timeout
        if not data:
            self._begin_eof(me, in_worker=in_worker)
            return None
        return True if self._take(me, data) else None

    def _take(self, me: int, data: bytes) -> bool:
        """Feed ``data`` to the decoder; False (role given up, stream closed) when it overflows a bound."""
        try:
            self._decoder.unpacker.feed(data)
        except msgpack.BufferFull:
            self._take_refused(me)
            return False
        self._fed += len(data)
        self._chunk = data
        return True

    def _take_refused(self, me: int) -> None:
        """The decoder's buffer cannot take the bytes read: the stream is undecodable."""
        self._release_role(me)
        self._on_undecodable(UndecodableStream("frame exceeds the buffer limit"))

    def _refused_at_a_header(self) -> str | None:
        """Why the incomplete frame is refused already, by a header it holds (:class:`PendingFrame`),
        or None. Runs only when a read ended inside a frame; each byte is looked at once."""
        chunk = self._chunk
        offset = self._fed - len(chunk)
        pending = self._pending_frame
        if pending is None or pending.start != self._frame_start:
            if self._frame_start < offset:
                return None  # the frame began in an earlier read no reader looked at (none does)
            pending = self._pending_frame = PendingFrame(self._frame_start, self.settings.frame_limits)
        return pending.feed(chunk, offset, self._max_frame)

    def _over_the_frame_limit(self, me: int) -> None:
        self._release_role(me)
        self._on_undecodable(UndecodableStream("frame exceeds the size limit"))

    def _release_role(self, me: int) -> None:
        with self._mutex:
            if self._role == me:
                self._role = None
                self._cond.notify_all()
                self._wake_callers_locked()

    def _begin_eof(self, me: int, *, in_worker: bool) -> None:
        with self._mutex:
            self._eof = True
            if self._role == me:
                self._role = None
            self._cond.notify_all()
            self._wake_callers_locked()
        if in_worker:
            self._on_eof()
        else:  # a caller found EOF: it must not wait for the drain itself
            start_thread(self._on_eof, name=f"castor-{self.name}-eof", owner=f"/endpoint/{self.name}",
                         purpose="drain this connection after its end of stream")

    def _park_locked(self, frame: Notification) -> None:
        """Queue a notification over ``max_in_flight`` to run when a worker is free (caller holds
        the mutex; ``notifications_wait_for_a_slot``): it holds a slot like any job, so nothing
        more is admitted until the queue is back under the bound."""
        self._in_flight += 1
        self._jobs.append(frame)
        self._parked[id(frame)] = self._frame_bytes
        self._parked_bytes += self._frame_bytes
        self._counters["notifications_waited"] += 1
        if self._idle:
            self._cond.notify()
        elif self._threads < self.settings.max_workers:
            self._spawn_locked()

    def _wait_for_room(self, me: int) -> bool:
        """Back-pressure: the role holder (a worker) reads nothing more until the jobs in flight are
        back under ``max_in_flight``. ``False`` when it gave the role to a caller instead: a caller
        waits for a response that may be behind what the peer sent since, so it reads on (and
        queues what it reads up to ``max_read_ahead_bytes``)."""
        with self._mutex:
            self._room_waiter = True
            try:
                while (self._in_flight - self._replied >= self.settings.max_in_flight
                       and not self._closed and self._role == me):
                    if self._waiting_callers:
                        self._role = None
                        self._wake_callers_locked()
                        return False
                    self._cond.wait(_CALLER_RECHECK)
            finally:
                self._room_waiter = False
            return self._role == me or self._closed

    def _refuse(self, frame: Request | Notification) -> None:
        """Over ``max_in_flight``: answer ``mailbox_full`` (or an ``error`` notification)."""
        self._counters["rejected_in_flight"] += 1
        err = MailboxFull(f"too many requests in flight on this connection (limit "
                          f"{self.settings.max_in_flight}); {frame.method} refused",
                          data={"limit": self.settings.max_in_flight, "method": frame.method})
        if type(frame) is Request:
            self._send(encode_response(frame.msgid, err.to_wire(), None))
        else:
            self._send(encode_error_notification(err.to_wire()))

    def answer_early(self, ctx: Context, result: Any) -> bool:
        """Send ``ctx``'s response with ``result`` now (see :meth:`Context.early_answer`);
        ``False`` when it was answered already (or has no response to give)."""
        token, msgid = ctx.early, ctx.msgid
        if not token or msgid is None:
            return False
        frame = self._result_frame(msgid, ctx.method, result)
        with self._mutex:  # before the token: a response is counted before it is written
            self._replied += 1
        try:
            token.pop()
        except IndexError:  # the handler's own answer (or another early one) took it
            with self._mutex:
                self._replied -= 1
            return False
        self._send(frame)
        return True

    def _result_frame(self, msgid: int, method: str, result: Any) -> bytes:
        """The response frame for ``result``, or an ``internal`` error response when the result
        cannot be sent (not msgpack, or over the frame limits the peer would drop us for)."""
        try:
            try:
                frame = encode_response(msgid, None, result)
            except OverflowError:
                # an integer msgpack cannot carry (a memory backend's 128-bit id): sent as the
                # nearest double, what a JavaScript reader of the backend's JSON holds anyway
                frame = encode_response(msgid, None, wide_integers_as_floats(result))
        except (TypeError, ValueError, OverflowError) as exc:
            self._log.error("result of {} is not msgpack-serialisable: {}", method, exc)
            err = Internal(f"internal error in {method}: unserialisable result")
            return encode_response(msgid, err.to_wire(), None)
        too_big = None if len(frame) <= self._smallest_limit else over_limits(frame, result, self.settings.frame_limits)
        if too_big is not None:  # the peer would drop the connection on it
            self._log.error("result of {} not sent: {}", method, too_big)
            err = Internal(f"the result of {method} is too large to send: {too_big}",
                           data={"reason": "result_too_large"})
            return encode_response(msgid, err.to_wire(), None)
        return frame

    def _run(self, job: Request | Notification | _PlainRequest, corked_by: int | None = None) -> int:
        """Dispatch one admitted job and answer it. Returns 1 when a response was counted in
        ``_replied`` (just before it was written), else 0; the caller then decrements
        ``_in_flight`` by one and ``_replied`` by what this returned. An inline run whose reader
        role is still ``corked_by``'s ends the request itself, before writing its response, and
        returns ``_ENDED_HERE`` (the role kept) or ``_ENDED_ROLE_HANDED`` (given to waiting callers).

        ``corked_by``: the thread that corked for this job (an inline run, see
        :meth:`_read_as_worker`); the cork ends here, on every path, and a response goes out in the
        same write as the frames the handler corked."""
        # The job's fields read once (each named-tuple field read is an unspecialised attribute look-up).
        msgid: int | None  # None: a notification
        # (type(...) is: nothing subclasses Notification, and isinstance is a call a job)
        msgid, method, params = (None, *job) if type(job) is Notification else job  # type: ignore[misc]  # (mypy narrows isinstance only)
        replied = 0
        tail = None
        try:
            ctx = _new_context(Context)  # Context's __init__, inlined (one frame a job fewer)
            ctx.connection = self
            ctx.state = self.state
            ctx.method = method
            ctx.msgid = msgid
            ctx.early = None
            try:
                dispatcher = self.dispatcher
                entry = None
                if type(dispatcher) is Dispatcher:
                    try:  # a subscript, not .get (a call a job; a try costs nothing until it raises)
                        entry = dispatcher._methods[method]  # noqa: SLF001
                    except KeyError:  # an unknown method: dispatch answers it
                        pass
                if entry is not None and entry.model is None:
                    # Dispatcher.dispatch's body for a method without a params model, in this frame
                    # (one call a request fewer); any other method, or another dispatcher (the
                    # AuthGate before a hello), goes through dispatch.
                    try:
                        result = entry.handler(params, ctx)
                    except Exception as handler_exc:
                        failure = dispatcher.handler_failed(method, handler_exc)
                        if failure is handler_exc:
                            raise
                        raise failure from None
                    if type(result) is not dict and isinstance(result, BaseModel):
                        result = result.model_dump(mode="json")
                else:
                    result = dispatcher.dispatch(method, params, ctx)
            except CastorError as exc:
                self._counters["handler_errors"] += 1
                if msgid is not None:
                    if ctx.early is not None and not _take(ctx.early):  # answered early: that answer stands
                        self._log.debug("{} failed after its early answer: {} {}", method, exc.code, exc.message)
                        return 1
                    frame = encode_response(msgid, exc.to_wire(), None)
                    replied = self._count_replied()
                    self._send(frame)
                elif exc.code == ErrorCode.UNAUTHENTICATED:
                    # Anyone who can reach the port may send these, as fast as they like: a
                    # warning line each would let them fill the log (and its disk) without a
                    # token. Dropped, counted; a debug line for whoever looks.
                    self._counters["unauthenticated_notifications"] += 1
                    self._log.debug("notification {!r} dropped: unauthenticated", method[:80])
                else:
                    self._notification_failed(method, exc)
                closing = self.state.pop("_close_after_reply", None)  # castor.endpoint.auth.CLOSE_AFTER_REPLY
                if closing:
                    self.close(closing, flush_timeout=0.5)
                return replied
            if msgid is not None:
                if ctx.early is not None and not _take(ctx.early):
                    return 1  # answered early (and counted there): this return value is dropped
                try:  # the common case of _result_frame (and encode_response's body), inlined: a result
                    # msgpack carries, short
                    try:
                        packer = packers.packer
                    except AttributeError:
                        packer = packers.packer = msgpack.Packer(use_bin_type=True)
                    try:
                        encoded: bytes | None = packer.pack([RESPONSE, msgid, None, result])
                    except BaseException:
                        packers.packer = msgpack.Packer(use_bin_type=True)  # never reuse a half-written buffer
                        raise
                except (TypeError, ValueError, OverflowError):
                    encoded = None
                frame = (encoded if encoded is not None and len(encoded) <= self._smallest_limit
                         else self._result_frame(msgid, method, result))
                if corked_by is None:
                    with self._mutex:  # _count_replied, inlined
                        self._replied += 1
                    replied = 1
                    self._send(frame)
                else:
                    tail = frame
                    # corked_by is set by _read_as_worker only: a worker's thread, where no signal
                    # handler runs, so acquire-then-try (cheaper than ``with``) is safe here
                    # (tests/endpoint/test_lock_sections.py); a caller's thread never comes here.
                    mutex = self._mutex
                    mutex.acquire()
                    try:
                        if self._role == corked_by:
                            # Run inline by the reader, whose role was not taken meanwhile: nothing
                            # else reads until this thread does again, so the request ends here,
                            # before its response is written (the end of stream cannot be read, nor
                            # the next request admitted, ahead of that write) -- in one lock section
                            # with what _read_as_worker did after the write (see _ENDED_HERE).
                            self._in_flight -= 1
                            if self._eof and not self._in_flight:
                                self._cond.notify_all()
                            self._inline_since = None
                            if self._waiting_callers:
                                self._role = None
                                self._wake_callers_locked()
                                replied = _ENDED_ROLE_HANDED
                            else:
                                replied = _ENDED_HERE
                        else:  # stolen: counted as answered, ended by _read_as_worker after the write
                            self._replied += 1
                            replied = 1
                    finally:
                        mutex.release()
        except Exception:  # pragma: no cover - dispatch already converts handler errors
            self._log.exception("unexpected failure while running {}", method)
        finally:
            if corked_by is not None:
                if tail is None:
                    self._uncork(corked_by)
                else:
                    # _uncork(corked_by, tail) and _write_locked inlined for the common case: the
                    # handler corked nothing, nothing is queued, and the kernel takes the response.
                    overflow = None
                    wmutex = self._wmutex
                    wmutex.acquire()  # a worker's thread (corked_by): acquire-then-try, as above
                    try:
                        cork = self._cork
                        if (cork is not None and not cork and self._cork_thread == corked_by
                                and not self._out and not self._writer_busy and not self._closed):
                            self._cork = self._cork_thread = None
                            sent: int | OSError | None
                            send = self.transport.send_direct
                            if send is not None:  # SocketTransport.send_nowait's body, in this frame
                                try:
                                    sent = send(tail, _DONTWAIT)
                                except (BlockingIOError, InterruptedError):
                                    sent = 0
                                except OSError as exc:
                                    sent = exc
                            else:
                                try:
                                    sent = self.transport.send_nowait(tail)
                                except OSError as exc:
                                    sent = exc
                            if sent == len(tail):
                                self._frames_out += 1
                            else:
                                overflow = self._queue_locked(tail, sent)
                            tail = None
                    finally:
                        wmutex.release()
                    if overflow is not None:
                        self._close_for_overflow(overflow)
                    if tail is not None:  # a cork of the handler's frames, or a queue ahead: _uncork's general case
                        self._uncork(corked_by, tail)
        return replied

    def _notification_failed(self, method: str, exc: CastorError) -> None:
        """A notification's handler failed (an unknown method, bad params, a session not open here).
        Nobody hears about it but the log, and a peer may send such notifications as fast as it likes:
        a warning line each let one buggy harness write hundreds of megabytes. One warning, then at most
        one every ``NOTIFICATION_FAILURE_LOG_INTERVAL_S`` saying how many failed since (each a debug
        line); counted in ``notifications_failed``."""
        self._counters["notifications_failed"] += 1
        warn, quiet = self._notify_gate.passes()
        if warn:
            self._log.warning("notification {!r} failed: {} {}{}", method[:80], exc.code, exc.message,
                              f" ({quiet} more notifications failed since the last such line)" if quiet else "")
        else:
            self._log.debug("notification {!r} failed: {} {}", method[:80], exc.code, exc.message)

    def _count_replied(self) -> int:
        """A response is about to be written: its request stops counting against
        ``max_in_flight`` (a peer that waits for the reply may send its next request at once)."""
        with self._mutex:
            self._replied += 1
        return 1

    def _reject(self, exc: CastorError, msgid: int | None) -> None:
        """A frame with a bad shape: answer its msgid if known, else an ``error`` notification."""
        self._counters["invalid_frames"] += 1
        self._log.debug("rejected frame: {}", exc.message)
        if msgid is not None:
            self._send(encode_response(msgid, exc.to_wire(), None))
        else:
            self._send(encode_error_notification(exc.to_wire()))

    def _on_undecodable(self, exc: UndecodableStream) -> None:
        self._counters["invalid_frames"] += 1
        self._log.log(self._peer_fault_level, "undecodable input, closing: {}", exc.message)
        reason = f"invalid_frame: {exc.message}"
        with self._mutex:
            if self._closing_for is None:
                self._closing_for = reason  # a peer gone first (EPIPE on the notification) reads as this
        self._send(encode_error_notification(exc.to_wire()))
        # A caller waiting for its reply reads too (an actor's thread, inside a handler).
        self.close(reason, flush_timeout=0.5, callbacks_apart=True)

    def _drain_input(self) -> None:
        """Read what the peer sent before a write to it failed (called by :meth:`close`, the
        connection marked closed, before the transport is): its responses resolve their calls and
        its notifications that run on the reading thread run (the client's ``error``: a refusal);
        requests and other notifications are dropped (no answer can reach the peer).

        Takes the reader role once its holder has let go -- it sees the close: a poller is poked, a
        thread blocked in ``recv`` is woken by shutting the socket's read side, which leaves what is
        queued readable; one running a handler inline (the client's ``error`` notification, read a
        moment before) finishes it first -- within ``_DRAIN_WAIT``, else nothing more is read; then
        reads only what is there already, at most ``_DRAIN_MAX_BYTES``."""
        me = threading.get_ident()
        shutdown_read = getattr(self.transport, "shutdown_read", None)
        if shutdown_read is not None:
            shutdown_read()
        deadline = time.monotonic() + _DRAIN_WAIT
        took = False
        while not took:
            with self._mutex:
                if self._role is None or self._role == me:
                    self._role, self._inline_since = me, None
                    took = True
            if not took:
                if time.monotonic() >= deadline:
                    self._log.debug("closing without reading what the peer sent: the reader kept its role")
                    return
                time.sleep(0.002)  # the holder leaves at its next look at _closed (a poke, a wake)
        try:
            poller = select.poll()
            poller.register(self.transport.read_fd, select.POLLIN)
            budget = _DRAIN_MAX_BYTES
            self._drain_frames()
            while budget > 0 and poller.poll(0):
                data = self.transport.read_available()
                if not data:
                    break
                budget -= len(data)
                try:
                    self._decoder.unpacker.feed(data)
                except msgpack.BufferFull:
                    break
                self._fed += len(data)
                self._drain_frames()
        finally:
            with self._mutex:
                if self._role == me:
                    self._role = None

    def _drain_frames(self) -> None:
        """Decode the whole frames buffered (see :meth:`_drain_input`)."""
        unpacker = self._decoder.unpacker
        while unpacker.tell() != self._fed:
            try:
                value = next(unpacker)
            except StopIteration:  # the start of a frame the peer never finished
                return
            except Exception as exc:  # undecodable: nothing after it can be read; the close says so
                self._closing_for = f"invalid_frame: {undecodable(exc).message}"
                return
            self._frames_in += 1
            try:
                frame = parse_frame(value)
            except (BadParams, BadFrame) as exc:
                answers = getattr(exc, "answers", None)
                if answers is not None:  # an answer with a foreign error slot (see _read_frame)
                    self._on_response(answers[0], answers[1], None)
                continue
            if type(frame) is Response:
                self._on_response(frame.msgid, frame.error, frame.result)
            elif type(frame) is Notification and self.dispatcher.runs_on_reading_thread(frame.method):
                self._run(frame)

    def _on_eof(self) -> None:
        """Peer finished sending: fail the calls waiting on it (no answer can come after its end of
        stream), let accepted work finish (bounded), flush, close. The calls fail first: a handler
        waiting on one is then answered within the drain, not abandoned with it."""
        if self._closed:
            return
        deadline = time.monotonic() + self.settings.drain_timeout
        with self._mutex:
            self._eof = True  # from here on a new call fails at once (call_async)
        self.parting_error = self._peer_parting()
        self._fail_pending("eof", self.parting_error)
        with self._mutex:
            while self._in_flight and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
        self.close("eof", flush_timeout=self.settings.drain_timeout, by_peer=True)



def _kept(frame: Request | Notification | _PlainRequest) -> Request | Notification:
    """``frame`` as it is queued or refused: a request the worker's whole read left a plain tuple is
    made a :class:`Request` (the inline run takes the tuple as it is)."""
    if isinstance(frame, (Request, Notification)):
        return frame
    return _new_request(Request, frame)


def _no_deadline(method: str, timeout: Any) -> CastorError:
    """A call's ``timeout`` that is no deadline. Zero or below: the deadline has passed before
    anything was sent (``timeout``, ``may_have_started: false``); it used to send the request and
    then give up on it at once. Not a number, NaN or infinity: ``invalid_params`` -- a NaN deadline
    never passed, so the call waited for ever, and every call must have a deadline."""
    if isinstance(timeout, int | float) and timeout <= 0:
        return Timeout(f"{method}: the deadline passed before sending (timeout {timeout!r} s)", may_have_started=False,
                       data={"method": method, "reason": "deadline_passed"})
    return InvalidParams(f"{method}: timeout must be a positive, finite number of seconds, not {timeout!r:.40}",
                         may_have_started=False, data={"method": method, "reason": "invalid_timeout"})


def _unsendable(method: str, exc: Exception) -> InvalidParams:
    """The caller's params cannot be encoded (not msgpack types, nested past the packer's depth,
    an integer over 64 bits): the caller's input, not castor's fault; nothing was sent."""
    return InvalidParams(f"{method}: params are not msgpack-serialisable: {exc}", may_have_started=False,
                         data={"method": method, "reason": "params_not_serialisable"})


def _as_parting(parting: CastorError | None, closed: ConnectionClosed) -> CastorError:
    """``closed``, or a fresh copy of the peer's parting error caused by it (each failed call
    raises its own exception object: one raised on several threads would share a traceback).
    ``may_have_started`` is the close's unless the peer's error says."""
    if parting is None:
        return closed
    err = error_from_wire(parting.to_wire())
    err.data.setdefault("may_have_started", closed.may_have_started)
    err.__cause__ = closed
    return err


def _reraise(exc: OSError) -> bytes | None:
    """A transport with no ``read_failed`` (a pipe's) is never read through ``_recv_into``."""
    raise exc


def _take(token: list[bool]) -> bool:
    """Take an early-answer token (``True``), or learn that another answer took it (``False``)."""
    try:
        token.pop()
    except IndexError:
        return False
    return True


class _Watchdog:
    """One process-wide thread that ticks every millisecond while any connection needs it.

    Per-connection timers would cost a wake-up per connection per tick; this
    costs one per tick in total, and none at all when every connection is
    idle (it then waits on its condition).
    """

    TICK = 0.001

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._active: set[Connection] = set()
        self._thread: threading.Thread | None = None

    def watch(self, conn: Connection) -> None:
        with self._cond:
            self._active.add(conn)
            if self._thread is None or not self._thread.is_alive():
                self._thread = start_thread(self._run, name="castor-endpoint-watchdog", owner="/endpoint",
                                            purpose="enforce the connections' call deadlines")
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._active:
                    self._cond.wait()
                watched = list(self._active)
            time.sleep(self.TICK)
            now = time.monotonic()
            done = []
            for conn in watched:
                try:
                    if not conn.watchdog_check(now):
                        done.append(conn)
                except Exception:  # pragma: no cover - never let the watchdog die
                    logger.exception("endpoint watchdog check failed")
                    done.append(conn)
            if done:
                with self._cond:
                    for conn in done:
                        if not conn.watched:
                            self._active.discard(conn)


_WATCHDOG = _Watchdog()
