"""The harness relay of a cast host: the ports a host's sessions use, as items in an outbox.

A cast host (a Ray actor, possibly on another node) has no connection to the harness; the
serving process does. So the host's sessions get *relay ports*: every call a cast makes on its
harness (``agent.run_turn``, ``ui.notify``, ``session.append_entry``, …) becomes one
:class:`RelayItem` in the host's :class:`Outbox`, which the serving process drains (one long-poll
per host) and replays on the session's real harness link. Answers travel back as host method
calls (``turn_ended``, ``answer``).

Guarantees:

- A relayed turn is answered at most once: :meth:`RelayAgent.deliver` pops the reply, so a late
  or duplicate answer finds nothing (``False``) and is never applied.
- A relayed request (``append_entry``, ``context_usage``, ``compact``) keeps its caller's
  deadline: the caller waits on an event for at most that long and gets ``Timeout``; an answer
  that comes later is dropped.
- No pydantic object crosses the relay: items and answers are plain maps (msgpack-able), so the
  relay works the same over Ray's pickling or any other transport.

Not guaranteed: delivery of notifications if the serving process never drains (the outbox is
bounded; the oldest notifications are dropped first, never turns or requests).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from castor.messages.errors import CastorError, Timeout
from castor.ports.agent import TurnOutcome, TurnReply, TurnRequest
from castor.ports.host_context import CompactionOutcome, CompactionReply, CompactionRequest, ContextUsage
from castor.supervision.threads import start_thread

OUTBOX_LIMIT = 10_000
"""Items an outbox holds at most; past it the oldest *notification* is dropped."""

DROPPABLE = frozenset({"notify", "status", "send_message"})


@dataclass(frozen=True)
class RelayItem:
    """One harness call of a host's session: ``op`` names it, ``args`` are its plain-map arguments."""

    session_id: str
    op: str  # run_turn | cancel | notify | status | send_message | append_entry | context_usage | compact
    args: dict[str, Any] = field(default_factory=dict)
    request_id: int | None = None  # set for calls that wait for an answer

    def to_wire(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "op": self.op, "args": self.args, "request_id": self.request_id}


class Outbox:
    """A bounded, thread-safe queue of relay items with a long-poll ``drain``."""

    def __init__(self, limit: int = OUTBOX_LIMIT) -> None:
        self._items: deque[RelayItem] = deque()
        self._cond = threading.Condition()
        self._limit = limit
        self.dropped = 0
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[threading.Event, list[Any]]] = {}

    def put(self, item: RelayItem) -> None:
        with self._cond:
            if len(self._items) >= self._limit:
                for old in self._items:
                    if old.op in DROPPABLE:
                        self._items.remove(old)
                        self.dropped += 1
                        break
            self._items.append(item)
            self._cond.notify_all()

    def drain(self, max_items: int, timeout_s: float) -> list[dict[str, Any]]:
        """Up to ``max_items`` items, waiting at most ``timeout_s`` for the first one."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self._items:
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._cond.wait(left)
            out: list[dict[str, Any]] = []
            while self._items and len(out) < max_items:
                out.append(self._items.popleft().to_wire())
            return out

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    # -- requests that wait for an answer -----------------------------------
    def request(self, session_id: str, op: str, args: dict[str, Any], timeout_s: float) -> Any:
        """Relay a call and wait for its answer (``Timeout`` past ``timeout_s``; a relayed error re-raised)."""
        request_id = next(self._ids)
        event = threading.Event()
        slot: list[Any] = []
        with self._cond:
            self._waiting[request_id] = (event, slot)
        self.put(RelayItem(session_id=session_id, op=op, args=args, request_id=request_id))
        try:
            if not event.wait(max(0.0, timeout_s)):
                raise Timeout(f"the harness did not answer {op} within {timeout_s:g}s", may_have_started=True,
                              data={"op": op})
        finally:
            with self._cond:
                self._waiting.pop(request_id, None)
        ok, value = slot[0]
        if not ok:
            raise CastorError.from_wire(value)
        return value

    def answer(self, request_id: int, ok: bool, value: Any) -> bool:
        """Deliver the answer of a relayed request; False when nobody waits for it any more."""
        with self._cond:
            waiting = self._waiting.get(request_id)
        if waiting is None:
            return False
        event, slot = waiting
        slot.append((ok, value))
        event.set()
        return True


class RelayAgent:
    """``AgentPort`` of a host's session: turns go to the serving process's harness."""

    def __init__(self, outbox: Outbox, session_id: str, agent_label: str = "Pi agent") -> None:
        self.outbox = outbox
        self.session_id = session_id
        self.agent_label = agent_label  # what failure texts call the serving process's agent
        self._lock = threading.Lock()
        self._replies: dict[str, TurnReply] = {}
        self._reasons: dict[str, str] = {}

    def run_turn(self, request: TurnRequest, reply: TurnReply) -> None:
        with self._lock:
            self._replies[request.turn_id] = reply
        self.outbox.put(RelayItem(session_id=self.session_id, op="run_turn", args=request.model_dump(mode="json")))

    def note_stop_reason(self, turn_id: str, reason: str) -> None:
        """Why the next ``cancel`` of ``turn_id`` happens (relayed with it, as the harness link takes it)."""
        with self._lock:
            if turn_id in self._replies:
                self._reasons[turn_id] = reason

    def cancel(self, turn_id: str) -> None:
        with self._lock:
            reply = self._replies.pop(turn_id, None)
            reason = self._reasons.pop(turn_id, None)
        self.outbox.put(RelayItem(session_id=self.session_id, op="cancel", args={"turn_id": turn_id,
                                                                                 "reason": reason}))
        if reply is not None:
            reply(TurnOutcome(turn_id=turn_id, stop_reason="aborted"))

    def deliver(self, outcome: dict[str, Any]) -> bool:
        """The harness's answer to a relayed turn; False for an unknown or already-answered turn."""
        parsed = TurnOutcome.model_validate(outcome)
        with self._lock:
            reply = self._replies.pop(parsed.turn_id, None)
            self._reasons.pop(parsed.turn_id, None)
        if reply is None:
            return False
        reply(parsed)
        return True

    def pending(self) -> list[str]:
        with self._lock:
            return sorted(self._replies)


class RelayUi:
    """``SessionUiPort`` of a host's session (fire and forget)."""

    def __init__(self, outbox: Outbox, session_id: str) -> None:
        self.outbox = outbox
        self.session_id = session_id

    def send_message(self, custom_type: str, content: str, *, display: bool, trigger_turn: bool = False) -> None:
        self.outbox.put(RelayItem(session_id=self.session_id, op="send_message", args={
            "custom_type": custom_type, "content": content, "display": display, "trigger_turn": trigger_turn}))

    def set_status(self, key: str, text: str | None) -> None:
        self.outbox.put(RelayItem(session_id=self.session_id, op="status", args={"key": key, "text": text}))

    def notify(self, message: str, level: str = "info", *, code: str | None = None) -> None:
        args = {"message": message, "level": level, **({"code": code} if code is not None else {})}
        self.outbox.put(RelayItem(session_id=self.session_id, op="notify", args=args))


class RelaySessionLog:
    """``SessionPort`` of a host's session: the entry is persisted by the harness before this returns."""

    def __init__(self, outbox: Outbox, session_id: str) -> None:
        self.outbox = outbox
        self.session_id = session_id

    def append_entry(self, custom_type: str, data: dict[str, Any], deadline: float, *,
                     expires: bool = False) -> None:
        self.outbox.request(self.session_id, "append_entry", {"custom_type": custom_type, "data": data,
                                                              "timeout_s": max(0.0, deadline - time.monotonic()),
                                                              "expires": expires},
                            timeout_s=deadline - time.monotonic())


class RelayHostContext:
    """``HostContextPort`` of a host's session (the harness's transcript lives with the harness)."""

    def __init__(self, outbox: Outbox, session_id: str, has_context: bool) -> None:
        self.outbox = outbox
        self.session_id = session_id
        self._has_context = has_context

    @property
    def has_context(self) -> bool:
        return self._has_context

    def context_usage(self, timeout_s: float) -> ContextUsage | None:
        value = self.outbox.request(self.session_id, "context_usage", {"timeout_s": timeout_s}, timeout_s=timeout_s + 1)
        return ContextUsage.from_wire(value)

    def compact(self, request: CompactionRequest, reply: CompactionReply, *, timeout_s: float) -> None:
        def run() -> None:
            try:
                value = self.outbox.request(self.session_id, "compact", {"request": request.model_dump(mode="json"),
                                                                          "timeout_s": timeout_s},
                                            timeout_s=timeout_s + 1)
                reply(CompactionOutcome.model_validate(value))
            except CastorError as exc:
                reply(CompactionOutcome.failed(exc.message))

        start_thread(run, name=f"relay-compact-{self.session_id}", owner=f"/root/session/{self.session_id}",
                     purpose="relays a host compaction to the harness")
