"""The hook controller's rules as a pure state machine.

:func:`step` maps ``(state, event) -> (next_state, effects)``. It never blocks
and never performs IO: the HookController actor interprets the effects (call
the worker, filter, reply to the harness, ...) and feeds completions back as
events (:class:`WorkerDone`, :class:`FilterDone`). Every harness event carries
a ``request`` id and gets exactly one :class:`Reply` -- possibly later, when
its worker call or filtering completes, or early, when it is invalidated.

Decision table
--------------
``gen`` is the generation counter; *invalidate* = ``gen += 1``, drop the
pending capture, and answer every in-flight request (except a shutdown's
``on_session_end``) with ``Reply(None)`` plus ``CancelFilter`` when it was
filtering. Late completions of invalidated requests are ignored.

======================  ====================================  ===========================================  =====================================
trigger                 state / guard                         effects                                      next
======================  ====================================  ===========================================  =====================================
any but shutdown        hooks not registered (config)         Reply(None)                                  unchanged
session_start(id)       id non-empty, == current id, started  Reply(None) (dedupe)                         unchanged
session_start(id)       disabled                              invalidate; SetStatus(None); Reply(None)     session_id=id, first_turn, started
session_start(id)       enabled                               invalidate; SetStatus(footer);               in-flight start@gen
                                                              CallWorker(on_session_start,
                                                              {session_id, platform})
WorkerDone(start)       same gen, ok, context non-blank       SendMessage(icarus-session-context,          done
                                                              display=visible, trigger_turn=False);
                                                              Reply(None)
WorkerDone(start)       otherwise                             Reply(None) (+Log on error)                  done
before_agent_start      disabled                              SetStatus(None); Reply(None)                 unchanged
before_agent_start      custom-triggered or blank prompt      SetStatus(footer); Reply(None)               first_turn NOT consumed
before_agent_start      eligible                              SetStatus(footer); CallWorker(pre_llm_call,  first_turn=False; capture window
                                                              {session_id, user_message, is_first_turn})   opened with the prompt; in-flight
WorkerDone(prompt)      error / no context / blank            Reply(None) (+Log on error)                  done
WorkerDone(prompt)      context, filtering on                 Filter(context, prompt)                      stage=filter
WorkerDone(prompt)      context, filtering off                Reply(inject)                                done
FilterDone              text blank or None                    Reply(None)                                  done
FilterDone              text                                  Reply(inject)                                done
TurnAborted             request in flight                     CancelFilter if filtering; Reply(None)       done (worker call left to finish)
agent_end(messages)     disabled                              Reply(None)                                  unchanged
agent_end(messages)     enabled                               Reply(None)                                  buffer users, latest assistant
                                                                                                             (not one answering a cast's prompt)
agent_settled           enabled, same gen, not aborted,       CallWorker(post_llm_call, {session_id,       buffer cleared (always)
                        final stopReason "stop", text,        user_message, assistant_response, platform})
                        user text or prompt
agent_settled           otherwise                             Reply(None)                                  buffer cleared (always)
WorkerDone(capture)     any                                   Reply(None) (+Log on error)                  done
session_shutdown        enabled, registered                   invalidate; CallWorker(on_session_end,       started=False
                                                              {session_id, platform})
session_shutdown        disabled or not registered            invalidate; SetStatus(None); CloseWorker;    started=False
                                                              Reply(None)
WorkerDone(shutdown)    any (ok or error)                     SetStatus(None); CloseWorker; Reply(None)    done
set_enabled(False)      registered                            invalidate; SetStatus(None)                  enabled=False
set_enabled(True)       registered                            SetStatus(footer)                            enabled=True (nothing revived)
after shutdown          before_agent_start, agent_end,        Reply(None)                                  unchanged (until session_start)
                        agent_settled, shutdown, context
set_visible(v)          any                                   none                                         visible=v
context                 any                                   Reply(None)                                  unchanged
======================  ====================================  ===========================================  =====================================

``inject`` is ``{"message": {"customType": "icarus-memory-context",
"content": text, "display": visible}}``. Ambient failure policy: a
failed worker call in any of these handlers only omits that step's context or
capture; the harness always gets ``Reply(None)``, never an error. Explicit
tool calls do not pass through this machine and surface their errors.
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from functools import lru_cache
from typing import Any, ClassVar, Literal, Self, TypeVar, dataclass_transform

SESSION_CONTEXT_TYPE = "icarus-session-context"
MEMORY_CONTEXT_TYPE = "icarus-memory-context"
#: The custom type of castor's own hidden prompts: a cast's turn, which the harness runs as a custom
#: message (``agent.run_turn``'s ``custom_type``). Such a turn is no exchange of the user's: neither
#: it nor its answer is captured, also when the harness runs it inside the user's run.
CASTOR_PROMPT_TYPE = "pi-materia-prompt"
STATUS_KEY = "icarus"
#: Separator joining queued user messages of one settlement (castor's decision).
USER_JOIN = "\n\n"


class _Frozen:
    """The machine's values: slotted dataclasses (keyword-only), compared by their fields, never
    changed once built (a step makes new ones: :meth:`evolve`).

    Not pydantic models: everything here is built by castor itself (what a harness sends is checked
    by :func:`castor.actors.icarus.hook_controller.event_from_harness` before it becomes an event),
    and a hook call builds and reads a dozen of them. A slotted instance is built in about a third
    of a validation's instructions, and its attribute reads take the interpreter's fast path (a
    pydantic model's ``__getattr__`` turns that off for every read). Frozen for the type checker
    (``mypy`` rejects an assignment to a field anywhere in castor), not at run time: a frozen
    dataclass sets every field through ``object.__setattr__``, which costs what validation did.
    The class's ``kind`` is a class constant, not a field."""

    __slots__ = ()

    def evolve(self, **update: Any) -> Self:
        """A copy with ``update`` applied (the names must be fields: ``TypeError`` otherwise;
        nothing is validated, as nothing castor builds is); ``self`` is untouched."""
        raise NotImplementedError  # each class gets its own (see _value)

    @classmethod
    def build(cls, **fields: Any) -> Self:
        """``cls(**fields)``, the same value (a test pins it), made by a plain function call: a
        class call with keywords goes through the type's call protocol (an argument tuple, a
        keyword dict, ``__init__`` looked up and called with them), about 3.6k instructions for an
        ``InFlight`` against 2.0k. For the values a hook call builds (its event, the in-flight
        entry, the worker call, the completion, the reply); the class call reads better elsewhere."""
        raise NotImplementedError  # each class gets its own (see _value)


_T = TypeVar("_T", bound=_Frozen)
_new = object.__new__
#: What an ``evolve`` parameter not given holds: keep the field as it is (never a field's value).
_KEEP: Any = object()


@dataclass_transform(frozen_default=True, kw_only_default=True, field_specifiers=(field,))
def _value(cls: type[_T]) -> type[_T]:
    """Make ``cls`` one of the machine's values (see :class:`_Frozen`): a slotted, keyword-only
    dataclass with its own :meth:`_Frozen.evolve`."""
    made = dataclass(slots=True, kw_only=True)(cls)
    names = tuple(f.name for f in fields(made))  # type: ignore[arg-type]  # a dataclass since the line above
    # Generated once per class, as dataclasses generate __init__: each field a keyword-only
    # parameter whose default says "keep", one store per field. No ``**update`` dict is made and
    # checked (6.4k against 5.0k instructions a copy of the ten-field ``HookState``), and an
    # unknown name is the interpreter's own ``TypeError``.
    params = "".join(f", {n}=_KEEP" for n in names)
    source = (f"def evolve(self{', *' if names else ''}{params}):\n"
              "    new = _new(cls)\n"
              + "".join(f"    new.{n} = self.{n} if {n} is _KEEP else {n}\n" for n in names)
              + "    return new\n")
    scope: dict[str, Any] = {"_new": _new, "cls": made, "_KEEP": _KEEP}
    exec(source, scope)  # noqa: S102 - code made here from the dataclass's own field names
    evolve = scope["evolve"]
    evolve.__doc__ = _Frozen.evolve.__doc__
    evolve.__qualname__ = f"{made.__qualname__}.evolve"
    made.evolve = evolve  # type: ignore[method-assign]  # the generated copier for this class
    made.build = staticmethod(_builder(made))  # type: ignore[method-assign]  # the generated builder; called as a classmethod would be
    return made


def _builder(made: type) -> Callable[..., Any]:
    """``made``'s :meth:`_Frozen.build`: its ``__init__`` (the same keyword-only parameters, defaults
    and default factories, one store per field) as a function of its own."""
    scope: dict[str, Any] = {"_new": _new, "cls": made, "_KEEP": _KEEP}
    params: list[str] = []
    stores: list[str] = []
    for f in fields(made):
        n = f.name
        if f.default is not MISSING:
            scope[f"_default_{n}"] = f.default
            params.append(f"{n}=_default_{n}")
            stores.append(f"    new.{n} = {n}\n")
        elif f.default_factory is not MISSING:
            scope[f"_factory_{n}"] = f.default_factory
            params.append(f"{n}=_KEEP")
            stores.append(f"    new.{n} = _factory_{n}() if {n} is _KEEP else {n}\n")
        else:
            params.append(n)
            stores.append(f"    new.{n} = {n}\n")
    source = (f"def build({'*, ' + ', '.join(params) if params else ''}):\n    new = _new(cls)\n"
              + "".join(stores) + "    return new\n")
    exec(source, scope)  # noqa: S102 - code made here from the dataclass's own fields
    build: Callable[..., Any] = scope["build"]
    build.__doc__ = _Frozen.build.__doc__
    build.__qualname__ = f"{made.__qualname__}.build"
    return build


# ---------------------------------------------------------------------------
# Events


@_value
class SessionStart(_Frozen):
    kind: ClassVar[Literal["session_start"]] = "session_start"
    request: str
    session_id: str = ""


@_value
class BeforeAgentStart(_Frozen):
    kind: ClassVar[Literal["before_agent_start"]] = "before_agent_start"
    request: str
    prompt: Any = None
    custom: bool = False  # run started by a custom or extension message


@_value
class AgentEnd(_Frozen):
    kind: ClassVar[Literal["agent_end"]] = "agent_end"
    request: str
    messages: tuple[Any, ...] = ()


@_value
class AgentSettled(_Frozen):
    kind: ClassVar[Literal["agent_settled"]] = "agent_settled"
    request: str
    aborted: bool = False
    messages: tuple[Any, ...] = ()  # optional final messages, buffered like agent_end


@_value
class SessionShutdown(_Frozen):
    kind: ClassVar[Literal["session_shutdown"]] = "session_shutdown"
    request: str


@_value
class ContextEvent(_Frozen):
    kind: ClassVar[Literal["context"]] = "context"
    request: str


@_value
class SetEnabled(_Frozen):
    kind: ClassVar[Literal["set_enabled"]] = "set_enabled"
    enabled: bool | None = None  # None toggles


@_value
class SetVisible(_Frozen):
    kind: ClassVar[Literal["set_visible"]] = "set_visible"
    visible: bool | None = None  # None toggles


@_value
class WorkerDone(_Frozen):
    kind: ClassVar[Literal["worker_done"]] = "worker_done"
    request: str
    ok: bool
    result: Any = None
    error_code: str | None = None  # a code only; error text never enters the machine
    error_reason: str | None = None  # the error's reason code (``crash_loop``...), never text


@_value
class FilterDone(_Frozen):
    kind: ClassVar[Literal["filter_done"]] = "filter_done"
    request: str
    text: str | None


@_value
class TurnAborted(_Frozen):
    kind: ClassVar[Literal["turn_aborted"]] = "turn_aborted"
    request: str


HarnessLifecycleEvent = SessionStart | BeforeAgentStart | AgentEnd | AgentSettled | SessionShutdown | ContextEvent
"""An event the harness reports (each carries the request id its answer goes to)."""

Event = HarnessLifecycleEvent | SetEnabled | SetVisible | WorkerDone | FilterDone | TurnAborted


# ---------------------------------------------------------------------------
# Effects


@_value
class CallWorker(_Frozen):
    kind: ClassVar[Literal["call_worker"]] = "call_worker"
    request: str
    module: Literal["hooks"] = "hooks"
    function: str
    kwargs: dict[str, Any]


@_value
class Filter(_Frozen):
    kind: ClassVar[Literal["filter"]] = "filter"
    request: str
    context: str
    prompt: str


@_value
class CancelFilter(_Frozen):
    kind: ClassVar[Literal["cancel_filter"]] = "cancel_filter"
    request: str


@_value
class SendMessage(_Frozen):
    kind: ClassVar[Literal["send_message"]] = "send_message"
    custom_type: str
    content: str
    display: bool
    trigger_turn: bool = False


@_value
class SetStatus(_Frozen):
    kind: ClassVar[Literal["set_status"]] = "set_status"
    key: str = STATUS_KEY
    text: str | None


@_value
class CloseWorker(_Frozen):
    kind: ClassVar[Literal["close_worker"]] = "close_worker"


@_value
class Reply(_Frozen):
    kind: ClassVar[Literal["reply"]] = "reply"
    request: str
    result: dict[str, Any] | None = None


@_value
class Log(_Frozen):
    kind: ClassVar[Literal["log"]] = "log"
    level: Literal["debug", "warning"]
    event: str
    function: str = ""
    code: str = ""


Effect = CallWorker | Filter | CancelFilter | SendMessage | SetStatus | CloseWorker | Reply | Log


# ---------------------------------------------------------------------------
# State


@_value
class HookConfig(_Frozen):
    """The parts of the effective settings the lifecycle needs."""

    platform: str = "pi"
    footer_status: str = "🪽 Icarus"
    hooks_registered: bool = True  # settings ``hooks``
    filtering: bool = True  # settings ``classifier`` != "none"
    context_display: bool = True
    # The harness session's own id, known when the session opens (hooks use the
    # session manager's id, never a payload's). Hooks use it from the start, so a prompt
    # before any ``session_start`` -- a runtime respawned mid-session, or a restarted
    # controller -- still reaches Icarus with the real id rather than "".
    session_id: str = ""


@_value
class Pending(_Frozen):
    """The capture buffer of one settlement window."""

    generation: int
    prompt: str | None = None
    users: tuple[str, ...] = ()
    assistant_text: str | None = None
    assistant_stop: str | None = None
    #: The last message buffered was a cast's hidden prompt (or its answer): assistant messages
    #: are the cast's until the next user message.
    hidden: bool = False


@_value
class InFlight(_Frozen):
    kind: Literal["start", "prompt", "capture", "shutdown"]
    generation: int
    prompt: str = ""
    stage: Literal["worker", "filter"] = "worker"


@_value
class HookState(_Frozen):
    config: HookConfig = field(default_factory=HookConfig)
    enabled: bool = True
    visible: bool = True
    generation: int = 0
    session_id: str = ""
    started: bool = False
    shut_down: bool = False  # after session_shutdown until the next session_start
    first_turn: bool = True
    pending: Pending | None = None
    inflight: dict[str, InFlight] = field(default_factory=dict)


def initial_state(config: HookConfig | None = None) -> HookState:
    cfg = config or HookConfig()
    return HookState(config=cfg, enabled=cfg.hooks_registered, visible=cfg.context_display,
                     session_id=cfg.session_id)


# ---------------------------------------------------------------------------
# Text flattening


def flatten(content: Any) -> str:
    """A string as is; a list element by element (empty parts dropped, joined by ``\\n``);
    an object's string ``content`` or ``text``; anything else ``""``. Thinking and
    tool-call blocks therefore contribute nothing."""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        return "\n".join(part for part in (flatten(c) for c in content) if part)
    if isinstance(content, dict):
        for key in ("content", "text"):
            value = content.get(key)
            if isinstance(value, str):
                return value
        if isinstance(content.get("content"), (list, tuple)):
            return flatten(content["content"])
    return ""


def _stop_reason(message: dict[str, Any]) -> str | None:
    value = message.get("stopReason", message.get("stop_reason"))
    return value if isinstance(value, str) else None


def group_users(users: tuple[str, ...]) -> str:
    """Join queued user texts in order, dropping exact consecutive duplicates (retries)."""
    out: list[str] = []
    for u in users:
        if not out or out[-1] != u:
            out.append(u)
    return USER_JOIN.join(out)


# ---------------------------------------------------------------------------
# The machine

Step = tuple[HookState, list[Effect]]


def step(state: HookState, event: Event) -> Step:
    """Apply one event. Total: every event is accepted in every state."""
    if state.shut_down and event.kind in _AFTER_SHUTDOWN_IGNORED:
        # The session is over and its worker closed (or closing): nothing may
        # spawn a new one or close it twice until the next session_start.
        # every kind in _AFTER_SHUTDOWN_IGNORED is an event that carries a request to answer
        return state, [Reply(request=event.request)]  # type: ignore[union-attr]  # only request-carrying events reach this branch
    handler = _HANDLERS[event.kind]
    return handler(state, event)


_AFTER_SHUTDOWN_IGNORED = frozenset(
    {"before_agent_start", "agent_end", "agent_settled", "session_shutdown", "context"}
)


@lru_cache(maxsize=64)
def _status(text: str | None) -> SetStatus:
    """The ``SetStatus`` effect for ``text``: one shared instance per text (effects are frozen and
    only read), not a model validated at every prompt."""
    return SetStatus(text=text)


def _footer(state: HookState) -> SetStatus:
    return _status(state.config.footer_status if state.enabled else None)


def _invalidate(state: HookState) -> Step:
    """Bump the generation, drop the buffer, answer every in-flight request now."""
    effects: list[Effect] = []
    keep: dict[str, InFlight] = {}
    for req, fl in state.inflight.items():
        if fl.kind == "shutdown":
            keep[req] = fl  # its completion must still close the worker
            continue
        if fl.stage == "filter":
            effects.append(CancelFilter(request=req))
        effects.append(Reply(request=req))
    nxt = state.evolve(generation=state.generation + 1, pending=None, inflight=keep)
    return nxt, effects


def _with_inflight(state: HookState, request: str, fl: InFlight | None) -> HookState:
    inflight = dict(state.inflight)
    if fl is None:
        inflight.pop(request, None)
    else:
        inflight[request] = fl
    return state.evolve(inflight=inflight)


def _on_session_start(state: HookState, ev: SessionStart) -> Step:
    if not state.config.hooks_registered:
        return state, [Reply(request=ev.request)]
    if ev.session_id and ev.session_id == state.session_id and state.started:
        return state, [Reply(request=ev.request)]
    state, effects = _invalidate(state)
    state = state.evolve(session_id=ev.session_id, started=True, first_turn=True, shut_down=False)
    if not state.enabled:
        return state, [*effects, _status(None), Reply(request=ev.request)]
    kwargs = {"session_id": state.session_id, "platform": state.config.platform}
    state = _with_inflight(state, ev.request, InFlight(kind="start", generation=state.generation))
    return state, [*effects, _footer(state),
                   CallWorker(request=ev.request, function="on_session_start", kwargs=kwargs)]


def _on_before_agent_start(state: HookState, ev: BeforeAgentStart) -> Step:
    if not state.config.hooks_registered:
        return state, [Reply(request=ev.request)]
    if not state.enabled:
        return state, [_status(None), Reply(request=ev.request)]
    prompt = ev.prompt
    if type(prompt) is not str:  # the commonest, a string, is its own text (flatten's first case)
        prompt = flatten(prompt)
    footer = _status(state.config.footer_status)  # _footer: enabled here
    if ev.custom or not prompt.strip():
        return state, [footer, Reply(request=ev.request)]
    state, call = _retrieve(state, ev.request, prompt)
    return state, [footer, call]


def _retrieve(state: HookState, request: str, prompt: str) -> tuple[HookState, CallWorker]:
    """An eligible prompt's turn (enabled, not custom, text not blank): the retrieval's call, the
    prompt in flight, the first turn consumed, the capture window opened with the prompt."""
    kwargs = {"session_id": state.session_id, "user_message": prompt, "is_first_turn": state.first_turn}
    pending = state.pending
    if pending is None or pending.generation != state.generation:
        pending = Pending(generation=state.generation, prompt=prompt)
    elif pending.prompt is None:
        pending = pending.evolve(prompt=prompt, hidden=False)  # the user's run: its answers are theirs
    # One copy of the state, not two: the in-flight entry is added with the turn's own changes.
    # (``build``, not the class call: every prompt makes these two values)
    inflight = {**state.inflight, request: InFlight.build(kind="prompt", generation=state.generation, prompt=prompt)}
    state = state.evolve(first_turn=False, pending=pending, inflight=inflight)
    return state, CallWorker.build(request=request, function="pre_llm_call", kwargs=kwargs)


def prompt_step(state: HookState, ev: BeforeAgentStart) -> tuple[HookState, SetStatus, CallWorker] | None:
    """The commonest prompt's step, for a caller that steps it outside the actor's turn: when
    ``step(state, ev)`` would be ``(next, [footer, CallWorker])`` (hooks registered and enabled, the
    session not shut down, a string prompt that is not blank, not custom-triggered), that
    ``(next, footer, call)``, the same values; else None (nothing decided: the general
    :func:`step` decides). Pure, as :func:`step` is."""
    prompt = ev.prompt
    if (state.shut_down or not state.enabled or ev.custom or type(prompt) is not str
            or not state.config.hooks_registered or not prompt.strip()):
        return None
    nxt, call = _retrieve(state, ev.request, prompt)
    return nxt, _status(state.config.footer_status), call


def prompt_answered(state: HookState, ev: WorkerDone) -> tuple[HookState, Reply] | None:
    """The commonest completion's step: when ``step(state, ev)`` would be ``(next, [Reply(None)])``
    for a prompt's retrieval (a call that answered, for an in-flight prompt of this generation,
    with no context to inject: not a dict with a string ``context`` that is not blank), that
    ``(next, reply)``, the same values; else None (the general :func:`step` decides). Pure."""
    fl = state.inflight.get(ev.request)
    if fl is None or fl.kind != "prompt" or fl.stage != "worker" or not ev.ok:
        return None
    if fl.generation == state.generation:
        context = _context_of(ev.result)
        if context is not None and (context.strip() or len(context) > MAX_CONTEXT_CHARS):
            return None  # a context to inject or filter, or one too large (logged)
    inflight = dict(state.inflight)
    del inflight[ev.request]
    return state.evolve(inflight=inflight), Reply.build(request=ev.request)


def _inject(state: HookState, request: str, text: str | None) -> Reply:
    if text is None or not text.strip():
        return Reply(request=request)
    return Reply(request=request, result={"message": {
        "customType": MEMORY_CONTEXT_TYPE, "content": text, "display": state.visible}})


#: The longest memory context injected (characters). A backend that returns more (a runaway
#: retrieval) gets its context dropped with a warning: the hook still answers as if there were none,
#: where the whole answer would have been over the endpoint's frame limit and the hook an error.
MAX_CONTEXT_CHARS = 1_000_000


def _context_of(result: Any) -> str | None:
    context = result.get("context") if isinstance(result, dict) else None
    return context if isinstance(context, str) else None


def _on_worker_done(state: HookState, ev: WorkerDone) -> Step:
    fl = state.inflight.get(ev.request)
    if fl is None or fl.stage != "worker":
        return state, []  # invalidated or aborted earlier: already answered
    effects: list[Effect] = []
    if not ev.ok:
        # A call refused because the session's worker is given up (a crash loop) was said once,
        # when it was given up: one warning per refused hook would be the flood it stops.
        effects.append(Log(level="debug" if ev.error_reason == "crash_loop" else "warning",
                           event="icarus.hook_failed", function=fl.kind, code=ev.error_code or ""))
    if fl.kind == "shutdown":
        state = _with_inflight(state, ev.request, None)
        return state, [*effects, _status(None), CloseWorker(), Reply(request=ev.request)]
    stale = fl.generation != state.generation
    context = _context_of(ev.result) if ev.ok and not stale else None
    if context is not None and len(context) > MAX_CONTEXT_CHARS:
        effects.append(Log(level="warning", event="icarus.context_too_large", function=fl.kind,
                           code=f"{len(context)}>{MAX_CONTEXT_CHARS}"))
        context = None
    if fl.kind == "start":
        state = _with_inflight(state, ev.request, None)
        if context is not None and context.strip():
            effects.append(SendMessage(custom_type=SESSION_CONTEXT_TYPE, content=context,
                                       display=state.visible, trigger_turn=False))
        return state, [*effects, Reply(request=ev.request)]
    if fl.kind == "prompt" and context is not None and context.strip():
        if state.config.filtering:
            state = _with_inflight(state, ev.request, fl.evolve(stage="filter"))
            return state, [*effects, Filter(request=ev.request, context=context, prompt=fl.prompt)]
        state = _with_inflight(state, ev.request, None)
        return state, [*effects, _inject(state, ev.request, context)]
    state = _with_inflight(state, ev.request, None)
    return state, [*effects, Reply.build(request=ev.request)]  # a prompt's commonest answer: build


def _on_filter_done(state: HookState, ev: FilterDone) -> Step:
    fl = state.inflight.get(ev.request)
    if fl is None or fl.stage != "filter":
        return state, []
    state = _with_inflight(state, ev.request, None)
    if fl.generation != state.generation:
        return state, [Reply(request=ev.request)]
    return state, [_inject(state, ev.request, ev.text)]


def _on_turn_aborted(state: HookState, ev: TurnAborted) -> Step:
    fl = state.inflight.get(ev.request)
    if fl is None or fl.kind != "prompt":
        return state, []
    effects: list[Effect] = [CancelFilter(request=ev.request)] if fl.stage == "filter" else []
    return _with_inflight(state, ev.request, None), [*effects, Reply(request=ev.request)]


def _buffer(state: HookState, messages: tuple[Any, ...]) -> HookState:
    pending = state.pending
    if pending is None or pending.generation != state.generation:
        pending = Pending(generation=state.generation)
    users = list(pending.users)
    text, stop, hidden = pending.assistant_text, pending.assistant_stop, pending.hidden
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        role = msg.get("role")
        if role == "user":
            hidden = False
            body = flatten(msg.get("content"))
            if body.strip():
                users.append(body)
        elif role == "assistant" and not hidden:
            text, stop = flatten(msg.get("content")), _stop_reason(msg)
        elif _castor_prompt(msg):
            # A cast's turn Pi runs in this run (a follow-up of the user's prompt, or the run's own
            # start): what answers it is the cast's, never the user's answer.
            hidden = True
    pending = pending.evolve(users=tuple(users), assistant_text=text, assistant_stop=stop, hidden=hidden)
    return state.evolve(pending=pending)


def _castor_prompt(msg: dict[str, Any]) -> bool:
    kind = msg.get("custom_type", msg.get("customType"))
    return msg.get("role") == "custom" and kind == CASTOR_PROMPT_TYPE


def _on_agent_end(state: HookState, ev: AgentEnd) -> Step:
    if state.config.hooks_registered and state.enabled:
        state = _buffer(state, ev.messages)
    return state, [Reply(request=ev.request)]


def _capture_kwargs(state: HookState, aborted: bool) -> dict[str, Any] | None:
    p = state.pending
    if not state.enabled or aborted or p is None or p.generation != state.generation:
        return None
    if p.assistant_stop != "stop" or not p.assistant_text or not p.assistant_text.strip():
        return None
    user_message = group_users(p.users) if p.users else (p.prompt or "")
    if not user_message.strip():
        return None
    return {"session_id": state.session_id, "user_message": user_message,
            "assistant_response": p.assistant_text, "platform": state.config.platform}


def _on_agent_settled(state: HookState, ev: AgentSettled) -> Step:
    if not (state.config.hooks_registered and state.enabled):
        return state.evolve(pending=None), [Reply(request=ev.request)]
    if ev.messages:
        state = _buffer(state, ev.messages)
    kwargs = _capture_kwargs(state, ev.aborted)
    state = state.evolve(pending=None)
    if kwargs is None:
        return state, [Reply(request=ev.request)]
    state = _with_inflight(state, ev.request, InFlight(kind="capture", generation=state.generation))
    return state, [CallWorker(request=ev.request, function="post_llm_call", kwargs=kwargs)]


def _on_session_shutdown(state: HookState, ev: SessionShutdown) -> Step:
    state, effects = _invalidate(state)
    state = state.evolve(started=False, shut_down=True)
    if state.config.hooks_registered and state.enabled:
        kwargs = {"session_id": state.session_id, "platform": state.config.platform}
        state = _with_inflight(state, ev.request, InFlight(kind="shutdown", generation=state.generation))
        return state, [*effects, CallWorker(request=ev.request, function="on_session_end", kwargs=kwargs)]
    return state, [*effects, _status(None), CloseWorker(), Reply(request=ev.request)]


def _on_set_enabled(state: HookState, ev: SetEnabled) -> Step:
    if not state.config.hooks_registered:
        return state, []
    target = (not state.enabled) if ev.enabled is None else ev.enabled
    if not target:
        state, effects = _invalidate(state)
        return state.evolve(enabled=False), [*effects, _status(None)]
    state = state.evolve(enabled=True)
    return state, [_footer(state)]


def _on_set_visible(state: HookState, ev: SetVisible) -> Step:
    target = (not state.visible) if ev.visible is None else ev.visible
    return state.evolve(visible=target), []


def _on_context(state: HookState, ev: ContextEvent) -> Step:
    return state, [Reply(request=ev.request)]


# Each handler takes its own event class; the table is keyed by that class's ``kind``.
_HANDLERS: dict[str, Callable[[HookState, Any], Step]] = {
    "session_start": _on_session_start,
    "before_agent_start": _on_before_agent_start,
    "agent_end": _on_agent_end,
    "agent_settled": _on_agent_settled,
    "session_shutdown": _on_session_shutdown,
    "context": _on_context,
    "set_enabled": _on_set_enabled,
    "set_visible": _on_set_visible,
    "worker_done": _on_worker_done,
    "filter_done": _on_filter_done,
    "turn_aborted": _on_turn_aborted,
}
