"""The Ray soak's cluster faults wait for the cluster's recovery from the last one: on a loaded
machine hosts were killed faster than they came back, and casts never got far enough to end."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from castor.testing.soak_on_ray import CLUSTER_FAULT_SPACING_S, ClusterPacing


def _backend(alive: list[bool], recovered_at: list[float]) -> SimpleNamespace:
    hosts = {f"host-{n}": SimpleNamespace(alive=a) for n, a in enumerate(alive, 1)}
    return SimpleNamespace(hosts=hosts, recoveries=[{"finished_at": t} for t in recovered_at])


@pytest.mark.timeout(10)
def test_a_cluster_fault_waits_until_the_last_one_is_noticed_recovered_and_some_seconds_old() -> None:
    pacing = ClusterPacing()
    now = 100.0
    assert pacing.settled(_backend([True, True], []), now)  # nothing happened yet
    pacing.fault(_backend([True, True], []), 1, now)  # kill one host
    # Not noticed yet (both still look alive): not settled, though no recovery is missing.
    assert not pacing.settled(_backend([True, True], []), now + 1)
    # Noticed, being recovered from:
    assert not pacing.settled(_backend([False, True, True], []), now + 2)
    # Recovered, but just now:
    assert not pacing.settled(_backend([False, True, True], [now + 3]), now + 3)
    assert pacing.settled(_backend([False, True, True], [now + 3]), now + 3 + CLUSTER_FAULT_SPACING_S)
    # A node removal that took two hosts: both must be noticed and recovered from.
    backend = _backend([False, True, True], [now + 3])
    pacing.fault(backend, 2, now + 10)
    assert not pacing.settled(_backend([False, False, True, True], [now + 3, now + 11]), now + 20)
    assert not pacing.settled(_backend([False, False, False, True, True], [now + 3, now + 11]), now + 20)
    assert pacing.settled(_backend([False, False, False, True, True], [now + 3, now + 11, now + 12]), now + 20)


@pytest.mark.timeout(10)
def test_a_kill_the_backend_never_notices_stops_holding_faults_back_after_a_while() -> None:
    pacing = ClusterPacing()
    pacing.fault(_backend([True], []), 1, 0.0)
    assert not pacing.settled(_backend([True], []), 29.0)
    assert pacing.settled(_backend([True], []), 31.0)
