"""``/metrics`` of a real ``castor serve``: a gauge by kind keeps its series when the last actor of
the kind is gone (a cast that ended: its CastActor and SocketActor stop), at 0, as the counters by
kind do -- a series that vanishes leaves a dashboard's line with a gap, and an alert on it reads
"no data" rather than "0"."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from castor.client import Client
from tests.support.served import metrics_reader, served_env, start_a_cast_awaiting_its_turn, start_serve
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(90)



def _env(tmp_path: Path) -> dict[str, str]:
    return served_env(tmp_path)


def _sample(text: str, series: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_gauges_by_kind_stay_at_0_once_the_last_actor_of_the_kind_is_gone(tmp_path):
    env = _env(tmp_path)
    served = start_serve(tmp_path, env, "--console", "127.0.0.1:0")
    server, sock, log, project = served.process, served.socket, served.log, served.project
    try:
        metrics = metrics_reader(log)

        with Client.connect_unix(str(sock)) as client:
            cast_id = start_a_cast_awaiting_its_turn(client, project)
            live = metrics()
            assert _sample(live, 'castor_actors{kind="CastActor",state="running"}') == 1
            assert _sample(live, 'castor_mailbox_depth{kind="SocketActor"}') == 0
            client.call("cast.abort", {"session_id": "s1", "cwd": str(project), "cast_id": cast_id}, timeout=20)
            wait_for(lambda: 'kind="CastActor",state="running"} 1' not in metrics(), 30, "the cast's actor gone")
            ended = metrics()
        for kind in ("CastActor", "SocketActor"):
            assert _sample(ended, f'castor_actors{{kind="{kind}",state="running"}}') == 0, ended
            assert _sample(ended, f'castor_mailbox_depth{{kind="{kind}"}}') == 0
            assert _sample(ended, f'castor_mailbox_oldest_age_seconds{{kind="{kind}"}}') == 0
            assert _sample(ended, f'castor_actor_restarts{{kind="{kind}"}}') == 0
            assert _sample(ended, f'castor_starts_total{{kind="{kind}"}}') == 1  # the counters kept theirs
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
