"""The method registry: name → (handler, params model).

Guarantees of :meth:`Dispatcher.dispatch`:

| situation                                   | raised (→ wire error)                        |
|---------------------------------------------|----------------------------------------------|
| method not registered                       | ``UnknownMethod`` (``unknown_method``)        |
| params fail the model (type/missing/extra)  | ``InvalidParams`` with ``data.errors`` detail |
| handler raises a ``CastorError``            | that error, unchanged (its own code); one     |
|                                             | coded ``internal`` gets a ``data.error_id``   |
|                                             | (also in its log line) if it has none         |
| handler raises anything else                | ``Internal`` with ``data.error_id``; the      |
|                                             | traceback goes to the log, never the wire     |
| handler returns a pydantic model            | its ``model_dump(mode="json")`` is the result |

Handlers are plain callables ``handler(params, ctx)``; ``ctx.connection`` is the calling
connection seen through :class:`Peer` (what a handler may use of it: this module never imports
the connection, which imports it); ``params`` is the
validated model instance, or the raw ``dict`` when no model was registered
(the cheap path for trivial methods). Params models always forbid unknown
fields: a model registered without ``extra="forbid"`` is wrapped in a
subclass that does.
"""

from __future__ import annotations

import hmac
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from castor._log import logger
from castor.endpoint.framing import FrameLimits
from castor.messages.errors import CastorError, ErrorCode, Internal, InvalidParams, Unauthenticated, UnknownMethod
from castor.shown import clipped
from castor.version import __version__

PROTOCOL_VERSION = 1
MAX_ERROR_DETAILS = 20
"""``invalid_params`` lists at most this many field errors (``error_count`` has the total)."""


def _castor_version() -> str:
    version = __version__
    if version:
        return str(version)
    try:  # a stale editable install can import castor as a namespace package
        from importlib.metadata import version as dist_version
        return dist_version("castor")
    except Exception:
        return "0+unknown"

Handler = Callable[[Any, "Context"], Any]


class PeerSettings(Protocol):
    """The connection limits a handler reads (``ConnectionSettings`` has them all)."""

    @property
    def frame_limits(self) -> FrameLimits: ...

    @property
    def max_sessions(self) -> int: ...

    @property
    def sessions_kept_for_first(self) -> int: ...


class Peer(Protocol):
    """What a handler may use of the connection it runs on (``castor.endpoint.connection.Connection``
    is one): call or notify the peer, read its limits, swap its dispatcher (the auth gate) and cap its
    frames until it has authenticated, and run something when it closes. Calls honour their
    deadline; a notify answers ``False`` once the connection is closed."""

    dispatcher: Dispatcher

    @property
    def settings(self) -> PeerSettings: ...

    def call(self, method: str, params: dict[str, Any] | None = None, *, timeout: float | None = None) -> Any: ...

    def notify(self, method: str, params: dict[str, Any] | None = None) -> bool: ...

    def add_close_callback(self, fn: Callable[[Any], None]) -> None: ...

    def answer_early(self, ctx: Context, result: Any) -> bool: ...

    def limit_frames(self, max_bytes: int | None) -> None: ...

    def limit_outbound(self, max_bytes: int | None) -> None: ...

    def quiet_peer_faults(self, quiet: bool) -> None: ...


class Params(BaseModel):
    """Base for params models: unknown fields are an ``invalid_params`` error."""

    model_config = ConfigDict(extra="forbid")


@dataclass(slots=True)
class Context:
    """What a handler gets beside its params.

    ``connection`` lets the handler call back the peer (``ctx.call(...)``);
    ``state`` is a dict private to the connection and shared by all its
    handlers (e.g. the session opened on it). ``msgid`` is ``None`` for a
    notification.
    """

    connection: Peer
    state: dict[str, Any]
    method: str
    msgid: int | None = None
    #: Armed by :meth:`early_answer`: one token, taken (``list.pop``, atomic) by whichever answers first.
    early: list[bool] | None = None

    def early_answer(self) -> Callable[[Any], None] | None:
        """A callable that sends this request's response *now*, from any thread, before the
        handler returns; ``None`` for a notification (it has no response).

        Guarantees: exactly one response goes out, whichever comes first -- the early answer or
        the handler's own return (or error), the other is dropped (a dropped error is logged);
        frames the handler sent before are written ahead of it. The handler's request still
        counts as running (``inline`` reading, the in-flight slot) until the handler returns; the
        peer's next request is admitted as soon as the early answer is out. Use it when a waiting
        caller must be answered at once by another thread while the handler's own work (a worker
        call that may run on) goes on: the Icarus hook path does.
        """
        if self.msgid is None:
            return None
        self.early = [True]
        connection, ctx = self.connection, self

        def answer(result: Any) -> None:
            connection.answer_early(ctx, result)

        return answer

    def call(self, method: str, params: dict[str, Any] | None = None, *, timeout: float) -> Any:
        return self.connection.call(method, params or {}, timeout=timeout)

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        self.connection.notify(method, params or {})


@dataclass(slots=True, frozen=True)
class _Entry:
    handler: Handler
    model: type[BaseModel] | None
    #: A notification handler run by the thread that read it (see Dispatcher.register).
    on_reading_thread: bool = False


#: ``Context.state`` key: the endpoint's token (bytes) on a connection it authenticated; a later
#: ``runtime.hello`` offering another token is refused (castor.endpoint.auth sets it).
AUTHENTICATED_WITH = "authenticated_with"


class HelloParams(Params):
    """``runtime.hello`` params: who the client is (all optional)."""

    client: str | None = None
    client_version: str | None = None
    protocol: int | None = None
    capabilities: list[str] = []
    token: str | None = Field(default=None, max_length=4096)  # the endpoint's token (castor.endpoint.auth)


@dataclass
class Dispatcher:
    """A thread-safe method registry with ``runtime.hello`` built in."""

    name: str = "castor"
    version: str = field(default_factory=_castor_version)
    capabilities: set[str] = field(default_factory=set)
    builtin_hello: bool = True
    _methods: dict[str, _Entry] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.builtin_hello:
            self.register("runtime.hello", self._hello, HelloParams)

    def register(self, name: str, handler: Handler, params_model: type[BaseModel] | None = None,
                 *, replace: bool = False, on_reading_thread: bool = False) -> None:
        """Add a method. Registering a taken name raises ``ValueError`` unless ``replace``.

        ``on_reading_thread``: a notification of this method is handled by the thread that read
        it, a caller waiting for its own reply included (its handler has then run before that
        call returns, and no worker is woken for it). The handler must be quick and must not
        block or use the connection: nothing is read while it runs.
        """
        if not name or not isinstance(name, str):
            raise ValueError("method name must be a non-empty string")
        model = _forbidding_extra(params_model) if params_model is not None else None
        with self._lock:
            if name in self._methods and not replace:
                raise ValueError(f"method {name!r} is already registered")
            # Copy-on-write: dispatch reads the dict without the lock.
            methods = dict(self._methods)
            methods[name] = _Entry(handler, model, on_reading_thread)
            self._methods = methods

    def method(self, name: str, params_model: type[BaseModel] | None = None) -> Callable[[Handler], Handler]:
        """Decorator form of :meth:`register`."""

        def deco(fn: Handler) -> Handler:
            self.register(name, fn, params_model)
            return fn

        return deco

    def methods(self) -> list[str]:
        return sorted(self._methods)

    def has(self, name: str) -> bool:
        return name in self._methods

    def runs_on_reading_thread(self, name: str) -> bool:
        """Whether ``name`` was registered ``on_reading_thread`` (see :meth:`register`)."""
        entry = self._methods.get(name)
        return entry is not None and entry.on_reading_thread

    def dispatch(self, method: str, params: dict[str, Any], ctx: Context) -> Any:
        try:
            entry = self._methods[method]
        except KeyError:
            shown = clipped(method)  # escaped once: repr() of it doubled every backslash of the escapes
            raise UnknownMethod(f"unknown method '{shown}'", data={"method": shown}) from None
        args: Any = params
        if entry.model is not None:
            try:
                args = entry.model.model_validate(params)
            except ValidationError as exc:
                details = validation_details(exc)
                raise InvalidParams(f"invalid params for {method}", data={
                    "method": method, "errors": details[:MAX_ERROR_DETAILS],
                    "error_count": len(details)}) from None
            except RecursionError:
                raise _nested_too_deep(method) from None
        try:
            result = entry.handler(args, ctx)
        except Exception as exc:
            failure = self.handler_failed(method, exc)
            if failure is exc:
                raise
            raise failure from None
        if type(result) is not dict and isinstance(result, BaseModel):  # (a dict, the common result, is none)
            result = result.model_dump(mode="json")
        return result

    def handler_failed(self, method: str, exc: Exception) -> CastorError:
        """What a handler's exception ``exc`` is answered with (raised by :meth:`dispatch`, and by a
        connection that runs a method without a params model in its own frame): a ``CastorError``
        itself (an ``internal`` one logged once, with an ``error_id``), params nested too deep for the
        interpreter as ``invalid_params``, anything else as ``internal``, logged with its traceback.
        Called inside the ``except`` that caught it (the traceback logged is the handler's)."""
        if isinstance(exc, RecursionError):
            # The frame decoder takes 1024 levels; the interpreter recurses about 1000 deep, so a
            # handler that walks, copies, prints or encodes such params (a turn's error map kept
            # in the cast's events) runs out first: the peer's input, never castor's ``internal``.
            return _nested_too_deep(method)
        if isinstance(exc, CastorError):
            if exc.code == ErrorCode.INTERNAL and "error_id" not in exc.data:  # castor's bug: traceable
                exc.data["error_id"] = uuid.uuid4().hex[:12]
                log = logger.bind(method=method, error_id=exc.data["error_id"], actor="/endpoint", msg_type=method)
                if exc.private_message:  # someone else's text (a backend's error): its kind only, no traceback
                    log.error("handler for {} answered internal: {} ({}; its text went to the caller only)",
                              method, type(exc).__name__, exc.data.get("reason", "-"))
                else:
                    log.opt(exception=exc).error("handler for {} answered internal: {}", method, exc.message)
            return exc
        error_id = uuid.uuid4().hex[:12]
        logger.bind(method=method, error_id=error_id, actor="/endpoint", msg_type=method).exception(
            "handler for {} raised {}", method, type(exc).__name__)
        return Internal(f"internal error in {method}", data={"error_id": error_id})

    def _hello(self, params: HelloParams, ctx: Context) -> dict[str, Any]:
        expected = ctx.state.get(AUTHENTICATED_WITH)
        if expected is not None and params.token is not None and not hmac.compare_digest(
                params.token.encode("utf-8", "replace"), expected):
            # A later hello on a connection the token opened: answered "ok" it read as "this token is
            # good". The connection stays open and authenticated by the token it gave first.
            raise Unauthenticated("runtime.hello refused: wrong token (this connection stays authenticated "
                                  "by the token it presented first)", data={"reason": "wrong_token_after_hello"})
        ctx.state["hello"] = params.model_dump(exclude={"token"})  # a secret is never kept or logged
        return {
            "name": self.name,
            "version": self.version,
            "protocol": PROTOCOL_VERSION,
            "capabilities": sorted(self.capabilities),
            "methods": self.methods(),
        }


def _nested_too_deep(method: str) -> InvalidParams:
    """What a request whose params are nested deeper than castor can handle is answered."""
    return InvalidParams(f"params of {method} are nested too deep to handle (keep them under 500 levels)",
                         data={"method": method, "reason": "nested_too_deep"})


def validation_details(exc: ValidationError) -> list[dict[str, str]]:
    """Field-level detail without the offending input (it may be private text)."""
    return [
        {"loc": ".".join(str(p) for p in err["loc"]) or "(params)", "type": err["type"], "msg": err["msg"]}
        for err in exc.errors(include_url=False, include_input=False, include_context=False)
    ]


def _forbidding_extra(model: type[BaseModel]) -> type[BaseModel]:
    if model.model_config.get("extra") == "forbid":
        return model
    return type(model.__name__, (model,), {
        "model_config": ConfigDict(**{**model.model_config, "extra": "forbid"}),
        "__module__": model.__module__,
    })
