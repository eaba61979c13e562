"""``castor_hello_refusals_total``: the refused tokens ``/metrics`` counts.

Another local user guessing the token left, at the default log level, one warning every 10 s
counting the rest, and nothing on ``/metrics``: no alert could fire on it. Each refused
``runtime.hello`` now counts, on every endpoint of the process.
"""

from __future__ import annotations

import pytest

from castor.client import Client
from castor.console.metrics import metrics_text
from castor.endpoint import Dispatcher, Server
from castor.messages.errors import Unauthenticated
from castor.runtime import Runtime, RuntimeSettings

pytestmark = pytest.mark.timeout(60)


def _refusals(runtime: Runtime) -> float:
    for line in metrics_text(runtime).decode().splitlines():
        if line.startswith("castor_hello_refusals_total "):
            return float(line.split()[1])
    raise AssertionError("castor_hello_refusals_total is not served")


def test_each_refused_hello_counts_on_metrics_and_a_good_one_does_not():
    runtime = Runtime(RuntimeSettings())
    server = Server(Dispatcher(), tcp=("127.0.0.1", 0), token="t" * 32).start()
    try:
        host, port = server.address  # type: ignore[misc]
        before = _refusals(runtime)
        for wrong in ("x" * 32, "t" * 31 + "?"):
            with pytest.raises(Unauthenticated):
                Client.connect_tcp(host, port, token=wrong, default_timeout=10)
        with Client.connect_tcp(host, port, token="t" * 32, default_timeout=10) as good:
            good.call("runtime.hello", {})
        assert _refusals(runtime) == before + 2
    finally:
        server.stop()
        runtime.shutdown(10)
