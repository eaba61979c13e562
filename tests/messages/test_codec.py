"""The msgpack codec round-trips every registered wire message and rejects bad input."""

from __future__ import annotations

import importlib
import pkgutil

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import castor
from castor.messages import decode, encode, registered_types
from castor.messages.errors import CastorError, ErrorCode, InvalidMessage
from castor.messages.inspection import ActorSnapshot, MailboxSnapshot

pytestmark = pytest.mark.timeout(120)


def _import_every_castor_module() -> dict[str, str]:
    """Registration happens at import: load all of castor so every message is seen. Returns the
    modules that failed to import (asserted empty below: a module that cannot be imported would
    otherwise silently drop its messages out of the round-trip property)."""
    failed: dict[str, str] = {}
    for info in pkgutil.walk_packages(castor.__path__, "castor.", onerror=lambda name: failed.setdefault(name, "walk")):
        # worker_program is a standalone script the Icarus worker process runs (its own sys.path rules);
        # __main__ modules run the CLI.
        if info.name.endswith("worker_program") or ".__main__" in info.name:
            continue
        try:
            importlib.import_module(info.name)
        except Exception as exc:  # noqa: BLE001 - reported by test_every_castor_module_imports
            failed[info.name] = f"{type(exc).__name__}: {exc}"
    return failed


IMPORT_FAILURES = _import_every_castor_module()
WIRE_TYPES = sorted(registered_types(wire_only=True).items())

finite_floats = st.floats(allow_nan=False, allow_infinity=False, width=64)
st.register_type_strategy(float, finite_floats)
st.register_type_strategy(int, st.integers(min_value=-(2**63), max_value=2**63 - 1))  # msgpack's range


@pytest.mark.parametrize(("type_name", "klass"), WIRE_TYPES, ids=[name for name, _ in WIRE_TYPES])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_every_registered_message_round_trips(type_name, klass, data):
    message = data.draw(st.builds(klass))
    assert decode(encode(message)) == message


def test_every_castor_module_imports():
    assert IMPORT_FAILURES == {}


def test_registry_is_not_empty_and_names_are_stable_strings():
    names = [name for name, _ in WIRE_TYPES]
    assert "inspect.actor" in names and "inspect.mailbox" in names
    assert all(isinstance(name, str) and name for name in names)


def test_unknown_type_is_a_typed_error():
    with pytest.raises(InvalidMessage) as info:
        decode(msgpack.packb(["no.such.type", {}]))
    assert info.value.code == ErrorCode.INVALID_MESSAGE and info.value.data["type"] == "no.such.type"


def test_wrong_fields_are_a_typed_error_naming_the_field_but_not_the_value():
    bad = {"depth": "secret-value", "capacity": None, "oldest_age_s": None, "by_type": {}, "in_flight": None,
           "processed": 0, "failed": 0, "rejected": 0, "dead_letters": 0}
    with pytest.raises(InvalidMessage) as info:
        decode(msgpack.packb(["inspect.mailbox", bad]))
    assert any(err["loc"] == "depth" for err in info.value.data["errors"])
    assert "secret-value" not in repr(info.value.to_wire())


def test_extra_fields_are_rejected():
    snap = MailboxSnapshot(depth=0, capacity=None, oldest_age_s=None, by_type={}, in_flight=None,
                           processed=0, failed=0, rejected=0, dead_letters=0)
    fields = snap.model_dump(mode="json") | {"surprise": 1}
    with pytest.raises(InvalidMessage):
        decode(msgpack.packb(["inspect.mailbox", fields]))


@settings(max_examples=300)
@given(st.binary(max_size=64))
def test_garbage_bytes_never_raise_anything_but_invalid_message(blob):
    try:
        decode(blob)
    except InvalidMessage:
        pass


def test_integers_beyond_msgpack_range_are_a_typed_error():
    snap = MailboxSnapshot(depth=2**70, capacity=None, oldest_age_s=None, by_type={}, in_flight=None,
                           processed=0, failed=0, rejected=0, dead_letters=0)
    with pytest.raises(InvalidMessage):
        encode(snap)


def test_local_messages_are_not_encodable():
    from castor.supervision.supervisor import StopChild

    with pytest.raises(InvalidMessage):
        encode(StopChild(id="x"))


def test_messages_are_immutable():
    snap = ActorSnapshot.model_construct(path="/root")
    with pytest.raises(ValidationError):
        snap.path = "/elsewhere"  # type: ignore[misc]  # the test proves the snapshot is frozen


def test_error_wire_round_trip_keeps_class_and_code():
    from castor.messages.errors import Timeout, WorkerRetired

    for err in (Timeout("late", may_have_started=True), WorkerRetired("gone", data={"reason": "timeout"})):
        back = CastorError.from_wire(err.to_wire())
        assert type(back) is type(err) and back.code == err.code and back.data == err.data
