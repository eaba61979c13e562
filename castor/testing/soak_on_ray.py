"""``castor soak --backend ray``: the cluster it runs on and the faults it adds.

Without ``--ray-address`` the soak starts a cluster of its own on this machine
(``ray.cluster_utils.Cluster``: a head and two worker nodes, 1 CPU each), so it can also remove a
node. Its faults then include, beside the usual ones (now injected *inside* a cast
host's runtime: casts, visits, utility slots and commands):

| fault | what happens |
|---|---|
| ``kill_host`` | a cast host's process is SIGKILLed; its sessions are re-placed and their orphaned casts recast |
| ``kill_node`` | a worker node is removed, one that runs a host if any (every host and task on it dies); one worker node is always kept |

The Icarus worker stays in the serving process, with its faults as before.
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import random
from typing import Any

CLUSTER_FAULTS: tuple[tuple[str, int], ...] = (("kill_host", 2), ("kill_node", 1), ("in_host", 12))


def start_cluster_backend(address: str | None) -> tuple[Any, Any]:
    import ray

    from castor.scaleout.ray_backend import RAY_NAMESPACE, RayBackend, RayBackendSettings

    cluster = None
    if address is None:
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 80 << 20})
        for _ in range(2):
            cluster.add_node(num_cpus=1, object_store_memory=80 << 20)
        cluster.wait_for_nodes()
        address = cluster.address
    ray.init(address=address, namespace=RAY_NAMESPACE, log_to_driver=False, configure_logging=False)
    return cluster, RayBackend(RayBackendSettings(address=address, hosts=2))


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
    if soak.faults["kill_host"] == 0:
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
        cluster.remove_node(node)
        return "kill_node"
    host = live[int(pick * len(live)) % len(live)]
    try:
        import ray

        injected = ray.get(host.actor.inject.remote(inject_into, kind, family, pick, delay_s()), timeout=10)
    except Exception:  # noqa: BLE001 - the host died meanwhile: no fault injected
        return None
    return f"host_{injected}" if injected else None
