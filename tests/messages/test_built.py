"""castor.messages.built: instances equal to validated ones, and what they share."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict

from castor.messages.built import built

pytestmark = pytest.mark.timeout(30)


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)

    a: int
    b: str = "b"
    c: list[int] | None = None


class Open(BaseModel):
    a: int
    b: str = "b"


def test_frozen_instances_share_their_set_of_given_fields_and_stay_equal_to_validated_ones():
    first, second = built(Frozen, a=1, c=[1]), built(Frozen, a=2, c=[2])
    assert first == Frozen(a=1, c=[1]) and second == Frozen(a=2, c=[2])
    assert first.model_fields_set == Frozen(a=1, c=[1]).model_fields_set == {"a", "c"}
    # one set for both (a live cast keeps many such messages), not a copy each
    assert first.__pydantic_fields_set__ is second.__pydantic_fields_set__
    assert built(Frozen, a=3).model_fields_set == {"a"}
    # a copy with an update has its own set: the shared one is never added to
    copied = first.model_copy(update={"b": "x"})
    assert copied.model_fields_set == {"a", "b", "c"}
    assert first.model_fields_set == second.model_fields_set == {"a", "c"}
    assert first.model_dump(exclude_unset=True) == {"a": 1, "c": [1]}


def test_a_model_that_can_be_assigned_to_gets_a_set_of_its_own():
    first, second = built(Open, a=1), built(Open, a=2)
    assert first.__pydantic_fields_set__ is not second.__pydantic_fields_set__
    first.b = "x"
    assert first.model_fields_set == {"a", "b"} and second.model_fields_set == {"a"}
