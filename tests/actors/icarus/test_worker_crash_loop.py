"""An Icarus package whose worker dies in every call, met as a harness and an operator meet it:
a real msgpack-rpc server and client on loopback, the TEST FAKE package
``tests/support/icarus_packages/dies_in_every_call`` (``os._exit(3)`` in every hook and tool, until
a marker file says it is fixed) in real worker subprocesses, ``ops.worker``, ``/metrics`` and the log.

Before: each call spawned a fresh process that died (``workers_started`` grew without bound,
``restarts`` stayed 0) and every call logged warnings. Now the worker is given up after the
limit: calls fail at once, typed, nothing started; one warning; it recovers after the cool-down.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from castor.client import Client
from castor.messages.errors import CastorError
from tests.support.icarus import serve_icarus_on_loopback
from tests.support.waiting import wait_for

DYING = Path(__file__).resolve().parents[2] / "support" / "icarus_packages" / "dies_in_every_call" / "icarus"
TOKEN = "t" * 32
COOL_DOWN_S = 1.5


@pytest.fixture
def served(world):
    """A runtime whose sessions' workers are given up after 3 deaths in a minute, for 1.5 s,
    served on loopback; yields (world, client, runtime, healthy marker)."""
    from castor.composition import icarus_component
    from castor.runtime import Runtime, RuntimeSettings

    healthy = world.tmp / "healthy"
    world.env["ICARUS_FAKE_HEALTHY"] = str(healthy)
    world.write_global(icarusDir=str(DYING), classifier="none")
    runtime = Runtime(RuntimeSettings(icarus_worker_max_deaths=3, icarus_worker_death_window_s=60.0,
                                      icarus_worker_cool_down_s=COOL_DOWN_S),
                      components=[icarus_component(env=world.env, home=str(world.tmp))])
    world.runtimes.append(runtime)
    server = serve_icarus_on_loopback(runtime, TOKEN)
    client = Client.connect_tcp(*server.address, default_timeout=20, token=TOKEN)
    client.on_request("session.append_entry", lambda _p: {"ok": True, "entry_id": "e"})
    client.call("session.open", {"session_id": "s1", "cwd": str(world.project), "trusted": False})
    try:
        yield world, client, runtime, healthy
    finally:
        client.close()
        server.stop()


def _tool(client: Client) -> Any:
    return client.call("icarus.tool", {"session_id": "s1", "name": "fabric_search", "params": {"query": "q"}})


def _error(client: Client) -> CastorError:
    with pytest.raises(CastorError) as caught:
        _tool(client)
    return caught.value


def _worker(client: Client) -> dict[str, Any]:
    return client.call("ops.worker", {"session_id": "s1"})["worker"]


@pytest.mark.timeout(60)
def test_a_worker_that_dies_in_every_call_is_given_up_refused_at_once_said_once_and_recovers(served):
    from loguru import logger

    from castor.console.metrics import metrics_text

    world, client, runtime, healthy = served
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING")
    try:
        for _ in range(3):  # three deaths, each its call's own typed error
            assert _error(client).code == "worker_crashed"
        for _ in range(4):  # given up: refused at once, typed, nothing started
            started = time.monotonic()
            refused = _error(client)
            assert time.monotonic() - started < 1.0
            assert refused.code == "worker_retired" and refused.data["reason"] == "crash_loop"
            assert refused.data["may_have_started"] is False and refused.data["target"] == "tools.fabric_search"
            assert 0 < refused.data["retry_in_s"] <= COOL_DOWN_S and refused.data["last_death"] == "exit code 3"
        # a hook is refused the same way, and the harness still gets its answer (ambient)
        assert client.call("harness.event", {"session_id": "s1", "event": "before_agent_start",
                                             "data": {"prompt": "hello", "message_type": "user"}}) == {}
        stats = _worker(client)
        assert stats["workers_started"] == 3
        loop = stats["crash_loop"]
        assert (loop["state"], loop["give_ups"], loop["refused"]) == ("given_up", 1, 5)
        assert "given up" in loop["text"] and "crash_loop" in loop["text"]
        activity = stats["actor"]["activity"]
        assert activity["kind"] == "given_up" and 0 < activity["deadline_in_s"] <= COOL_DOWN_S
        text = metrics_text(runtime).decode()
        assert "castor_worker_give_ups_total 1.0" in text and "castor_worker_calls_refused_total 5.0" in text
        said = [w for w in warnings if "given up" in w]
        assert len(said) == 2, warnings  # the give-up itself, and the retirement it ended
        assert not [w for w in warnings if "hook_failed" in w and warnings.index(w) > warnings.index(said[-1])]

        # after the cool-down one call probes a fresh worker; it dies too: given up again at once
        wait_for(lambda: _worker(client)["crash_loop"]["state"] == "probing", COOL_DOWN_S + 10, "the cool-down")
        assert _error(client).code == "worker_crashed"
        assert _error(client).data["reason"] == "crash_loop"
        assert _worker(client)["crash_loop"]["give_ups"] == 2 and _worker(client)["workers_started"] == 4

        # the package is fixed: the next probe answers and the record is cleared
        healthy.touch()
        wait_for(lambda: _worker(client)["crash_loop"]["state"] == "probing", COOL_DOWN_S + 10, "the cool-down")
        assert _tool(client) == {"results": []}
        assert _tool(client) == {"results": []}
        stats = _worker(client)
        assert stats["workers_started"] == 5
        assert (stats["crash_loop"]["state"], stats["crash_loop"]["deaths_in_window"]) == ("ok", 0)
    finally:
        logger.remove(sink)


@pytest.mark.timeout(60)
def test_calls_queued_behind_a_dying_worker_each_get_an_answer(served):
    """Eight calls at once (the connection's handler threads) while each worker dies: every one
    is answered, typed -- the call that ran, those its retirement rejected, those refused once
    the worker is given up -- none stranded, and no more than the limit of workers started."""
    world, client, _runtime, _healthy = served
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(_error, client) for _ in range(8)]
        codes = [future.result(timeout=30).code for future in futures]
    assert set(codes) <= {"worker_crashed", "worker_retired"} and codes.count("worker_crashed") >= 1
    assert _worker(client)["workers_started"] <= 3
