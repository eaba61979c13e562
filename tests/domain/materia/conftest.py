"""Every engine test here also checks each effect the engine builds without validation
(:func:`castor.domain.materia.cast_messages.built`): it must be the instance validation gives."""

from __future__ import annotations

from typing import Any

import pytest

from castor.domain.materia import engine
from castor.domain.materia.cast_messages import built


def checked_built(cls: type, **values: Any) -> Any:
    fast = built(cls, **values)
    validated = cls(**values)
    assert fast == validated, (cls.__name__, values)
    assert fast.__dict__ == validated.__dict__ and list(fast.__dict__) == list(validated.__dict__)
    assert fast.__pydantic_fields_set__ == validated.__pydantic_fields_set__
    assert cls.__pydantic_serializer__.to_json(fast) == cls.__pydantic_serializer__.to_json(validated)
    return fast

@pytest.fixture(autouse=True)
def _engine_checks_what_it_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "built", checked_built)
