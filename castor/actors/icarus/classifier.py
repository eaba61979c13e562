"""ClassifierActor: relevance classification of retrieved context under one deadline.

One per session. It runs the pure fallback matrix
(:func:`castor.domain.icarus.classify.classify_context`) against a
:class:`~castor.ports.classifier.ClassifierPort`.

Guarantees
----------
* **One total deadline** (``classifierTimeoutMs``, carried in the message as
  an absolute ``time.monotonic()`` value so time spent queued counts too)
  covers model discovery and the completion. Each port call runs on a helper
  thread; the actor waits for *result, cancellation or deadline*, whichever
  comes first, so a port that ignores its deadline cannot hold the turn.
  An abandoned port call finishes in the background and is discarded.
* **Cancellation**: the message's :class:`CancelToken` (the turn's abort, or an
  invalidation) wakes the wait at once; the result is ``aborted`` (inject
  nothing).
* **Failure keeps the context**: timeout, provider error, malformed answer,
  missing registry or model all yield the original text with an enumerated
  reason. This actor holds no reference to the Icarus worker, so a
  classifier failure can never touch it.
* Notices (plain fixed text, never context): ``default`` resolving to a remote
  model is announced once per session; an invalid ``classifier`` value is
  reported once per session.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from castor.actors.icarus.messages import Classified, Classify
from castor.domain.icarus.classify import (
    ClassifierChoice,
    ClassifierRequest,
    ClassifierResponse,
    FilterResult,
    classify_context,
)
from castor.domain.icarus.spans import Grammar, SelectionLimits
from castor.messages.errors import Cancelled, Timeout
from castor.ports.classifier import ClassifierPort, ModelEndpoint
from castor.supervision import Actor, CancelToken, handles
from castor.supervision.threads import start_thread

REMOTE_NOTICE = (
    "Icarus context filter: classifier 'default' selected a remote model; "
    "prompts and retrieved memory are sent to that provider and may incur cost."
)
INVALID_NOTICE = (
    "Icarus context filter: the 'classifier' setting is not default, none or provider/model-id; "
    "filtering is off for this session."
)


def run_bounded(fn: Callable[[], Any], deadline: float, cancel: CancelToken | None, *,
                owner: str = "/icarus") -> Any:
    """Run ``fn`` on a helper thread; return its value or raise by ``deadline``/cancellation.

    Raises :class:`Cancelled` if cancelled first, :class:`Timeout` if the
    deadline passes first, else whatever ``fn`` raised.
    """
    if cancel is not None and cancel.cancelled:
        raise Cancelled("classification cancelled")
    if time.monotonic() >= deadline:
        raise Timeout("classifier deadline passed", may_have_started=False)
    done = threading.Event()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter
            box["error"] = exc
        finally:
            done.set()

    start_thread(run, name="classifier-call", owner=owner, purpose="one bounded classifier/session call")
    if cancel is not None:
        cancel.wake(done)
    done.wait(max(0.0, deadline - time.monotonic()))
    if cancel is not None and cancel.cancelled:
        raise Cancelled("classification cancelled")
    if "value" in box:
        return box["value"]
    if "error" in box:
        raise box["error"]
    raise Timeout("classifier deadline passed", may_have_started=True)


class ClassifierActor(Actor):
    def __init__(
        self,
        port: ClassifierPort,
        choice: ClassifierChoice,
        *,
        limits: SelectionLimits | None = None,
        retrievable: dict[str, Grammar] | None = None,
    ) -> None:
        super().__init__()
        self.port = port
        self.choice = choice
        self.limits = limits
        self.retrievable = retrievable
        self._remote_noticed = False
        self._invalid_noticed = False

    @handles(Classify)
    def classify(self, msg: Classify) -> Classified:
        started = time.monotonic()
        cancel = msg.cancel if isinstance(msg.cancel, CancelToken) else None

        def list_models() -> Sequence[ModelEndpoint] | None:
            models: Sequence[ModelEndpoint] | None = run_bounded(lambda: self.port.list_models(msg.deadline),
                                                                 msg.deadline, cancel, owner=self.path)
            return models

        def complete(request: ClassifierRequest) -> ClassifierResponse:
            response: ClassifierResponse = run_bounded(lambda: self.port.complete(request, msg.deadline),
                                                       msg.deadline, cancel, owner=self.path)
            return response

        result: FilterResult | None = classify_context(
            msg.context, msg.prompt, self.choice,
            list_models=list_models, complete=complete, current_model=msg.current_model,
            limits=self.limits, retrievable=self.retrievable,
        )
        duration = int((time.monotonic() - started) * 1000)
        if result is not None:
            self.log.bind(outcome=str(result.outcome), reason=str(result.reason)).debug("context classified")
        return Classified(result=result, duration_ms=duration, notices=self._notices(result))

    def _notices(self, result: FilterResult | None) -> tuple[str, ...]:
        if result is None or result.selection is None:
            return ()
        if result.selection.selection == "invalid" and not self._invalid_noticed:
            self._invalid_noticed = True
            return (INVALID_NOTICE,)
        if result.selection.discloses_remotely and not self._remote_noticed:
            self._remote_noticed = True
            return (REMOTE_NOTICE,)
        return ()
