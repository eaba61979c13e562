"""TEST FAKES (no network, no LLM): a deterministic classifier and a session log.

``FakeClassifier`` satisfies ``castor.ports.classifier.ClassifierPort``.
It reads the candidates from the real request JSON and answers per a script:

* ``reject_words``: a candidate whose text contains one of these words is
  answered ``relevant: false`` with ``confidence`` (default 0.9); others are
  ``relevant: true``.
* ``raw``: answer this exact text instead (prose, garbage, unknown ids...).
* ``raise_exc``: raise this exception from ``complete``.
* ``gate``: a ``threading.Event`` the call waits on until ``deadline``
  (raises ``Timeout`` when the deadline passes first) -- a slow provider.
* ``models``: the registry (``None`` = host without a registry API).
* ``usage``: the usage reported (``None`` = provider reports none).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from castor.messages.errors import Cancelled, Timeout
from castor.ports.classifier import (
    ClassifierRequest,
    ClassifierResponse,
    ClassifierUsage,
    ModelEndpoint,
)

LOCAL = ModelEndpoint(provider="ollama", id="qwen3:4b", base_url="http://127.0.0.1:11434/v1", has_auth=False)
REMOTE = ModelEndpoint(provider="openai", id="gpt-x", base_url="https://api.openai.com/v1", has_auth=True)


@dataclass
class FakeClassifier:
    models: Sequence[ModelEndpoint] | None = field(default_factory=lambda: [LOCAL])
    reject_words: tuple[str, ...] = ()
    confidence: float | None = 0.9
    raw: str | None = None
    raise_exc: BaseException | None = None
    gate: threading.Event | None = None
    cancel: threading.Event | None = None
    usage: ClassifierUsage | None = None
    list_calls: int = 0
    requests: list[ClassifierRequest] = field(default_factory=list)

    def list_models(self, deadline: float | None = None) -> Sequence[ModelEndpoint] | None:
        self.list_calls += 1
        return None if self.models is None else list(self.models)

    def complete(self, request: ClassifierRequest, deadline: float) -> ClassifierResponse:
        self.requests.append(request)
        if self.gate is not None:
            remaining = max(0.0, deadline - time.monotonic())
            if not self.gate.wait(remaining):
                raise Timeout("fake classifier: deadline passed", may_have_started=True)
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled("fake classifier cancelled")
        if self.raise_exc is not None:
            raise self.raise_exc
        if self.raw is not None:
            return ClassifierResponse(text=self.raw, usage=self.usage)
        return ClassifierResponse(text=json.dumps({"decisions": self.decide(request)}), usage=self.usage)

    def decide(self, request: ClassifierRequest) -> list[dict[str, Any]]:
        payload = json.loads(request.messages[-1].content)
        out = []
        for cand in payload["candidates"]:
            relevant = not any(w in cand["text"] for w in self.reject_words)
            d: dict[str, Any] = {"id": cand["id"], "relevant": relevant}
            if self.confidence is not None:
                d["confidence"] = self.confidence
            out.append(d)
        return out

    def sent_texts(self) -> list[str]:
        return [c["text"] for r in self.requests for c in json.loads(r.messages[-1].content)["candidates"]]


@dataclass
class FakeSessionLog:
    """Records appended entries; can be forced to fail (``fail``) or to wait (``gate``)."""

    fail: BaseException | None = None
    gate: threading.Event | None = None
    entries: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    entered: threading.Event = field(default_factory=threading.Event)

    def append_entry(self, custom_type: str, data: dict[str, Any], deadline: float, *,
                     expires: bool = False) -> None:
        self.entered.set()
        if self.gate is not None and not self.gate.wait(max(0.0, deadline - time.monotonic())):
            raise Timeout("fake session log: deadline passed")
        if self.fail is not None:
            raise self.fail
        self.entries.append((custom_type, json.loads(json.dumps(data))))


SAMPLE = (
    "[memory-retrieval-warning]\n"
    "Tell the user the vector store was unreachable.\n\n"
    "[fabric] relevant to your request:\n"
    "  [2026-01-01 10:00] pi-agent: sqlite WAL mode fixed the lock contention\n"
    "  [2026-01-02 11:00] pi-agent: grandma's chocolate cake needs three eggs\n\n"
    "[qdrant] knowledge base:\n"
    "  ### notes: sqlite pragmas (score: 0.61)\n"
    "  journal_mode=WAL and busy_timeout avoid database-locked errors\n"
    "  ### notes: baking (score: 0.40)\n"
    "  the cake frosting recipe uses butter and icing sugar\n\n"
    "[sessions] prior conversations on this topic:\n"
    "  [yesterday] Debugging sqlite: we compared WAL against rollback journals\n\n"
    "[facts] durable facts about the user/environment:\n"
    "  - The user prefers terse answers"
)


class FakeWorker:
    """TEST FAKE of ``WorkerCalls``: records calls in submission order.

    ``results[function]`` is returned (or raised if an exception; called if
    callable). ``gates[function]`` holds that call until set. ``pid`` never
    changes unless ``close`` is called (to assert the classifier never
    touched the worker).
    """

    def __init__(self, results: dict[str, Any] | None = None) -> None:
        self.results = dict(results or {})
        self.gates: dict[str, threading.Event] = {}
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.closed = 0
        self.cancelled: list[str] = []
        self.pid = 4242
        self.entered = threading.Condition()

    def call(self, module, function, args=None, kwargs=None, timeout=None, token=None):
        with self.entered:
            self.calls.append((module, function, dict(kwargs or {})))
            self.entered.notify_all()
        gate = self.gates.get(function)
        if gate is not None and token is not None:
            token.on_cancel(gate.set)  # a cancel ends the held call (as the real worker is killed)
        if gate is not None and not gate.wait(timeout if timeout is not None else 10):
            raise Timeout(f"fake worker: {function} timed out", may_have_started=True)
        if token is not None and token.cancelled:
            self.cancelled.append(function)
            self.pid = None  # the real worker is stopped: the next call gets a fresh one
            raise Cancelled(f"fake worker: {function} cancelled", may_have_started=True)
        value = self.results.get(function)
        if isinstance(value, BaseException):
            raise value
        return value() if callable(value) else value

    def close(self):
        self.closed += 1
        self.pid = None

    def wait_calls(self, n: int, timeout: float = 5.0) -> bool:
        with self.entered:
            return self.entered.wait_for(lambda: len(self.calls) >= n, timeout)

    def functions(self) -> list[str]:
        return [c[1] for c in self.calls]


class FakeUi:
    """TEST FAKE of ``SessionUiPort``: records what the harness would show."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.messages: list[tuple[str, str, bool, bool]] = []
        self.status: list[tuple[str, str | None]] = []
        self.notices: list[tuple[str, str]] = []

    def send_message(self, custom_type, content, *, display, trigger_turn=False):
        self.messages.append((custom_type, content, display, trigger_turn))
        if self.fail:
            raise RuntimeError("ui down")

    def set_status(self, key, text):
        self.status.append((key, text))
        if self.fail:
            raise RuntimeError("ui down")

    def notify(self, message, level="info", *, code=None):
        self.notices.append((message, level))
        if self.fail:
            raise RuntimeError("ui down")
