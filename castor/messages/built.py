"""An instance of a pydantic model built from values castor made itself, without validation.

Validation (and pydantic's ``model_construct``) costs microseconds per object and would only check
and copy what castor has just built with the field types: on a hot path (a cast's effects, a worker
call, a hook's messages) :func:`built` sets the instance state validation would set instead.

Guarantees: the instance equals the validated one -- the same field values (each field's default
where none is given), the same set of given fields, still frozen where the model is. Not done:
any check of the values, and any copy (a ``dict`` or ``list`` field keeps the object it is given:
the caller hands over a container of its own). Never for anything read from outside (a frame, a
file, a peer's params): those are validated. Every model built this way has a test that compares
its built instances with validated ones.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

_M = TypeVar("_M", bound=BaseModel)
_NEW = object.__new__
# The instance slots pydantic keeps beside ``__dict__``, set through their descriptors (no lookup
# by name on every object).
_SET_DICT = BaseModel.__dict__["__dict__"].__set__
_SET_FIELDS_SET = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_SET_EXTRA = BaseModel.__dict__["__pydantic_extra__"].__set__
_SET_PRIVATE = BaseModel.__dict__["__pydantic_private__"].__set__
_DEFAULTS: dict[type, dict[str, Any]] = {}
# A frozen model's sets of given fields, one per set of given names and shared by its instances:
# a set of a dozen names is ~0.7-2 KiB, kept by every live effect, turn and pending visit. Nothing
# adds to it: a frozen instance refuses assignment, and ``model_copy`` copies the set before adding
# an update's names. A few per class (a new one past the bound gets a set of its own); None: the
# class is not frozen, each instance gets its own set.
_FIELDS_SETS: dict[type, list[set[str]] | None] = {}
_FIELDS_SETS_KEPT = 16


def built(cls: type[_M], **values: Any) -> _M:
    """``cls(**values)`` without validation (see the module's guarantees). ``cls`` must have no
    ``default_factory`` field (a factory's value would be shared) and no private attributes."""
    defaults = _DEFAULTS.get(cls)
    if defaults is None:
        # before the defaults: another thread that finds them finds this too
        _FIELDS_SETS[cls] = [] if cls.model_config.get("frozen") else None
        defaults = _DEFAULTS[cls] = _defaults_of(cls)
    obj = _NEW(cls)
    _SET_DICT(obj, {**defaults, **values})
    shared = _FIELDS_SETS[cls]
    if shared is None:
        _SET_FIELDS_SET(obj, set(values))
    else:
        keys = values.keys()
        for given in shared:
            if keys == given:
                break
        else:
            given = set(values)
            if len(shared) < _FIELDS_SETS_KEPT:
                shared.append(given)
        _SET_FIELDS_SET(obj, given)
    _SET_EXTRA(obj, None)
    _SET_PRIVATE(obj, None)
    return obj


def _defaults_of(cls: type[BaseModel]) -> dict[str, Any]:
    """Every field's default in declaration order (a required field's place is kept by the value
    :func:`built` is given for it)."""
    if cls.__private_attributes__:
        raise TypeError(f"{cls.__name__} has private attributes: build it by validation")
    defaults: dict[str, Any] = {}
    for name, info in cls.model_fields.items():
        if info.default_factory is not None:
            raise TypeError(f"{cls.__name__}.{name} has a default_factory: build it by validation")
        defaults[name] = info.default
    return defaults


# The instance state pydantic's validation sets, stored through the model's own slot descriptors:
# for hot paths that build a message castor made itself field by field (``built`` for one class,
# spelled out: ``castor.actors.icarus.worker``'s ``WorkerCall``, ``messages``' ``Feedback``).
NEW = object.__new__
SET_DICT = BaseModel.__dict__["__dict__"].__set__
SET_FIELDS_SET = BaseModel.__dict__["__pydantic_fields_set__"].__set__
SET_EXTRA = BaseModel.__dict__["__pydantic_extra__"].__set__
SET_PRIVATE = BaseModel.__dict__["__pydantic_private__"].__set__
