"""Standalone ClassifierPort over an OpenAI-compatible chat endpoint (stdlib urllib).

``POST {base_url}/chat/completions`` with ``{model, messages, temperature,
max_tokens, stream: false}``; ``GET {base_url}/models`` for discovery unless a
fixed model list is given.

Guarantees and failure behaviour
--------------------------------
* Deadlines are absolute ``time.monotonic()`` values. The socket timeout is the
  remaining budget and the body is read in chunks, re-checking the deadline,
  so one call cannot outlive it by more than one socket operation; the
  ClassifierActor additionally enforces the total budget itself.
* A passed deadline raises :class:`Timeout`; HTTP errors, unreachable hosts
  and unusable bodies raise :class:`Internal` whose message carries only the
  HTTP status or the exception type -- never the provider's body text.
* Responses are capped at ``max_body_bytes`` (1 MiB default).
* Usage maps ``prompt_tokens``/``completion_tokens``/``total_tokens`` and
  ``prompt_tokens_details.cached_tokens``; absent usage is ``None``; absent
  fields are ``None`` (unknown), never zero. ``cost`` is always unknown here.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from castor.messages.errors import Internal, InvalidParams, Timeout
from castor.ports.classifier import (
    ClassifierRequest,
    ClassifierResponse,
    ClassifierUsage,
    ModelEndpoint,
)


class HttpClassifier:
    def __init__(
        self,
        base_url: str,
        *,
        provider: str = "openai-compatible",
        api_key: str | None = None,
        models: Sequence[str] | None = None,
        max_body_bytes: int = 1 << 20,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise InvalidParams("classifier base URL must be http(s)", data={"reason": "bad_scheme"})
        self.base_url = base_url.rstrip("/")
        self.provider = provider
        self._api_key = api_key
        self._models = None if models is None else list(models)
        self._max_body = max_body_bytes

    # -- ClassifierPort

    def list_models(self, deadline: float | None = None) -> Sequence[ModelEndpoint] | None:
        ids = self._models
        if ids is None:
            doc = self._request("GET", "/models", None, deadline if deadline is not None else time.monotonic() + 5)
            data = doc.get("data") if isinstance(doc, dict) else None
            if not isinstance(data, list):
                raise Internal("classifier endpoint: unusable model list")
            ids = [d["id"] for d in data if isinstance(d, dict) and isinstance(d.get("id"), str)]
        return [self._endpoint(i) for i in ids]

    def complete(self, request: ClassifierRequest, deadline: float) -> ClassifierResponse:
        body = {
            "model": request.model,
            "messages": [m.model_dump() for m in request.messages],
            "temperature": request.temperature,
            "max_tokens": request.max_tokens,
            "stream": False,
        }
        doc = self._request("POST", "/chat/completions", body, deadline)
        try:
            text = doc["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise Internal("classifier endpoint: no message content") from exc
        if not isinstance(text, str):
            raise Internal("classifier endpoint: no message content")
        return ClassifierResponse(text=text, usage=parse_usage(doc.get("usage")))

    # -- internals

    def _endpoint(self, model_id: str) -> ModelEndpoint:
        return ModelEndpoint(provider=self.provider, id=model_id, base_url=self.base_url,
                             has_auth=self._api_key is not None)

    def _request(self, method: str, path: str, body: Any, deadline: float) -> Any:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Timeout("classifier: deadline passed before the request", may_have_started=False)
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=remaining) as resp:  # noqa: S310 - http(s) only
                raw = self._read(resp, deadline)
        except urllib.error.HTTPError as exc:
            raise Internal(f"classifier endpoint: HTTP {exc.code}", data={"status": exc.code}) from None
        except (TimeoutError, socket.timeout):
            raise Timeout("classifier: deadline passed", may_have_started=True) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, (TimeoutError, socket.timeout)):
                raise Timeout("classifier: deadline passed", may_have_started=True) from None
            raise Internal(f"classifier endpoint unreachable ({type(exc.reason).__name__})") from None
        except OSError as exc:
            raise Internal(f"classifier endpoint I/O error ({type(exc).__name__})") from None
        try:
            return json.loads(raw)
        except ValueError:
            raise Internal("classifier endpoint: body is not JSON") from None

    def _read(self, resp: Any, deadline: float) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            if time.monotonic() >= deadline:
                raise Timeout("classifier: deadline passed while reading", may_have_started=True)
            chunk = resp.read(65536)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > self._max_body:
                raise Internal("classifier endpoint: body too large")
            chunks.append(chunk)


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def parse_usage(usage: Any) -> ClassifierUsage | None:
    """OpenAI usage -> ClassifierUsage; ``None`` when the provider reported none."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return ClassifierUsage(
        input=_int_or_none(usage.get("prompt_tokens")),
        output=_int_or_none(usage.get("completion_tokens")),
        cache_read=_int_or_none(cached),
        cache_write=None,
        total_tokens=_int_or_none(usage.get("total_tokens")),
        cost=None,
    )
