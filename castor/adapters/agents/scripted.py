"""A scripted agent: replays answers from a file (tests, the demo, offline use; no model).

Script formats (docs/materia.md "The scripted agent" has a complete example)
----------------------------------------------------------------------------
- JSON list: ``["answer 1", {"text": "...", "delay_ms": 50}, ...]``.
- JSON object of lists: ``{"Socket-1": [...], "Socket-4/w2": [...], "*": [...]}``
  — each list's answers belong to the turns its name says (a key, below),
  those of ``"*"`` to any turn.
- JSONL: one answer per line; an object line may carry ``"socket"``.

An answer is a string (the text) or an object
``{text?, stop_reason?, error?, usage?, delay_ms?, socket?, item?, visit?, mode?, key?}``:
``error`` is a string or ``{message, kind?, payload?, status?}`` (then
``stop_reason`` defaults to ``"error"``); ``usage`` is a usage map (TurnUsage field names
or any spelling the engine reads, all kept in ``usage.raw``; a figure that is not a finite,
non-negative number is not reported, and a ``usage`` that is no map is named unreadable; an
answered turn's answer with no ``usage``, or ``null``, reports none, as an OpenAI-compatible
server's answer without one: the cast records the turn as ``unreported``);
``stop_reason: "aborted"`` plays the user's Esc.

Which answer a turn gets
------------------------
``socket`` (socket id), ``item`` (the work item key of a loop socket),
``visit`` (that socket's visit number, from 1) and ``mode`` (``normal``,
``refinement``, ``finalization``) say which turns an answer belongs to;
``key: "SOCKET[/ITEM[/VISIT]]"`` says the same in one string. An answer that
names none of them belongs to any turn. A turn gets the first answer, in this
order, that belongs to it and that its cast has not used yet: the answers that
name more of those fields first, then file order. So plain answers are used one
after the other (the old plain-list behaviour), and an answer keyed to its
socket and work item is found again by a recast in a new process — a cast
resumed at work item ``w2`` gets ``w2``'s answer, never the first of the file.

Guarantees
----------
- Each *cast* uses the answers on its own: concurrent casts replaying one
  script each get the same answers, however their turns interleave. What a cast
  used is remembered per process: a new process (``castor recast``) starts with
  every answer unused, which is why keyed answers resume correctly and a plain
  list starts again from its first answer.
- Replies come from a small thread pool (zero-latency mode) or a timer
  (``delay_ms``), never on the caller's stack — except a reply marked
  ``enqueues_only`` (an actor tell), which a ready answer reaches at once, on
  the calling thread, with no hop; exactly once per turn;
  ``cancel`` replies ``aborted`` at once and drops the scripted answer.
- Running out of answers is a clear error outcome
  (``error.kind == "exhausted"``) naming the socket, item and visit, not an
  exception and not a hang.

Failure behaviour: a malformed script file raises ``InvalidConfig`` at load
with the reason (and line number for JSONL); nothing is replayed. So does a path
that is not a regular file (a FIFO, ``/dev/zero``, a directory: refused at once,
never waited on or read) or a file over :data:`MAX_SCRIPT_BYTES` (16 MiB).
"""

from __future__ import annotations

import json
import os
import threading
from collections import deque
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from castor.adapters.agents._turns import TurnBook, error_outcome
from castor.adapters.fs import read_regular_file
from castor.domain.jsontext import json_problem
from castor.domain.materia.budget import cost_figure, non_negative_number, plain_usage, unreadable_usage
from castor.messages.errors import InvalidConfig
from castor.ports.agent import TurnError, TurnOutcome, TurnReply, TurnRequest, TurnUsage
from castor.supervision.timers import call_later

__all__ = ["AgentScript", "ScriptAnswer", "ScriptedAgent", "load_script", "parse_script"]

SHARED = "*"
MAX_SCRIPT_BYTES = 16 * 1024 * 1024
"""An answers file larger than this is refused (``InvalidConfig``), as is anything but a regular file."""
HISTORY_KEPT = 1000
"""How many of the latest requests :meth:`ScriptedAgent.requests` keeps."""
_USAGE_FIELDS = set(TurnUsage.model_fields) - {"raw"}
_NO_USAGE_REPORTED = TurnUsage()  # frozen: one for every answer that gives none


class ScriptAnswer(BaseModel):
    """One scripted turn result."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str = ""
    stop_reason: str | None = None
    error: TurnError | None = None
    usage: TurnUsage | None = None
    delay_ms: int = Field(default=0, ge=0)
    # which turns the answer belongs to (None: any)
    socket: str | None = Field(default=None, min_length=1)
    item: str | None = Field(default=None, min_length=1)
    visit: int | None = Field(default=None, ge=1)
    mode: Literal["normal", "refinement", "finalization"] | None = None
    key: str | None = Field(default=None, min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _key(cls, value: Any) -> Any:
        """``key: "SOCKET[/ITEM[/VISIT]]"`` sets the fields it names; a field also given must agree."""
        if not isinstance(value, dict) or not isinstance(value.get("key"), str):
            return value
        parts = value["key"].split("/")
        if len(parts) > 3 or not all(parts):
            raise ValueError(f"key {value['key']!r} is not SOCKET, SOCKET/ITEM or SOCKET/ITEM/VISIT")
        named: dict[str, Any] = {"socket": parts[0]}
        if len(parts) > 1:
            named["item"] = parts[1]
        if len(parts) > 2:
            if not (parts[2].isascii() and parts[2].isdigit()):
                raise ValueError(f"key {value['key']!r}: the visit must be a number")
            named["visit"] = int(parts[2])
        out = dict(value)
        for field, given in named.items():
            if out.get(field) is not None and out[field] != given:
                raise ValueError(f"key {value['key']!r} disagrees with {field} {out[field]!r}")
            out[field] = given
        return out

    @property
    def specificity(self) -> int:
        return sum(v is not None for v in (self.socket, self.item, self.visit, self.mode))

    def belongs_to(self, request: TurnRequest) -> bool:
        return ((self.socket is None or self.socket == request.socket_id)
                and (self.item is None or self.item == request.item_key)
                and (self.visit is None or self.visit == request.visit)
                and (self.mode is None or self.mode == request.mode))

    @field_validator("error", mode="before")
    @classmethod
    def _error_text(cls, value: Any) -> Any:
        return {"message": value, "kind": "provider"} if isinstance(value, str) else value

    @field_validator("usage", mode="before")
    @classmethod
    def _usage(cls, value: Any) -> Any:
        """Read as any agent's usage is (the OpenAI-compatible one, the harness link's): a figure
        that is not a finite, non-negative number is not reported -- never coerced (``"12"`` was
        12 tokens, ``true`` one) nor a refused script (``12.5``); a cost may be a decimal string
        (:func:`~castor.domain.materia.budget.cost_figure`) -- and the whole map is kept as
        ``raw`` (an explicit ``raw`` object wins), which the engine reads with every alias. A usage
        that is not a map (a number, a string, a list) counts nothing and is named unreadable
        (``usage="lots"``), as the harness link and the OpenAI-compatible agent name one: the turn
        is kept, never the whole script refused."""
        if value is None or isinstance(value, TurnUsage):
            return value
        if not isinstance(value, dict):
            return {"raw": unreadable_usage("usage", plain_usage(value))}
        given = value.get("raw")
        raw = plain_usage(given if isinstance(given, dict) else {k: v for k, v in value.items() if k != "raw"})
        fields = {k: (cost_figure if k == "cost_usd" else non_negative_number)(value.get(k)) for k in _USAGE_FIELDS}
        known = {k: (v if k == "cost_usd" or v is None else int(v)) for k, v in fields.items()}
        return {**known, "raw": raw or None}

    def outcome(self, turn_id: str) -> TurnOutcome:
        """The turn's outcome. An answered turn (no ``error``, not stopped) whose answer gives no
        ``usage`` (or ``null``) reports an empty usage, as an OpenAI-compatible server that sends
        none does: the cast records the turn as reporting no tokens (``unreported``) and says so,
        never as a turn that cost nothing. A failed or stopped turn without one reports none
        (None: the engine reads a stopped one as usage unknown, a failed one as nothing used)."""
        stop = self.stop_reason or ("error" if self.error else "stop")
        usage = self.usage
        if usage is None and self.error is None and stop not in ("error", "aborted"):
            usage = _NO_USAGE_REPORTED
        return TurnOutcome(turn_id=turn_id, text=self.text, stop_reason=stop, error=self.error, usage=usage)


class AgentScript(BaseModel):
    model_config = ConfigDict(frozen=True)

    by_socket: dict[str, list[ScriptAnswer]] = Field(default_factory=dict)  # key "*" = shared list


def _answer(raw: Any, where: str) -> ScriptAnswer:
    try:
        return ScriptAnswer(text=raw) if isinstance(raw, str) else ScriptAnswer.model_validate(raw)
    except ValidationError as exc:
        raise InvalidConfig(f"bad scripted answer at {where}: {exc.errors()[0]['msg']}",
                            data={"reason": "bad_answer", "where": where}) from None


def _keyed(raw: Any, key: str, where: str) -> ScriptAnswer:
    """An answer of the list under ``key`` (``SOCKET[/ITEM[/VISIT]]``) belongs to the turns it names."""
    if key == SHARED:
        return _answer(raw, where)
    obj = {"text": raw} if isinstance(raw, str) else raw
    if isinstance(obj, dict):
        if obj.get("key") not in (None, key):
            raise InvalidConfig(f"bad scripted answer at {where}: its key {obj['key']!r} is not its list's {key!r}",
                                data={"reason": "bad_answer", "where": where})
        obj = {**obj, "key": key}
    return _answer(obj, where)


def parse_script(value: Any) -> AgentScript:
    """Build a script from parsed JSON (list or socket-keyed object)."""
    if isinstance(value, list):
        return AgentScript(by_socket={SHARED: [_answer(a, f"[{i}]") for i, a in enumerate(value)]})
    if isinstance(value, dict):
        lists: dict[str, list[ScriptAnswer]] = {}
        for key, answers in value.items():
            if not isinstance(answers, list):
                raise InvalidConfig(f"script entry {key!r} must be a list of answers", data={"reason": "bad_script"})
            lists[key] = [_keyed(a, key, f"{key}[{i}]") for i, a in enumerate(answers)]
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
        except (ValueError, RecursionError) as exc:  # a deep nesting or a huge integer too
            raise InvalidConfig(f"script line {line_no} is not JSON: {json_problem(exc)}",
                                data={"reason": "bad_script", "line": line_no}) from None
        answer = _answer(raw, f"line {line_no}")
        lists.setdefault(answer.socket or SHARED, []).append(answer)
    return AgentScript(by_socket=lists)


def load_script(path: str | os.PathLike[str]) -> AgentScript:
    """Read a JSON or JSONL script file (JSONL if the name ends in .jsonl or JSON parsing fails per line).

    Only a regular file of at most :data:`MAX_SCRIPT_BYTES` is read, as a config layer is: a FIFO
    (which would block until a writer came, past any SIGTERM), ``/dev/zero`` (read whole into
    memory) or a directory is ``InvalidConfig`` naming the file, at once; so is a file that is no
    script (not JSON, a bad answer), with where in it.
    """
    file = Path(path)
    try:
        text = read_regular_file(file, MAX_SCRIPT_BYTES).decode("utf-8")
    except OSError as exc:
        raise InvalidConfig(f"cannot read agent script {file}: {exc.strerror}",
                            data={"reason": "unreadable", "path": str(file)}) from None
    except UnicodeDecodeError as exc:
        raise InvalidConfig(f"cannot read agent script {file}: not UTF-8 text (byte {exc.start}); save it as "
                            "UTF-8", data={"reason": "not_utf8", "path": str(file)}) from None
    except ValueError as exc:  # not a regular file, or too large
        raise InvalidConfig(f"cannot read agent script {file}: {exc} (an answers file is a regular file of at "
                            f"most {MAX_SCRIPT_BYTES // (1024 * 1024)} MiB)",
                            data={"reason": "unreadable", "path": str(file)}) from None
    try:
        if file.suffix == ".jsonl":
            return _parse_jsonl(text)
        try:
            whole = json.loads(text)
        except (ValueError, RecursionError):  # not one JSON document (or one Python cannot read): JSONL
            return _parse_jsonl(text)
        return parse_script(whole)
    except InvalidConfig as exc:  # "script line 1 is not JSON" said not which file: the file named first
        raise InvalidConfig(f"agent script {file}: {exc.message}", data={**exc.data, "path": str(file)}) from None


class ScriptedAgent:
    """AgentPort that replays an :class:`AgentScript`."""

    def __init__(self, script: AgentScript | str | os.PathLike[str], *, max_workers: int = 2) -> None:
        self.script = script if isinstance(script, AgentScript) else load_script(script)
        self.agent_label = (
            "scripted agent" if isinstance(script, AgentScript) else f"scripted agent ({Path(script).name})"
        )
        self._book = TurnBook("scripted", max_workers=max_workers)
        self._lock = threading.Lock()
        # Every answer once, the most specific first, then in file order (the module's rule).
        answers = [a for lst in self.script.by_socket.values() for a in lst]
        self._order = sorted(range(len(answers)), key=lambda i: (-answers[i].specificity, i))
        self._answers = answers
        self._used: dict[str, set[int]] = {}  # cast id -> indexes of the answers it used
        self._skip: dict[str, int] = {}  # cast id -> how many of _order, from the start, it has used
        # The latest requests only: a scripted server that runs for days must not keep every prompt.
        self._history: deque[TurnRequest] = deque(maxlen=HISTORY_KEPT)

    def _next_answer(self, request: TurnRequest) -> ScriptAnswer | None:
        with self._lock:
            self._history.append(request)
            cast = request.cast_id
            used = self._used.setdefault(cast, set())
            order = self._order
            start = self._skip.get(cast, 0)
            for position in range(start, len(order)):
                index = order[position]
                if index not in used and self._answers[index].belongs_to(request):
                    used.add(index)
                    while start < len(order) and order[start] in used:  # a list used in order: O(1) a turn
                        start += 1
                    self._skip[cast] = start
                    return self._answers[index]
        return None

    def run_turn(self, request: TurnRequest, reply: TurnReply) -> None:
        self._book.accept(request, reply)
        answer = self._next_answer(request)
        if answer is None:
            item = f", item {request.item_key}" if request.item_key is not None else ""
            self._book.settle(request.turn_id, error_outcome(
                request.turn_id,
                f"scripted agent exhausted: no answer left for socket {request.socket_id}{item}, visit "
                f"{request.visit} ({request.mode}) of cast {request.cast_id}",
                "exhausted",
            ))
            return
        outcome = answer.outcome(request.turn_id)
        if answer.delay_ms == 0:
            self._book.settle(request.turn_id, outcome)
            return
        turn_id = request.turn_id
        timer = call_later(answer.delay_ms / 1000, lambda: self._book.settle(turn_id, outcome),
                           owner="/agent/scripted")
        self._book.set_cancel_hook(request.turn_id, timer.cancel)

    def cancel(self, turn_id: str) -> None:
        self._book.cancel(turn_id)

    def requests(self) -> list[TurnRequest]:
        """The latest :data:`HISTORY_KEPT` requests received, in arrival order (for tests and the demo)."""
        with self._lock:
            return list(self._history)

    def in_flight(self) -> list[str]:
        return self._book.in_flight()

    def close(self) -> None:
        self._book.close()
