"""The dispatcher's error table, without sockets (a dummy connection object)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from castor.endpoint.dispatch import Context, Dispatcher, Params
from castor.messages.errors import Conflict, Internal, InvalidParams, UnknownMethod


class Point(Params):
    x: int
    y: int = 0


class Loose(BaseModel):  # registered without extra="forbid"
    name: str


def ctx(d: Dispatcher) -> Context:
    return Context(connection=None, state={}, method="m")  # type: ignore[arg-type]  # no connection: the dispatcher under test never reads it


def test_validated_params_reach_the_handler() -> None:
    d = Dispatcher()
    d.register("sum", lambda p, _c: p.x + p.y, Point)
    assert d.dispatch("sum", {"x": 2, "y": 3}, ctx(d)) == 5


@pytest.mark.parametrize("params, loc, kind", [
    ({"x": "nope"}, "x", "int_parsing"),
    ({}, "x", "missing"),
    ({"x": 1, "z": 2}, "z", "extra_forbidden"),
])
def test_invalid_params_carry_field_details_without_input(params, loc, kind) -> None:
    d = Dispatcher()
    d.register("sum", lambda p, _c: 0, Point)
    with pytest.raises(InvalidParams) as info:
        d.dispatch("sum", params, ctx(d))
    errors = info.value.data["errors"]
    assert {"loc": loc, "type": kind} == {k: errors[0][k] for k in ("loc", "type")}
    assert "nope" not in repr(info.value.to_wire())  # the offending value never echoes back


def test_models_without_forbid_still_reject_extra_fields() -> None:
    d = Dispatcher()
    d.register("hi", lambda p, _c: p.name, Loose)
    assert d.dispatch("hi", {"name": "a"}, ctx(d)) == "a"
    with pytest.raises(InvalidParams):
        d.dispatch("hi", {"name": "a", "extra": 1}, ctx(d))


def test_unknown_method() -> None:
    d = Dispatcher()
    with pytest.raises(UnknownMethod) as info:
        d.dispatch("nope", {}, ctx(d))
    assert info.value.to_wire()["code"] == "unknown_method"


def test_castor_errors_pass_through_and_others_become_internal() -> None:
    d = Dispatcher()

    def conflict(_p, _c):
        raise Conflict("busy", data={"cast_id": "c"})

    d.register("conflict", conflict)
    d.register("crash", lambda _p, _c: {}["missing"])
    with pytest.raises(Conflict):
        d.dispatch("conflict", {}, ctx(d))
    with pytest.raises(Internal) as info:
        d.dispatch("crash", {}, ctx(d))
    wire = info.value.to_wire()
    assert wire["code"] == "internal" and "missing" not in wire["message"] and "error_id" in wire["data"]


def test_model_results_are_dumped() -> None:
    d = Dispatcher()
    d.register("pt", lambda _p, _c: Point(x=1))
    assert d.dispatch("pt", {}, ctx(d)) == {"x": 1, "y": 0}


def test_hello_lists_methods_and_capabilities() -> None:
    d = Dispatcher(capabilities={"casts"})
    d.register("cast.start", lambda _p, _c: None)
    c = ctx(d)
    hello = d.dispatch("runtime.hello", {"client": "pi", "client_version": "1"}, c)
    assert hello["methods"] == ["cast.start", "runtime.hello"]
    assert hello["capabilities"] == ["casts"] and hello["protocol"] == 1 and hello["version"]
    assert c.state["hello"]["client"] == "pi"


def test_duplicate_registration_is_refused() -> None:
    d = Dispatcher()
    with pytest.raises(ValueError):
        d.register("runtime.hello", lambda _p, _c: None)


@pytest.mark.timeout(10)
def test_an_icarus_backend_s_error_text_reaches_the_caller_but_never_castor_s_log():
    """A backend's error may quote what the model searched for (an FTS syntax error names the
    query): it was logged at ERROR with its traceback. The caller gets the text; the log gets the
    kind, the reason and the error id."""
    from loguru import logger

    from castor.domain.icarus.worker_protocol import IcarusCallError

    def tool(_params, _ctx):
        raise IcarusCallError('fts5: syntax error near "SECRET-QUERY my pin is 1234"',
                              data={"reason": "backend_error", "target": "tools.fabric_search"})

    d = Dispatcher()
    d.register("icarus.tool", tool)
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="DEBUG", format="{message} {extra}\n{exception}")
    try:
        with pytest.raises(IcarusCallError) as raised:
            d.dispatch("icarus.tool", {}, ctx(d))
    finally:
        logger.remove(sink)
    assert "SECRET-QUERY" in raised.value.to_wire()["message"]
    log = "".join(lines)
    assert "SECRET-QUERY" not in log and raised.value.data["error_id"] in log and "backend_error" in log


@pytest.mark.parametrize("method, shown", [("\u202eevil", "\\u202eevil"), ("a\nb", "a\\nb"), ("é✓", "é✓"),
                                           ("x" * 300, "x" * 200 + "... (300 characters)")])
def test_an_unknown_method_is_named_escaped_once_in_the_message_as_in_its_data(client, method, shown) -> None:
    """The message quoted repr() of the already escaped name: ``unknown method '\\\\u202eevil'``,
    every escape's backslash doubled, unlike ``data.method`` beside it."""
    from castor.messages.errors import CastorError

    with pytest.raises(CastorError) as refused:
        client.call(method, {})
    assert refused.value.code == "unknown_method"
    assert refused.value.data["method"] == shown
    assert refused.value.message == f"unknown method '{shown}'"
