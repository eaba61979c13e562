"""The one safe-id rule (castor.messages.ids) and each of its users: actor path segments
(session ids among them), cast ids and socket ids answer the same ids the same way."""

from __future__ import annotations

import pytest

from castor.adapters.materia.artifacts import validate_cast_id, validate_socket_id
from castor.messages.errors import ErrorCode, Forbidden
from castor.messages.ids import MAX_ID_LENGTH, SAFE_ID_PATTERN, check_safe_id, is_safe_id
from castor.runtime import Runtime, SessionInfo
from castor.supervision.registry import check_segment, child_path

SAFE = ["a", "s1", "Socket-1", "2026-05-12T19-40-40-605Z", "pi-2.3_x", "A" * MAX_ID_LENGTH, "0"]
UNSAFE = ["", ".", "..", ".hidden", "-rf", "_x", "a/b", "../x", "/etc", "a\\b", "C:\\evil", "a:b",
          "x\x00y", "a\nb", "abc\n", " spaced", "~root", "ｘ", "é", "A" * (MAX_ID_LENGTH + 1)]

USERS = {
    "segment": check_segment,
    "cast_id": validate_cast_id,
    "socket_id": validate_socket_id,
    "id": check_safe_id,
}


@pytest.mark.parametrize("value", SAFE)
def test_a_safe_id_is_returned_unchanged_by_every_user(value):
    assert is_safe_id(value)
    for check in USERS.values():
        assert check(value) == value
    assert child_path("/root", value) == f"/root/{value}"


@pytest.mark.parametrize("value", UNSAFE)
def test_an_unsafe_id_is_forbidden_by_every_user_with_one_code_and_reason(value):
    assert not is_safe_id(value)
    for field, check in USERS.items():
        with pytest.raises(Forbidden) as caught:
            check(value)
        error = caught.value
        assert error.code == ErrorCode.FORBIDDEN
        assert error.data["reason"] == f"invalid {field}"
        assert len(error.data[field]) <= 80 and "\n" not in error.data[field] and "\x00" not in error.data[field]


@pytest.mark.parametrize("value", [None, 7, b"bytes", ["a"]])
def test_a_non_string_is_forbidden_without_echoing_it(value):
    assert not is_safe_id(value)
    for field, check in USERS.items():
        with pytest.raises(Forbidden) as caught:
            check(value)
        assert caught.value.data == {"reason": f"invalid {field}"}


def test_the_pattern_is_the_rule_the_functions_apply():
    import re

    for value in SAFE + UNSAFE:
        assert (re.fullmatch(SAFE_ID_PATTERN, value) is not None) == is_safe_id(value), value


def test_a_session_id_outside_the_rule_is_refused_by_the_runtime_before_anything_opens(tmp_path):
    runtime = Runtime(components=[])
    try:
        for sid in ("../../etc", "a:b", ".hidden", "x" * 200):
            with pytest.raises(Forbidden) as caught:
                runtime.open_session(SessionInfo(session_id=sid, cwd=str(tmp_path)), None)  # type: ignore[arg-type]  # refused before the link is used
            assert caught.value.data["reason"] == "invalid session_id"
    finally:
        runtime.shutdown(10)
