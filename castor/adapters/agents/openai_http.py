"""An AgentPort over an OpenAI-compatible ``/v1/chat/completions`` endpoint.

Standard library only (``http.client``), non-streaming, one HTTP request per
turn on a small thread pool. The hidden prompt is sent as one user message;
``request.model`` (or the adapter's default model) names the model. Turns are
text-only: the tool scope is not offered to the endpoint (there is no local
tool loop), and ``thinking`` is sent as ``reasoning_effort`` only when
``send_reasoning_effort=True`` (many compatible servers reject unknown keys).

Guarantees
----------
- **Deadline per call** (``deadline_s``): a watchdog shuts the socket down
  when it passes, so a server that accepts and then stalls cannot hold a turn
  longer than the deadline (plus scheduling noise). Outcome kind ``timeout``.
- **Error mapping** (``error.kind``, ``error.message``, ``error.payload``):

  | what happened                                        | kind               | message (what the classifier reads)                     |
  |------------------------------------------------------|--------------------|---------------------------------------------------------|
  | HTTP >= 400, or a 200 body with an ``error`` object  | ``provider``       | ``...HTTP <status>: error: <provider error JSON>``      |
  | connection dropped after the request was sent        | ``transport``      | ``...: stream ended without finish_reason``              |
  | could not connect at all                             | ``transport``      | ``cannot connect to <endpoint>: <reason>``               |
  | deadline passed                                      | ``timeout``        | ``chat completion deadline of <s>s exceeded``            |
  | 200 with a body that is not a chat completion        | ``invalid_response``| ``...invalid response...``                              |
  | ``cancel(turn_id)``                                  | ``cancelled``      | ``agent turn cancelled``                                  |

  The provider's error body is kept untouched in ``error.payload`` (and
  embedded in the message), so a ``context_length_exceeded`` or tool error
  is never masked as a transport blip.
- ``reply`` exactly once, off the caller's stack (see ``AgentPort``).
- The API key (argument, else ``OPENAI_API_KEY``) is only sent as a bearer
  header; it is never logged or put in an outcome.
- Response bodies over 16 MiB are refused (``invalid_response``).
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from castor._log import logger
from castor.adapters.agents._turns import TurnBook, error_outcome
from castor.domain.materia.budget import (
    MAX_FIGURE,
    cost_figure,
    figure_sum,
    non_negative_number,
    plain_usage,
    unreadable_usage,
)
from castor.messages.errors import InvalidParams
from castor.ports.agent import TurnOutcome, TurnReply, TurnRequest, TurnUsage
from castor.supervision.timers import call_later

__all__ = ["OpenAIChatAgent", "chat_completions_url"]

MAX_BODY_BYTES = 16 * 1024 * 1024
_STOP_REASONS = {"stop": "stop", "length": "length", "tool_calls": "toolUse", "function_call": "toolUse"}


def chat_completions_url(base_url: str) -> str:
    """``http://h:p`` → ``http://h:p/v1/chat/completions``; ``.../v1`` → ``.../v1/chat/completions``."""
    url = base_url.rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidParams(f"not an http(s) base URL: {base_url!r}", data={"reason": "bad_base_url"})
    if url.endswith("/chat/completions"):
        return url
    return url + ("/chat/completions" if url.endswith("/v1") else "/v1/chat/completions")


class _Call:
    """One in-flight HTTP exchange, interruptible from other threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sock: socket.socket | None = None
        self.reason: str | None = None  # "deadline" | "cancelled" once interrupted

    def attach(self, sock: socket.socket | None) -> None:
        with self.lock:
            self.sock = sock
            if self.reason is not None:
                self._shutdown()

    def interrupt(self, reason: str) -> None:
        with self.lock:
            if self.reason is None:
                self.reason = reason
            self._shutdown()

    def _shutdown(self) -> None:
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _usage(raw: Any) -> TurnUsage:
    """The server's ``usage`` as TurnUsage. Telemetry: a figure that is not a finite, non-negative
    number (NaN, a string, -1) counts as not reported -- it failed the turn that had answered.
    ``raw`` keeps the map as plain JSON for the engine's alias-aware reading (which counts 12.5
    tokens as written), with OpenAI's nested ``prompt_tokens_details.cached_tokens`` (else DeepSeek's
    ``prompt_cache_hit_tokens``) lifted to the top level as ``cached_tokens`` (the engine reads them
    there; nested or under DeepSeek's name, the cached tokens were lost), and
    a ``cost`` the server states (OpenRouter's ``usage.cost``: what it charged) marked as the
    provider's billed figure, as Pi marks one (``cost.totalFromProvider``): the report's
    ``costEstimated`` stays false for such turns. No ``usage`` at all (a local server, a proxy
    that strips it) is an empty usage, never None: the turn is recorded as reporting no tokens
    (``unreported``) and the cast says so, as for a usage that counts none."""
    if raw is None:  # no usage sent: the turn reports none, which the engine records and names
        return TurnUsage()
    if not isinstance(raw, dict):  # a usage that is no map counts nothing and is named, as the harness link's
        return TurnUsage(raw=unreadable_usage("usage", plain_usage(raw)))
    raw_details = raw.get("prompt_tokens_details")
    details = raw_details if isinstance(raw_details, dict) else {}

    def tokens(value: Any) -> int | None:
        number = non_negative_number(value)
        return int(number) if number is not None else None

    cached = tokens(details.get("cached_tokens"))
    if cached is None:  # DeepSeek's own name for them (inside prompt_tokens too, as OpenAI's)
        cached = tokens(raw.get(DEEPSEEK_CACHE_HITS))
    plain = plain_usage(raw)
    if cached is not None and "cached_tokens" not in plain:
        plain["cached_tokens"] = cached
        prompt, completion = tokens(raw.get("prompt_tokens")), tokens(raw.get("completion_tokens"))
        if tokens(raw.get("total_tokens")) is None and prompt is not None and completion is not None:
            # OpenAI's prompt_tokens already hold the cached ones: a total summed from the parts
            # (input + output + cacheRead) would count them twice
            plain["total_tokens"] = prompt + completion
    fee = cost_figure(raw.get("cost"))  # a decimal string ("0.25") too, as some proxies send it
    charged = _with_upstream_share(raw, fee)
    if charged is not None:
        # a cost past what castor counts keeps the figure given, so the turn names it "(counted as
        # 10^18)"; replaced by the cap, it counted as the cap without a word
        given = fee is not None and fee >= MAX_FIGURE
        plain["cost"] = {"total": plain["cost"] if given else charged, "totalFromProvider": True}
    return TurnUsage(
        input_tokens=tokens(raw.get("prompt_tokens")),
        output_tokens=tokens(raw.get("completion_tokens")),
        cache_read_tokens=cached,
        total_tokens=tokens(raw.get("total_tokens")),
        cost_usd=charged,
        raw=plain,
    )


#: DeepSeek's count of the prompt tokens its cache served (``prompt_cache_hit_tokens``, beside
#: ``prompt_cache_miss_tokens``; both inside ``prompt_tokens``), where OpenAI nests ``cached_tokens``.
DEEPSEEK_CACHE_HITS = "prompt_cache_hit_tokens"
#: OpenRouter's flag for a turn run on a provider key of the user's own (BYOK), and where it says
#: what that provider charged the key: its ``usage.cost`` is then only OpenRouter's fee.
BYOK_FLAG, UPSTREAM_COST = "is_byok", ("cost_details", "upstream_inference_cost")


def _with_upstream_share(raw: dict[str, Any], charged: float | None) -> float | None:
    """What a turn cost in all: ``charged`` (``usage.cost``) plus, on OpenRouter with the user's own
    provider key (``is_byok: true``), the upstream provider's charge to that key
    (``cost_details.upstream_inference_cost``, a cost figure: a decimal string too), billed apart
    from OpenRouter's fee; ``charged`` as it is otherwise (OpenRouter's own key: its cost is the
    whole charge, whatever ``cost_details`` says), or when no upstream figure is readable."""
    if raw.get(BYOK_FLAG) is not True:
        return charged
    details = raw.get(UPSTREAM_COST[0])
    upstream = cost_figure(details.get(UPSTREAM_COST[1])) if isinstance(details, dict) else None
    if upstream is None:
        return charged
    return figure_sum(charged or 0, upstream)


def _json_int(text: str) -> int | float:
    """A JSON integer literal; one past Python's digit limit for ``int()`` (4,300 unless configured) as the
    largest float, its sign kept -- far past the cap castor counts a usage figure at, so it counts as
    that cap and is named as past it: json's own reading refused the whole answer for it."""
    limit = sys.get_int_max_str_digits()  # 0: no limit (PYTHONINTMAXSTRDIGITS may set another)
    if not limit or len(text.lstrip("-")) <= limit:
        return int(text)
    # the largest float, not the cap itself: a figure at the cap is no figure past it, and the turn
    # named nothing while it counted 10^18 (it is named "...=1.7976931348623157e+308 (counted as 10^18)")
    return -sys.float_info.max if text.startswith("-") else sys.float_info.max

# One decoder for every answer (a decoder made per answer is a reference cycle).
_DECODER = json.JSONDecoder(parse_int=_json_int)

#: How deep an answer's JSON is read when the whole of it is nested past what Python's reader takes.
MAX_ANSWER_DEPTH = 64
#: What stands for a value cut at :data:`MAX_ANSWER_DEPTH` (a string: a figure cut so reads as not a number).
CUT_TOO_DEEP = f"(nested deeper than {MAX_ANSWER_DEPTH} levels: not read)"
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[{]+|[\]}]+')  # a string, or a run of openings or closings


def _cut_too_deep(text: str) -> str:
    """``text`` (JSON that Python's reader refused for its nesting, ``RecursionError``) with every
    array or object deeper than :data:`MAX_ANSWER_DEPTH` levels replaced by :data:`CUT_TOO_DEEP`:
    an answer whose ``usage`` (or any other field) nests past a thousand levels is still read, and
    what was cut reads as an unreadable value where it is used (a usage figure: named, not counted).
    Text that is no JSON stays none (the reader refuses it as before). Runs of brackets are taken
    whole: 16 MiB of them take a fraction of a second."""
    out: list[str] = []
    kept = depth = 0
    cut_from = -1  # where the value being cut opened, while one is
    for token in _JSON_TOKENS.finditer(text):
        mark = token.group()
        if mark[0] == '"':
            continue
        if mark[0] in "[{":
            if cut_from < 0 and depth + len(mark) > MAX_ANSWER_DEPTH:
                cut_from = token.start() + max(0, MAX_ANSWER_DEPTH - depth)  # the bracket one level too deep
            depth += len(mark)
        else:
            if cut_from >= 0 and depth - len(mark) <= MAX_ANSWER_DEPTH:
                out += (text[kept:cut_from], json.dumps(CUT_TOO_DEEP))
                kept, cut_from = token.start() + depth - MAX_ANSWER_DEPTH, -1  # the closing back at the limit
            depth -= len(mark)
    out.append(text[kept:])
    return "".join(out)


def _read_body(response: http.client.HTTPResponse) -> bytes:
    """Read at most MAX_BODY_BYTES + 1 bytes; a body shorter than its Content-Length is a drop.

    ``read(amt)`` returns short data instead of raising when the peer closes
    early, so the declared length is checked by hand.
    """
    declared = response.getheader("Content-Length")
    chunks: list[bytes] = []
    size = 0
    while size <= MAX_BODY_BYTES:
        chunk = response.read(min(64 * 1024, MAX_BODY_BYTES + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if declared is not None and declared.isascii() and declared.isdigit() and size < int(declared) \
            and size <= MAX_BODY_BYTES:
        raise http.client.IncompleteRead(b"".join(chunks), int(declared) - size)
    return b"".join(chunks)


def _content_text(message: Any) -> str | None:
    if not isinstance(message, dict):
        return None
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return None


class OpenAIChatAgent:
    """AgentPort for an OpenAI-compatible chat completions endpoint."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        deadline_s: float = 300.0,
        max_concurrent: int = 4,
        send_reasoning_effort: bool = False,
    ) -> None:
        self.url = chat_completions_url(base_url)
        parts = urlsplit(self.url)
        # What failure texts call this agent: the endpoint's address, never a credential in the URL.
        self.agent_label = f"openai HTTP agent ({parts.hostname}{f':{parts.port}' if parts.port else ''})"
        self.model = model
        self._api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.deadline_s = deadline_s
        self.send_reasoning_effort = send_reasoning_effort
        self._book = TurnBook("openai", max_workers=2)
        self._pool = ThreadPoolExecutor(max_workers=max_concurrent, thread_name_prefix="openai-turn")
        self._calls: dict[str, _Call] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAIChatAgent(url={self.url!r}, model={self.model!r})"

    # -- AgentPort -----------------------------------------------------------

    def run_turn(self, request: TurnRequest, reply: TurnReply) -> None:
        model = request.model or self.model
        if not model:
            raise InvalidParams("no model: give TurnRequest.model or the adapter's default model",
                                data={"reason": "no_model"})
        self._book.accept(request, reply)
        call = _Call()
        with self._lock:
            self._calls[request.turn_id] = call
        self._book.set_cancel_hook(request.turn_id, lambda: call.interrupt("cancelled"))
        self._pool.submit(self._run, request, model, call)

    def cancel(self, turn_id: str) -> None:
        self._book.cancel(turn_id)

    def in_flight(self) -> list[str]:
        """The turns this agent runs now (a standalone caller tells a running turn from none)."""
        return self._book.in_flight()

    def close(self) -> None:
        self._book.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- one call ------------------------------------------------------------

    def _body(self, request: TurnRequest, model: str) -> bytes:
        body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": request.prompt}],
                                "stream": False}
        if self.send_reasoning_effort and request.thinking not in (None, "off"):
            body["reasoning_effort"] = {"minimal": "minimal", "xhigh": "high"}.get(request.thinking, request.thinking)
        return json.dumps(body, ensure_ascii=False).encode("utf-8")

    def _run(self, request: TurnRequest, model: str, call: _Call) -> None:
        log = logger.bind(turn_id=request.turn_id, cast_id=request.cast_id, socket_id=request.socket_id)
        watchdog = call_later(self.deadline_s, lambda: call.interrupt("deadline"), owner="/agent/openai")
        try:
            outcome = self._exchange(request, model, call)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an outcome
            log.exception("openai-compatible turn crashed")
            outcome = error_outcome(request.turn_id, f"internal adapter error: {exc.__class__.__name__}", "internal")
        finally:
            watchdog.cancel()
            with self._lock:
                self._calls.pop(request.turn_id, None)
        self._book.settle(request.turn_id, outcome)  # no-op if cancelled first

    def _deadline_outcome(self, turn_id: str) -> TurnOutcome:
        # Worded to avoid "timed out after N", which the classifier reads as a tool timeout.
        return error_outcome(turn_id, f"chat completion deadline of {self.deadline_s:g}s exceeded", "timeout")

    def _connection(self) -> http.client.HTTPConnection:
        parts = urlsplit(self.url)
        if not parts.hostname:
            raise ValueError(f"no host in the endpoint URL {self.url!r}")
        klass = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        # The watchdog enforces the deadline; the socket timeout is only a backstop.
        return klass(parts.hostname, parts.port, timeout=self.deadline_s + 1.0)

    def _exchange(self, request: TurnRequest, model: str, call: _Call) -> TurnOutcome:
        turn_id = request.turn_id
        conn = self._connection()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        started = time.monotonic()
        try:
            try:
                conn.connect()
            except TimeoutError:
                return self._deadline_outcome(turn_id)
            except OSError as exc:
                return error_outcome(turn_id, f"cannot connect to {self.url}: {exc.strerror or exc}", "transport")
            call.attach(conn.sock)
            try:
                conn.request("POST", urlsplit(self.url).path, body=self._body(request, model), headers=headers)
                response = conn.getresponse()
                raw = _read_body(response)
            except (http.client.HTTPException, OSError) as exc:
                elapsed = time.monotonic() - started
                if isinstance(exc, TimeoutError) or call.reason == "deadline" or elapsed >= self.deadline_s:
                    return self._deadline_outcome(turn_id)
                return error_outcome(
                    turn_id,
                    f"OpenAI-compatible connection dropped after {elapsed:.1f}s ({exc.__class__.__name__}): "
                    "stream ended without finish_reason",
                    "transport",
                )
            return self._interpret(turn_id, response.status, raw)
        finally:
            conn.close()

    @staticmethod
    def _decode_cut(text: str) -> Any:
        """An answer nested too deep for Python's reader, read with its deepest values cut
        (:func:`_cut_too_deep`); None if it is no JSON even so."""
        try:
            return _DECODER.decode(_cut_too_deep(text))
        except (ValueError, RecursionError):
            return None

    def _interpret(self, turn_id: str, status: int, raw: bytes) -> TurnOutcome:
        if len(raw) > MAX_BODY_BYTES:
            return error_outcome(turn_id, "invalid response: body larger than 16 MiB", "invalid_response",
                                 status=status)
        text = raw.decode("utf-8", errors="replace")
        try:
            body: Any = _DECODER.decode(text)
        except RecursionError:  # nested past what Python reads: read with the deepest values cut
            body = self._decode_cut(text)
        except ValueError:  # not JSON: the raw text is reported
            body = None
        provider_error = body.get("error") if isinstance(body, dict) else None
        if status >= 400 or provider_error is not None:
            payload = body if body is not None else text[:4096]
            shown = json.dumps(provider_error if provider_error is not None else payload, ensure_ascii=False)
            return error_outcome(
                turn_id, f"OpenAI-compatible endpoint returned HTTP {status}: error: {shown[:4000]}", "provider",
                payload=payload, status=status,
            )
        choices = body.get("choices") if isinstance(body, dict) else None
        first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
        content = _content_text(first.get("message")) if first else None
        if content is None:
            return error_outcome(turn_id, "invalid response: not a chat completion", "invalid_response",
                                 payload=text[:4096], status=status)
        assert first is not None  # no first choice means no content, answered above
        finish = first.get("finish_reason")
        return TurnOutcome(
            turn_id=turn_id,
            text=content,
            stop_reason=_STOP_REASONS.get(finish, finish) if isinstance(finish, str) else None,
            usage=_usage(body.get("usage")),
            model=body.get("model") if isinstance(body.get("model"), str) else None,
        )
