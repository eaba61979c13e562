"""The harness-side ports of one session, over a msgpack-rpc connection.

:class:`WireHarness` implements every port a session needs from the harness:

=================  ====================================  ==========================================
port               castor → harness                      answer
=================  ====================================  ==========================================
AgentPort          ``agent.run_turn`` (notification)     later, ``agent.turn_ended`` (request from
                                                         the harness) → :meth:`turn_ended`
                   ``agent.abort_turn`` (notification)   none: the harness stops that run; its
                                                         ``agent.turn_ended`` is answered ``ignored``
SessionPort        ``session.append_entry`` (request)    ``{ok, entry_id}`` once persisted
SessionUiPort      ``message.send``, ``ui.notify``,      none (fire and forget)
                   ``ui.status`` (notifications)
ClassifierPort     ``model.list``, ``classifier.         the models; the completion
                   complete`` (requests)
HostContextPort    ``session.context_usage``,            ``{tokens, contextWindow, percent}`` | nil;
                   ``session.compact`` (requests)        the compaction result summary
=================  ====================================  ==========================================

Host context (:class:`castor.ports.host_context.HostContextPort`):

| harness answer | ``context_usage`` | ``compact`` |
|---|---|---|
| a map | :class:`ContextUsage` | ``ok`` with the spec's summary fields only |
| nil | None (skip proactive compaction) | ``ok`` with an empty summary |
| ``unknown_method`` / ``unsupported`` | None, and ``has_context`` turns False for the session: no later read is sent | ``ok=False``, ``unsupported=True``: the recovery fails ("…compact failed…") |
| another error (``compaction_failed`` …) | raises (the caller skips) | ``ok=False`` with the harness's message |
| no answer in time | raises ``Timeout`` | ``ok=False``, "timed out" |
| the connection closed | raises ``ConnectionClosed`` | no reply (like a turn: the session closes with it and its casts stay resumable; the caller's deadline answers anyway) |

Every request castor makes has a deadline. A turn whose connection dies is
*not* answered: its cast stays persisted and resumable (``cast.recast``)
rather than being failed by a transport it cannot see.

Stopping a turn castor sent (:meth:`abort_turn`, and :meth:`cancel`, the AgentPort's): the turn is
forgotten, its reply gets the ``aborted`` / ``cancelled`` outcome at once (the caller never waits
for the model), and the harness is told with the ``agent.abort_turn`` notification
``{session_id, turn_id, reason}`` so it stops the run in flight — ``reason`` is ``cast_aborted``
(the user aborted the cast), ``cast_restarted`` (castor redoes the turn under a new id) or
``cast_stopped`` (castor stops the cast's work: the session closes, the runtime shuts down). The
harness's later ``agent.turn_ended`` for such a turn (the run ended as it was being stopped) is
answered ``{ok: true, ignored: true}``, never an error; the last :data:`REMEMBERED_STOPPED`
stopped ids are remembered for that.
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Sequence

from castor._log import logger
from castor.domain.icarus.lifecycle import CASTOR_PROMPT_TYPE
from castor.domain.materia.budget import (
    STOPPED_UNREPORTED_KEY,
    answering_model,
    cost_figure,
    non_negative_number,
    plain_usage,
    sum_usage_maps,
    text_or_none,
    unreadable_usage,
)
from castor.domain.materia.prompts import turn_message_details
from castor.endpoint.errors import ConnectionClosed
from castor.endpoint.framing import element_over_limits
from castor.messages.errors import CastorError, InvalidParams, NotFound, Timeout
from castor.ports.agent import (
    TurnError,
    TurnOutcome,
    TurnReply,
    TurnRequest,
    TurnUsage,
    harness_turn_settings,
)
from castor.ports.classifier import ClassifierRequest, ClassifierResponse, ClassifierUsage, ModelEndpoint
from castor.ports.host_context import CompactionOutcome, CompactionReply, CompactionRequest, ContextUsage
from castor.supervision.threads import start_thread

if TYPE_CHECKING:
    from castor.endpoint.dispatch import Peer

UI_DEADLINE_S = 5.0
#: How many stopped turn ids a session remembers (their late ``agent.turn_ended`` is ``ignored``).
REMEMBERED_STOPPED = 256

#: Error codes that mean "this harness does not implement the method".
UNSUPPORTED_CODES = frozenset({"unknown_method", "unsupported"})


def unsupported(exc: CastorError) -> bool:
    """True for a harness that does not implement the method it was asked for."""
    return str(exc.code) == "unknown_method" or (exc.data or {}).get("wire_code") in UNSUPPORTED_CODES



#: The most of an expiring entry's time left that is kept back for its acknowledgement's way back.
EXPIRY_MARGIN_S = 0.25


def expiry_margin_s(left_s: float) -> float:
    """How long before castor's own deadline an expiring entry's ``expires_at_ms`` falls: a quarter
    of the time left, at most :data:`EXPIRY_MARGIN_S` (0.25 s of a 2 s audit deadline)."""
    return min(EXPIRY_MARGIN_S, left_s / 4)

class WireHarness:
    """AgentPort + SessionPort + SessionUiPort + ClassifierPort + HostContextPort over one connection."""

    def __init__(self, connection: Peer, session_id: str) -> None:
        self.connection = connection
        self.session_id = session_id
        self.owner = f"/root/session/{session_id}"
        self._lock = threading.Lock()
        self._turns: dict[str, TurnReply] = {}
        self._stopped: OrderedDict[str, str] = OrderedDict()  # turn id -> why castor stopped it
        self._reasons: dict[str, str] = {}  # pending turn id -> why its coming cancel happens
        self._usage_supported = True  # until the harness answers unknown_method
        #: Another connection opened this session id again after this one's session gave up: the
        #: link no longer drives anything (``owned_session`` answers ``forbidden`` for it).
        self.superseded = False
        self.log = logger.bind(actor=f"/endpoint/harness/{session_id}")

    # -- AgentPort -------------------------------------------------------------
    def run_turn(self, request: TurnRequest, reply: TurnReply) -> None:
        params: dict[str, Any] = {
            "session_id": self.session_id,
            "turn_id": request.turn_id,
            "prompt": request.prompt,
            "summary": request.summary,
            "custom_type": CASTOR_PROMPT_TYPE,  # the hidden materia prompt, named as pi-materia names it
            "isolate": True,
        }
        # the details pi-materia gives the visible line's message and the hidden prompt's
        params["summary_details"], params["prompt_details"] = turn_message_details(
            socket_id=request.socket_id, materia_name=request.materia or None, item_key=request.item_key,
            item_label=request.item_label, materia_model=request.materia_model)
        params.update(harness_turn_settings(request.model, request.thinking, request.tools))
        too_big = element_over_limits(params, self.connection.settings.frame_limits)
        if too_big is not None:
            # The harness's decoder would refuse the frame and drop the connection (and a recast
            # would send it again): answer the turn at once, on another thread, as a request
            # error no retry can fix.
            outcome = TurnOutcome(turn_id=request.turn_id, stop_reason="error", error=TurnError(
                message=f"invalid_request: agent.run_turn cannot be sent: {too_big}", kind="internal"))
            start_thread(reply, args=(outcome,), name=f"oversized-{request.turn_id}", owner=self.owner,
                         purpose="answer a turn too large to send")
            return
        with self._lock:
            self._turns[request.turn_id] = reply
        if not self.connection.notify("agent.run_turn", params):
            self.log.warning("agent.run_turn for {turn} not sent: connection closed", turn=request.turn_id)

    #: What failure texts call the agent of this port's turns.
    agent_label = "Pi agent"

    def cancel(self, turn_id: str) -> None:
        """AgentPort: stop the turn (see :meth:`abort_turn`), for the reason noted by
        :meth:`note_stop_reason`, else ``cast_stopped``."""
        with self._lock:
            reason = self._reasons.pop(turn_id, "cast_stopped")
        self.abort_turn(turn_id, reason)

    def note_stop_reason(self, turn_id: str, reason: str) -> None:
        """Say why the next :meth:`cancel` of ``turn_id`` happens (the cast stops its socket actor,
        which cancels the turn on its way out). Only for a pending turn; forgotten with it."""
        with self._lock:
            if turn_id in self._turns:
                self._reasons[turn_id] = reason

    def abort_turn(self, turn_id: str, reason: str = "cast_aborted") -> bool:
        """Stop a turn castor sent: answer its reply ``aborted`` now and send ``agent.abort_turn``.

        Idempotent; False (and nothing sent) for a turn that is not pending (answered, unknown,
        already stopped). Never waits for the harness."""
        with self._lock:
            reply = self._turns.pop(turn_id, None)
            self._reasons.pop(turn_id, None)
            if reply is None:
                return False
            self._stopped[turn_id] = reason
            while len(self._stopped) > REMEMBERED_STOPPED:
                self._stopped.popitem(last=False)
        if not self.connection.notify("agent.abort_turn", {"session_id": self.session_id, "turn_id": turn_id,
                                                           "reason": reason}):
            self.log.info("agent.abort_turn for {turn} not sent: connection closed", turn=turn_id)
        reply(TurnOutcome(turn_id=turn_id, stop_reason="aborted",
                          error=TurnError(message=f"turn stopped by castor ({reason})", kind="cancelled")))
        return True

    def turn_ended(self, params: dict[str, Any]) -> bool:
        """Deliver the harness's ``agent.turn_ended``: True once delivered; False for a turn castor
        stopped (``abort_turn``): nothing is delivered. NotFound for an unknown or answered turn."""
        turn_id = str(params.get("turn_id") or "")
        outcome = outcome_from_wire(turn_id, params)  # before the turn is taken: a bad answer keeps it pending
        with self._lock:
            reply = self._turns.pop(turn_id, None)
            self._reasons.pop(turn_id, None)
            stopped = reply is None and self._stopped.pop(turn_id, None) is not None
        if stopped:
            return False
        if reply is None:
            raise NotFound(f"no pending turn {turn_id!r}", data={"turn_id": turn_id})
        reply(outcome)
        return True

    def pending_turns(self) -> list[str]:
        with self._lock:
            return sorted(self._turns)

    # -- SessionPort -------------------------------------------------------------
    def append_entry(self, custom_type: str, data: dict[str, Any], deadline: float, *,
                     expires: bool = False) -> None:
        """``session.append_entry``. ``expires``: the request carries ``expires_at_ms``, the wall-clock
        instant (Unix ms) after which the harness must refuse the entry instead of appending it:
        castor's deadline less :func:`expiry_margin_s`, so an acknowledgement the harness sends by
        then reaches castor before its deadline (a later one finds castor gone on without it)."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise Timeout("append_entry deadline passed before sending", may_have_started=False)
        params: dict[str, Any] = {"custom_type": custom_type, "data": data}
        if expires:
            params["expires_at_ms"] = int((time.time() + left - expiry_margin_s(left)) * 1000)
        result = self.connection.call("session.append_entry", params, timeout=left)
        if not (isinstance(result, dict) and result.get("ok") is True):
            raise CastorError("harness did not acknowledge the entry", data={"custom_type": custom_type})

    # -- HostContextPort ----------------------------------------------------------
    @property
    def has_context(self) -> bool:
        """A harness session has a transcript, unless the harness said it cannot report on it."""
        return self._usage_supported

    def context_usage(self, timeout_s: float) -> ContextUsage | None:
        """``session.context_usage``; None for nil or a harness without the method (remembered:
        later reads are not sent). Other errors and timeouts raise."""
        if not self._usage_supported:
            return None
        try:
            result = self.connection.call("session.context_usage", {"session_id": self.session_id}, timeout=timeout_s)
        except CastorError as exc:
            if unsupported(exc):
                self._usage_supported = False
                self.log.info("harness has no session.context_usage: no proactive compaction in this session")
                return None
            raise
        return ContextUsage.from_wire(result)

    def compact(self, request: CompactionRequest, reply: CompactionReply, *, timeout_s: float) -> None:
        """``session.compact`` on a thread of its own; ``reply`` gets the outcome exactly once."""
        params = {"session_id": self.session_id, "cast_id": request.cast_id, "instructions": request.instructions}

        def run() -> None:
            try:
                outcome = self._compact_outcome(params, timeout_s)
            except ConnectionClosed:
                # As for a turn: the session closes with its connection and its casts stay
                # resumable; a compaction is not failed by a transport the cast cannot see (the
                # caller's deadline still answers if the cast is somehow still waiting).
                self.log.info("session.compact for {cast} not answered: connection closed", cast=request.cast_id)
                return
            reply(outcome)

        start_thread(run, name=f"session-compact-{request.cast_id}", owner=self.owner,
                     purpose="ask the harness to compact its session")

    def _compact_outcome(self, params: dict[str, Any], timeout_s: float) -> CompactionOutcome:
        try:
            result = self.connection.call("session.compact", params, timeout=timeout_s)
        except ConnectionClosed:
            raise
        except CastorError as exc:
            if unsupported(exc):
                return CompactionOutcome.failed(
                    f"the harness does not implement session.compact ({exc.data.get('wire_code') or exc.code})",
                    unsupported=True)
            if isinstance(exc, Timeout):
                return CompactionOutcome.failed(f"session.compact got no answer within {timeout_s:g}s")
            code = exc.data.get("wire_code") or exc.code
            return CompactionOutcome.failed(f"{exc.message} ({code})" if exc.message else str(code),
                                            cancelled=code == "cancelled")
        return CompactionOutcome.succeeded(result)

    # -- SessionUiPort -----------------------------------------------------------
    def send_message(self, custom_type: str, content: str, *, display: bool, trigger_turn: bool = False) -> None:
        self.connection.notify("message.send", {"custom_type": custom_type, "content": content,
                                                "display": display, "trigger_turn": trigger_turn})

    def set_status(self, key: str, text: str | None) -> None:
        self.connection.notify("ui.status", {"key": key, "text": text})

    def notify(self, message: str, level: str = "info", *, code: str | None = None) -> None:
        params = {"message": message, "level": level}
        if code is not None:
            params["code"] = code
        self.connection.notify("ui.notify", params)

    # -- ClassifierPort ----------------------------------------------------------
    def list_models(self, deadline: float | None = None) -> Sequence[ModelEndpoint] | None:
        timeout = UI_DEADLINE_S if deadline is None else max(0.001, deadline - time.monotonic())
        try:
            result = self.connection.call("model.list", {}, timeout=timeout)
        except CastorError as exc:
            if exc.data.get("wire_code") == "unsupported":
                return None
            raise
        models = result.get("models") if isinstance(result, dict) else None
        if not isinstance(models, list):
            raise InvalidParams("model.list answered without a models list")
        out = []
        for model in models:
            # An entry castor cannot read (no provider or id, a base_url that is no string) is left
            # out, never the whole list: one odd model must not cost the filter every other one.
            if not (isinstance(model, dict) and model.get("provider") and model.get("id")):
                continue
            base_url = model.get("base_url")
            if base_url is not None and not isinstance(base_url, str):
                continue  # where it is cannot be told: neither local nor remote, so not a choice
            out.append(ModelEndpoint(provider=str(model["provider"]), id=str(model["id"]),
                                     base_url=base_url, has_auth=bool(model.get("available", True))))
        return out

    def complete(self, request: ClassifierRequest, deadline: float) -> ClassifierResponse:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Timeout("classifier deadline passed before sending", may_have_started=False)
        params = {
            "provider": request.provider,
            "model": request.model,
            "messages": [m.model_dump() for m in request.messages],
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "timeout_ms": int(left * 1000),
        }
        result = self.connection.call("classifier.complete", params, timeout=left)
        if not isinstance(result, dict) or not isinstance(result.get("text"), str):
            raise InvalidParams("classifier.complete answered without text")
        usage = result.get("usage")
        return ClassifierResponse(text=result["text"],
                                  usage=ClassifierUsage.model_validate(usage) if isinstance(usage, dict) else None)


def usage_from_wire(usage: dict[str, Any]) -> TurnUsage:
    """The harness's usage map as TurnUsage. Usage is telemetry: a figure that is not a finite,
    non-negative number is *not reported* (None), never a reason to lose the turn; ``raw`` keeps
    the map as plain JSON (a NaN or infinity dropped, the rest kept), so the cast's state can be
    written and the engine reads every alias pi-materia reads (castor.domain.materia.budget)."""
    raw = plain_usage(usage) or None
    tokens = {name: non_negative_number(usage.get(key)) for name, key in (
        ("input_tokens", "input"), ("output_tokens", "output"), ("cache_read_tokens", "cache_read"),
        ("cache_write_tokens", "cache_write"), ("total_tokens", "total_tokens"))}
    return TurnUsage(**{k: int(v) if v is not None else None for k, v in tokens.items()},
                     cost_usd=cost_figure(usage.get("cost")), raw=raw)


def outcome_from_wire(turn_id: str, params: dict[str, Any]) -> TurnOutcome:
    """Map ``agent.turn_ended`` params onto a TurnOutcome (unknown usage stays None)."""
    usage = params.get("usage")
    usages = params.get("usages")
    if isinstance(usages, list) and usages:
        # The raw map of every assistant message (a harness that sums them itself can only add the
        # spellings it knows; each is read here with every alias pi-materia reads).
        usage = sum_usage_maps(usages)
    elif usages is not None and not isinstance(usages, list):
        usage = unreadable_usage("usages", usages)
    elif usage is not None and not isinstance(usage, dict):
        usage = unreadable_usage("usage", usage)
    if isinstance(usage, dict) and params.get("stopped_usage_unknown") is True:
        # the turn's stopped message reported nothing: the usage given is its earlier messages'
        usage = {**usage, STOPPED_UNREPORTED_KEY: True}
    model, provider, api = answering_model(params)
    error = params.get("error")
    turn_error = None
    if error:
        if isinstance(error, dict):
            turn_error = TurnError(message=str(error.get("message") or error), payload=error.get("payload", error),
                                   kind=error.get("kind") if error.get("kind") in _KINDS else "provider")
        else:
            turn_error = TurnError(message=str(error), kind="provider")
    stop_reason = params.get("stop_reason")
    if params.get("aborted"):
        stop_reason = "aborted"
    text = str(params.get("text") or "")
    cut_from = params.get("text_cut_from")
    if isinstance(cut_from, int) and not isinstance(cut_from, bool) and cut_from > 0:
        # The harness cut an answer over what the wire carries: the output says so where it ends.
        text += (f"\n\n[castor: this answer was cut by the harness at {len(text.encode())} of its "
                 f"{cut_from} bytes, over what castor's wire carries]")
    return TurnOutcome(
        turn_id=turn_id,
        text=text,
        stop_reason=str(stop_reason) if stop_reason is not None else None,
        error=turn_error,
        usage=usage_from_wire(usage) if usage else None,
        model=model, provider=provider, api=api,
        thinking_level=text_or_none(params.get("thinking_level")),
        entry_id=str(params["entry_id"]) if params.get("entry_id") else None,
    )


_KINDS = {"provider", "transport", "timeout", "cancelled", "exhausted", "invalid_response", "internal"}
