"""``ops.hosts`` (``castor inspect hosts``) while a host's node is cut off from the cluster (no Ray needed)."""

from __future__ import annotations

import io
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(60)


class _Cluster:
    """Ray's ``wait``/``get`` over pings that answer at once or never (a host on a cut-off node)."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers

    def wait(self, refs: list[str], num_returns: int, timeout: float) -> tuple[list[str], list[str]]:
        ready = [r for r in refs if self.answers[r] is not None]
        if len(ready) < num_returns:
            threading.Event().wait(timeout)
        return ready, [r for r in refs if r not in ready]

    def get(self, ref: str, timeout: float) -> Any:
        if self.answers[ref] is None:
            threading.Event().wait(timeout)
            raise TimeoutError(ref)
        return self.answers[ref]


def test_hosts_on_cut_off_nodes_are_asked_at_once_and_shown_as_not_answering() -> None:
    """Two hosts whose node is cut off (not declared dead yet: still taken for alive) and one that
    answers. Each was asked in turn, 5 s apiece, so ``ops.hosts`` took 10 s here (with three
    cut-off hosts, longer than the endpoint's 15 s deadline: ``castor inspect hosts`` timed out),
    and ``castor inspect hosts`` showed a cut-off host alive with no casts. All are asked at once
    now, with one deadline, and a host that does not answer is said to."""
    pytest.importorskip("ray")
    from castor.console.terminal import hosts_table, terminal_console
    from castor.scaleout.ray_backend import HostRef, RayBackend

    backend = RayBackend.__new__(RayBackend)
    backend._ray = _Cluster({"a": {"casts": ["/root/session/s0/cast/c1"]}, "b": None, "c": None})
    backend.hosts = {name: HostRef(f"host-{name}", SimpleNamespace(ping=SimpleNamespace(remote=lambda n=name: n)),
                                   node_id=f"node-{name}", sessions={f"s-{name}"}) for name in "abc"}
    backend.hosts["d"] = HostRef("host-d", None, node_id="node-d", alive=False)  # lost: not asked
    started = time.monotonic()
    rows = {row["host_id"]: row for row in backend.hosts_view()}
    took = time.monotonic() - started
    assert took < 8.0, took  # one 5 s deadline for all, not 5 s per host
    assert rows["host-a"]["casts"] == ["/root/session/s0/cast/c1"] and "error" not in rows["host-a"]
    for name in ("host-b", "host-c"):
        assert rows[name]["alive"] is True and "cut off" in rows[name]["error"], rows[name]
    assert rows["host-d"]["alive"] is False and "error" not in rows["host-d"]
    out = io.StringIO()
    terminal_console(out).print(hosts_table({"backend": "ray", "hosts": list(rows.values())}))
    lines = {line.split("│")[1].strip(): line for line in out.getvalue().splitlines() if "host-" in line}
    assert "not answering" in lines["host-b"] and "not answering" not in lines["host-a"], out.getvalue()
    assert " yes " in lines["host-a"] and " no " in lines["host-d"], out.getvalue()
