"""A scripted agent: replays answers from a file (tests and the demo; no model).

Script formats
--------------
- JSON list: ``["answer 1", {"text": "...", "delay_ms": 50}, ...]`` — every
  socket takes the next answer from this one list.
- JSON object keyed by socket id: ``{"Socket-1": [...], "Socket-2": [...],
  "*": [...]}`` — a socket takes from its own list, else from ``"*"``.
- JSONL: one answer per line; an object line may carry ``"socket": "Socket-2"``
  to go to that socket's list (else it goes to the shared list).

An answer is a string (the text) or an object
``{text?, stop_reason?, error?, usage?, delay_ms?}``: ``error`` is a string or
``{message, kind?, payload?, status?}`` (then ``stop_reason`` defaults to
``"error"``); ``usage`` uses TurnUsage field names (anything else is kept in
``usage.raw``).

Guarantees
----------
- Each *cast* has its own cursors: concurrent casts replaying one script each
  get the same sequence, independent of how their turns interleave. Cursors
  are per (cast, socket) for keyed lists and per cast for the shared list.
- Replies come from a small thread pool (zero-latency mode) or a timer
  (``delay_ms``), never on the caller's stack — except a reply marked
  ``enqueues_only`` (an actor tell), which a ready answer reaches at once, on
  the calling thread, with no hop; exactly once per turn;
  ``cancel`` replies ``aborted`` at once and drops the scripted answer.
- Running out of answers is a clear error outcome
  (``error.kind == "exhausted"``), not an exception and not a hang.

Failure behaviour: a malformed script file raises ``InvalidConfig`` at load
with the reason (and line number for JSONL); nothing is replayed.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from castor.actors.ports.agent import TurnError, TurnOutcome, TurnReply, TurnRequest, TurnUsage
from castor.adapters.agents._turns import TurnBook, error_outcome
from castor.messages.errors import InvalidConfig

__all__ = ["AgentScript", "ScriptAnswer", "ScriptedAgent", "load_script", "parse_script"]

SHARED = "*"
_USAGE_FIELDS = set(TurnUsage.model_fields) - {"raw"}


class ScriptAnswer(BaseModel):
    """One scripted turn result."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str = ""
    stop_reason: str | None = None
    error: TurnError | None = None
    usage: TurnUsage | None = None
    delay_ms: int = Field(default=0, ge=0)

    @field_validator("error", mode="before")
    @classmethod
    def _error_text(cls, value: Any) -> Any:
        return {"message": value, "kind": "provider"} if isinstance(value, str) else value

    @field_validator("usage", mode="before")
    @classmethod
    def _usage(cls, value: Any) -> Any:
        if isinstance(value, dict) and not set(value) <= _USAGE_FIELDS | {"raw"}:
            known = {k: v for k, v in value.items() if k in _USAGE_FIELDS}
            return {**known, "raw": value}
        return value

    def outcome(self, turn_id: str) -> TurnOutcome:
        stop = self.stop_reason or ("error" if self.error else "stop")
        return TurnOutcome(turn_id=turn_id, text=self.text, stop_reason=stop, error=self.error, usage=self.usage)


class AgentScript(BaseModel):
    model_config = ConfigDict(frozen=True)

    by_socket: dict[str, list[ScriptAnswer]] = Field(default_factory=dict)  # key "*" = shared list


def _answer(raw: Any, where: str) -> ScriptAnswer:
    try:
        return ScriptAnswer(text=raw) if isinstance(raw, str) else ScriptAnswer.model_validate(raw)
    except ValidationError as exc:
        raise InvalidConfig(f"bad scripted answer at {where}: {exc.errors()[0]['msg']}",
                            data={"reason": "bad_answer", "where": where}) from None


def parse_script(value: Any) -> AgentScript:
    """Build a script from parsed JSON (list or socket-keyed object)."""
    if isinstance(value, list):
        return AgentScript(by_socket={SHARED: [_answer(a, f"[{i}]") for i, a in enumerate(value)]})
    if isinstance(value, dict):
        lists: dict[str, list[ScriptAnswer]] = {}
        for key, answers in value.items():
            if not isinstance(answers, list):
                raise InvalidConfig(f"script entry {key!r} must be a list of answers", data={"reason": "bad_script"})
            lists[key] = [_answer(a, f"{key}[{i}]") for i, a in enumerate(answers)]
        return AgentScript(by_socket=lists)
    raise InvalidConfig("a script is a list of answers or an object of socket id -> answers",
                        data={"reason": "bad_script"})


def _parse_jsonl(text: str) -> AgentScript:
    lists: dict[str, list[ScriptAnswer]] = {}
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidConfig(f"script line {line_no} is not JSON: {exc.msg}",
                                data={"reason": "bad_script", "line": line_no}) from None
        socket = SHARED
        if isinstance(raw, dict) and "socket" in raw:
            raw = dict(raw)
            socket = str(raw.pop("socket"))
        lists.setdefault(socket, []).append(_answer(raw, f"line {line_no}"))
    return AgentScript(by_socket=lists)


def load_script(path: str | os.PathLike[str]) -> AgentScript:
    """Read a JSON or JSONL script file (JSONL if the name ends in .jsonl or JSON parsing fails per line)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidConfig(f"cannot read agent script {file}: {exc.strerror}",
                            data={"reason": "unreadable", "path": str(file)}) from None
    if file.suffix == ".jsonl":
        return _parse_jsonl(text)
    try:
        return parse_script(json.loads(text))
    except json.JSONDecodeError:
        return _parse_jsonl(text)


class ScriptedAgent:
    """AgentPort that replays an :class:`AgentScript`."""

    def __init__(self, script: AgentScript | str | os.PathLike[str], *, max_workers: int = 2) -> None:
        self.script = script if isinstance(script, AgentScript) else load_script(script)
        self._book = TurnBook("scripted", max_workers=max_workers)
        self._lock = threading.Lock()
        self._cursors: dict[tuple[str, str], int] = {}
        self._history: list[TurnRequest] = []

    def _next_answer(self, request: TurnRequest) -> ScriptAnswer | None:
        key = request.socket_id if request.socket_id in self.script.by_socket else SHARED
        answers = self.script.by_socket.get(key, [])
        with self._lock:
            self._history.append(request)
            index = self._cursors.get((request.cast_id, key), 0)
            self._cursors[(request.cast_id, key)] = index + 1
        return answers[index] if index < len(answers) else None

    def run_turn(self, request: TurnRequest, reply: TurnReply) -> None:
        self._book.accept(request, reply)
        answer = self._next_answer(request)
        if answer is None:
            self._book.settle(request.turn_id, error_outcome(
                request.turn_id,
                f"scripted agent exhausted: no answer left for socket {request.socket_id} of cast {request.cast_id}",
                "exhausted",
            ))
            return
        outcome = answer.outcome(request.turn_id)
        if answer.delay_ms == 0:
            self._book.settle(request.turn_id, outcome)
            return
        timer = threading.Timer(answer.delay_ms / 1000, self._book.settle, args=(request.turn_id, outcome))
        timer.daemon = True
        self._book.set_cancel_hook(request.turn_id, timer.cancel)
        timer.start()

    def cancel(self, turn_id: str) -> None:
        self._book.cancel(turn_id)

    def requests(self) -> list[TurnRequest]:
        """Every request received so far, in arrival order (for tests and the demo)."""
        with self._lock:
            return list(self._history)

    def in_flight(self) -> list[str]:
        return self._book.in_flight()

    def close(self) -> None:
        self._book.close()
