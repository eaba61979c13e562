"""WorkerCalls: the narrow view of the Icarus worker the hook controller needs.

``IcarusWorkerActor`` (or a handle-backed client of it) satisfies this
protocol; tests use a fake. The hook controller submits calls one at a time,
in order, from one lane (see :mod:`castor.actors.icarus.hook_controller`).

Contract for implementers:

* :meth:`call` sends ``{module, function, args, kwargs}`` to the persistent
  worker and returns the (JSON-normalised) result. It raises
  :class:`~castor.messages.errors.Timeout` when ``timeout`` seconds pass (the
  worker is then retired), :class:`~castor.messages.errors.WorkerRetired` /
  :class:`~castor.messages.errors.WorkerCrashed` when the worker is gone, and
  a :class:`~castor.messages.errors.CastorError` when the backend function
  raised. It never replays a call.
* :meth:`close` kills the worker process (if any) and rejects what is
  pending. It is idempotent; a later :meth:`call` may spawn a fresh worker.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from castor.supervision import CancelToken


@runtime_checkable
class WorkerCalls(Protocol):
    def call(
        self,
        module: str,
        function: str,
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
        token: CancelToken | None = None,
    ) -> Any:
        """One worker call, finished or failed within ``timeout`` seconds; ``token`` cancels it
        (a running call fails ``cancelled`` and its worker is stopped)."""
        ...

    def close(self) -> None:
        """Close the worker; safe to call more than once."""
        ...
