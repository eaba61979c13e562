"""``castor soak --backend ray``: the cluster it runs on and the faults it adds.

Without ``--ray-address`` the soak starts a cluster of its own on this machine
(``ray.cluster_utils.Cluster``: a head and two worker nodes, 1 CPU each), so it can also remove a
node. Its faults then include, beside the usual ones (now injected *inside* a cast
host's runtime: casts, visits, utility slots and commands):

| fault | what happens |
|---|---|
| ``kill_host`` | a cast host's process is SIGKILLed; its sessions are re-placed and their orphaned casts recast |
| ``kill_node`` | a worker node is removed, one that runs a host if any (every host and task on it dies); one worker node is always kept |

On its own cluster a command's lease (``command_lease_s``) is ``SOAK_COMMAND_LEASE_S``, 5 s: a lost
host's casts run no command for the lease and a margin after it was taken for lost (its commands
may still run until then), and with the default 15 s the soak's six casts spent most of its time
waiting out the leases of its host kills. Every node is this machine, so the GCS answers fast.

A cluster fault waits until the cluster has recovered from the last one: every lost host's
sessions re-placed and their casts recast, ``CLUSTER_FAULT_SPACING_S`` before; until then the
injector adds an in-host fault instead. Without that pacing a loaded machine (hosts take seconds to
come up) lost hosts faster than it replaced them, and no cast got far enough to end.

The Icarus worker stays in the serving process, with its faults as before.
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import random
import time
from typing import Any

from castor.scaleout.options import SOAK_RAY_HOSTS

CLUSTER_FAULTS: tuple[tuple[str, int], ...] = (("kill_host", 2), ("kill_node", 1), ("in_host", 12))
CLUSTER_FAULT_SPACING_S = 2.0
SOAK_COMMAND_LEASE_S = 5.0  # on the soak's own cluster (see the module doc)


def _lost_hosts(backend: Any) -> int:
    return sum(1 for h in list(backend.hosts.values()) if not h.alive)


class ClusterPacing:
    """When the next cluster fault may come (see the module doc)."""

    def __init__(self) -> None:
        self.expect_lost = 0  # hosts the faults so far must have cost, once the backend has noticed
        self.last_fault_at = float("-inf")

    def settled(self, backend: Any, now: float) -> bool:
        """Every host the faults killed is noticed lost and recovered from, the last recovery
        ``CLUSTER_FAULT_SPACING_S`` ago (a kill the backend never notices stops blocking after 30 s)."""
        lost = _lost_hosts(backend)
        recoveries = list(backend.recoveries)
        if (lost < self.expect_lost and now - self.last_fault_at < 30.0) or len(recoveries) < lost:
            return False
        return not recoveries or now - max(r["finished_at"] for r in recoveries) >= CLUSTER_FAULT_SPACING_S

    def fault(self, backend: Any, hosts_killed: int, now: float) -> None:
        self.expect_lost = _lost_hosts(backend) + hosts_killed
        self.last_fault_at = now


#: Cast hosts a soak starts unless ``--ray-hosts`` says (see ``SOAK_RAY_HOSTS``).
SOAK_HOSTS = SOAK_RAY_HOSTS


def start_cluster_backend(address: str | None, hosts: int | None = None) -> tuple[Any, Any]:
    """The soak's cluster (None when ``address`` names a running one) and its Ray backend, with
    ``hosts`` cast hosts (default :data:`SOAK_HOSTS`). Before, ``castor soak --ray-hosts N`` was
    accepted and ignored: the soak always started 2."""
    from castor.scaleout.ray_backend import RayBackend, RayBackendSettings
    from castor.scaleout.utility_tasks import COMMAND_LEASE_S

    cluster = None
    lease_s = COMMAND_LEASE_S
    if address is not None:  # a wrong address is one line in seconds, as for castor cast and serve
        from castor.scaleout.options import check_reachable

        check_reachable(address)
    else:
        from ray.cluster_utils import Cluster

        from castor.scaleout.ray_backend import keep_ray_logging_off_stderr, ray_init_output_to_log

        keep_ray_logging_off_stderr()
        with ray_init_output_to_log():  # what Ray prints as its nodes start: castor's log, as for ray.init
            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 80 << 20})
            for _ in range(2):
                cluster.add_node(num_cpus=1, object_store_memory=80 << 20)
            cluster.wait_for_nodes()
        address = cluster.address
        lease_s = SOAK_COMMAND_LEASE_S
    # RayBackend connects (a cluster that refuses this process is a typed error there)
    return cluster, RayBackend(RayBackendSettings(address=address, hosts=hosts or SOAK_HOSTS, command_lease_s=lease_s))


def stop_cluster_backend(cluster: Any, backend: Any) -> None:
    import ray

    backend.shutdown()
    ray.shutdown()
    if cluster is not None:
        cluster.shutdown()


def inject_on_cluster(soak: Any, rng: random.Random, kind: str, family: str, pick: float,
                      delay_s: Any) -> str | None:
    """One fault of a Ray soak (see the module doc); None when it found no target."""
    from castor.testing.faults import inject_into

    backend = soak.scaleout
    kinds, weights = zip(*CLUSTER_FAULTS, strict=True)
    where = rng.choices(kinds, weights)[0]
    pacing: ClusterPacing = soak.cluster_pacing
    if not pacing.settled(backend, time.monotonic()):
        where = "in_host"  # the last cluster fault is still being recovered from
    elif soak.faults["kill_host"] == 0:
        where = "kill_host"  # every Ray soak has at least one of each cluster fault, first
    elif soak.faults["kill_node"] == 0 and soak.cluster is not None:
        where = "kill_node"
    if family == "worker":  # the Icarus worker lives in the serving process
        return inject_into(soak.runtime.system.registry, kind, family, pick, delay_s)
    live = [h for h in backend.live_hosts() if h.sessions]
    if not live:
        return None
    if where == "kill_host":
        host = live[int(pick * len(live)) % len(live)]
        pacing.fault(backend, 1, time.monotonic())
        backend.kill_host(host.host_id)
        return "kill_host"
    if where == "kill_node":
        cluster = soak.cluster
        if cluster is None or not cluster.worker_nodes:
            return None
        if len(cluster.worker_nodes) < 2:
            return None  # keep a worker node: nodes cannot be added from this thread (Ray wants the main one)
        busy = {h.node_id for h in live}
        node = next((n for n in cluster.worker_nodes if n.unique_id in busy), next(iter(cluster.worker_nodes)))
        pacing.fault(backend, sum(1 for h in live if h.node_id == node.unique_id), time.monotonic())
        cluster.remove_node(node)
        return "kill_node"
    host = live[int(pick * len(live)) % len(live)]
    try:
        import ray

        injected = ray.get(host.actor.inject.remote(inject_into, kind, family, pick, delay_s()), timeout=10)
    except Exception:  # noqa: BLE001 - the host died meanwhile: no fault injected
        return None
    return f"host_{injected}" if injected else None
