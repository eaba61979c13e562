"""``_set_fields``: an event's or entry's unset (None) fields are left out, and data without any is
handed back as it is (its fast path tells None by identity, as the exact test does)."""

from __future__ import annotations

from castor.domain.materia.engine import _set_fields


class _EqualToNone:
    """A value that compares equal to None without being None."""

    def __eq__(self, other: object) -> bool:
        return other is None

    __hash__ = object.__hash__


def test_only_none_itself_is_left_out_and_data_without_it_comes_back_as_it_is() -> None:
    plain = {"socket": "Socket-1", "visit": 1, "materiaModel": {"model": None}}
    assert _set_fields(plain) is plain
    odd = {"value": _EqualToNone()}
    assert _set_fields(odd) is odd  # equal to None is not None: kept
    assert _set_fields({"socket": "Socket-1", "materia": None, "entryId": None}) == {"socket": "Socket-1"}
    kept = {"code": None, "signal": None}
    assert _set_fields(kept, frozenset({"code", "signal"})) is kept
    assert _set_fields({"code": None, "other": None}, frozenset({"code"})) == {"code": None}
