"""Build a pydantic model the hot path has just computed, without validating it again.

``unchecked(Model, **fields)`` returns the instance ``Model(**fields)`` would: the same field
values in declaration order, the same set of given fields, no extras, no private state. It skips
the validation, which costs several microseconds a model and, for the cast engine's outputs
(files, events, the next turn, the pending record), is on every transition.

What it guarantees, and what it does not:

* **Only for values that already have their field types.** Nothing is converted or checked: a
  list where the model says tuple stays a list, a wrong type goes through. It is for a caller
  that builds the values itself (the engine's effects); anything from outside -- a message, a
  file, a harness's payload -- is validated as ever.
* **Equal to the validated model.** A suite-wide test hook (:data:`CHECK`, set by the tests'
  conftest) validates every instance this builds and fails the test on any difference, so
  every effect the test suite makes is pinned to what pydantic would have made.
* **Top-level containers are not copied.** Validation copies a ``dict`` or ``list`` field's top
  level; this keeps the object given. Callers pass containers they made for the model.
* **Models with a ``default_factory`` or validators are refused** (``TypeError`` at the first
  use): their defaults or checks would be skipped. A required field left out is a ``TypeError``
  too (unknown names are not looked for: the test hook catches them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

M = TypeVar("M", bound=BaseModel)

#: Called as ``CHECK(cls, fields, instance)`` after each build when set (the test suite sets it).
CHECK: Callable[[type[BaseModel], dict[str, Any], BaseModel], None] | None = None

_MISSING = object()
_DEFAULTS: dict[type[BaseModel], tuple[dict[str, Any], frozenset[str]]] = {}
_new = object.__new__
_set = object.__setattr__


def _defaults(cls: type[BaseModel]) -> tuple[dict[str, Any], frozenset[str]]:
    """Every field of ``cls`` in declaration order with its default (``_MISSING`` if required),
    and the names of the required ones."""
    decorators = cls.__pydantic_decorators__
    if (decorators.field_validators or decorators.model_validators or decorators.validators
            or decorators.root_validators):
        raise TypeError(f"{cls.__name__} has validators: build it with {cls.__name__}(...)")
    table: dict[str, Any] = {}
    for name, info in cls.model_fields.items():
        if info.default_factory is not None:
            raise TypeError(f"{cls.__name__}.{name} has a default_factory: build it with {cls.__name__}(...)")
        table[name] = _MISSING if info.default is PydanticUndefined else info.default
    entry = _DEFAULTS[cls] = (table, frozenset(name for name, value in table.items() if value is _MISSING))
    return entry


def unchecked(cls: type[M], /, **fields: Any) -> M:
    """``cls(**fields)`` without the validation; see the module docstring for when that is right."""
    defaults, required = _DEFAULTS.get(cls) or _defaults(cls)
    if not fields.keys() >= required:
        raise TypeError(f"{cls.__name__} needs {sorted(required - fields.keys())}")
    values = {**defaults, **fields}
    instance = _new(cls)
    _set(instance, "__dict__", values)
    _set(instance, "__pydantic_fields_set__", set(fields))
    _set(instance, "__pydantic_extra__", None)
    _set(instance, "__pydantic_private__", None)
    if CHECK is not None:
        CHECK(cls, fields, instance)
    return instance
