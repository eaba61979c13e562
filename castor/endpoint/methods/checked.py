"""A hot method's params checked in its handler, not by a params model at dispatch.

``icarus.tool`` and ``harness.event`` run on every Fabric tool call and every harness hook, and
validating their params model cost about 14k instructions a request (pydantic's ``model_validate``:
its wrapper, then building a model instance from the params) -- as much as a tenth of a tool
call's server side. These methods are registered without a model; the handler takes the params
the way the model would accept them in their commonest form (a map of exactly the model's field
types: a ``str`` as a ``str``, a map with ``str`` keys, ``None`` where the field takes it, no key
the model does not know, each constraint checked), and sends anything else through the model
(:func:`validated`), whose errors are the dispatcher's: ``invalid_params`` with the same message
and field details (``castor.endpoint.dispatch.Dispatcher.dispatch``). So every request is answered
as before; only the commonest one skips building the model.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from castor.endpoint.dispatch import MAX_ERROR_DETAILS, validation_details
from castor.messages.errors import InvalidParams

M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], method: str, params: Any) -> M:
    """``params`` validated by ``model``, failing as the dispatcher fails a request's params
    (``invalid_params``, the field details without the input; a ``RecursionError`` is left to
    the dispatcher's handler failure, which answers it ``invalid_params`` as its own check does)."""
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        details = validation_details(exc)
        raise InvalidParams(f"invalid params for {method}", data={
            "method": method, "errors": details[:MAX_ERROR_DETAILS], "error_count": len(details)}) from None


def str_keyed(value: Any) -> bool:
    """Whether ``value`` is a ``dict`` whose keys are all ``str`` (what ``dict[str, Any]`` takes as it is)."""
    if type(value) is not dict:
        return False
    for key in value:
        if type(key) is not str:
            return False
    return True


__all__ = ["str_keyed", "validated"]
