"""ClassifierPort: run a relevance-classifier model the host knows about.

Implemented by the harness link (``classifier.complete`` / ``model.list``
requests to the harness) and, standalone, by
:class:`castor.adapters.classifier_http.HttpClassifier`.

Deadlines are absolute ``time.monotonic()`` values. Contract for implementers:

* ``list_models`` returns ``None`` when the host has no model registry API
  (the filter then keeps the context unchanged, reason ``no_registry``).
  Each model carries its endpoint base URL so locality can be judged from the
  hostname alone.
* ``complete`` runs one non-streaming completion and returns its text and the
  provider's usage (``usage=None`` when the provider reported none; unknown
  fields are ``None``, never zero).
* Both raise :class:`castor.messages.errors.Timeout` when the deadline passes
  and :class:`castor.messages.errors.Cancelled` when cancelled; any other
  exception is a provider error. Exception text never reaches an audit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from castor.domain.icarus.classify import (
    ChatMessage,
    ClassifierRequest,
    ClassifierResponse,
    ClassifierUsage,
    ModelEndpoint,
)

__all__ = [
    "ChatMessage",
    "ClassifierPort",
    "ClassifierRequest",
    "ClassifierResponse",
    "ClassifierUsage",
    "ModelEndpoint",
]


@runtime_checkable
class ClassifierPort(Protocol):
    def list_models(self, deadline: float | None = None) -> Sequence[ModelEndpoint] | None:
        """Models the host can run, in registry order; ``None`` if there is no registry."""
        ...

    def complete(self, request: ClassifierRequest, deadline: float) -> ClassifierResponse:
        """One completion, finished before ``deadline`` or raising ``Timeout``."""
        ...
