"""Casts on a multi-node Ray cluster (``ray.cluster_utils.Cluster``) inside a private network namespace.

Each test runs one scenario of ray_scenarios.py in its own namespace and cluster (2 nodes, 1 CPU
each), 4 sessions with a cast each: agent turn → utility command (1 CPU, on whichever node Ray
picks) → agent turn.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .netns import require_ray, scenario

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def _ray_here() -> None:
    require_ray()


def _all_complete(result: dict) -> None:
    assert result["status"] and set(result["status"].values()) == {"complete"}, result


@pytest.fixture(scope="module")
def two_hosts_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One run of the two-host scenario for two tests (a cluster's start is ~15 s of the suite): its
    four casts run as the plain scenario's do, and the intruding host's recast, refused, starts no
    visit, so every completion check below holds in it as in a run without the intruder."""
    require_ray()
    return scenario("two_hosts", tmp_path_factory.mktemp("two_hosts"))


def test_casts_complete_across_nodes_with_their_utility_commands(two_hosts_run: dict) -> None:
    result = two_hosts_run
    _all_complete(result)
    assert result["visits"] == 4 and result["duplicate_visits"] == 0, result
    placed = {h["host_id"]: len(h["sessions"]) for h in result["hosts_before"]}
    assert sorted(placed.values()) == [2, 2], placed  # sessions spread over both hosts
    assert len({h["node_id"] for h in result["hosts_before"]}) == 2, result  # one host per node
    assert all(node != "?" for node in result["nodes_used"]), result  # commands ran as cluster tasks


def test_a_killed_host_s_casts_continue_on_another_host(tmp_path: Path) -> None:
    result = scenario("kill_host", tmp_path)
    _all_complete(result)
    assert result["duplicate_visits"] == 0, result  # no command ran twice for one visit id
    assert [r["host_id"] for r in result["recoveries"]] == [result["killed"]], result
    assert result["recoveries"][0]["sessions"] == 2, result
    lost = next(h for h in result["hosts_after"] if h["host_id"] == result["killed"])
    assert lost["alive"] is False and lost["sessions"] == [], result


def test_a_removed_node_s_casts_continue_on_a_live_node(tmp_path: Path) -> None:
    result = scenario("remove_node", tmp_path)
    _all_complete(result)
    assert result["duplicate_visits"] == 0, result
    assert len(result["recoveries"]) >= 1, result


def test_a_host_cut_off_from_its_cluster_ends_itself_and_its_casts_complete_elsewhere(tmp_path: Path) -> None:
    """The raylet of a host's node stopped (a partition, as the cluster sees it), the host's process
    alive: taken for lost, it kept running and holding its casts' leases, so the recovery found
    nothing orphaned and a cast never ended (``error:timeout`` here). Not drained any more, the
    host now ends itself (after ``fence_after_s``: 8 s here) and the recovery, waiting for the
    leases, recasts them."""
    result = scenario("stop_raylet", tmp_path)
    _all_complete(result)
    assert result["duplicate_visits"] == 0, result
    assert [r["host_id"] for r in result["recoveries"]] == [result["killed"]], result
    assert result["recoveries"][0]["recast"] >= 1, result
    assert result["host_alive_at_end"] is False, result


def test_two_hosts_never_both_advance_one_cast(two_hosts_run: dict) -> None:
    result = two_hosts_run
    _all_complete(result)
    assert result["duplicate_visits"] == 0, result
    intruder = result["intruder"]
    assert intruder.get("code") == "conflict", intruder
    assert intruder.get("data", {}).get("reason") in ("held_elsewhere", "running"), intruder


@pytest.mark.timeout(420)
def test_soak_over_ray_with_host_and_node_kills_reports_every_must_be_zero_figure_as_zero(tmp_path: Path) -> None:
    """The soak ends when its six casts have (about 20 s here); ``--seconds`` only bounds the time
    it may take to start them all, which a loaded machine stretches (each host kill costs seconds)."""
    import json
    import sys

    from .netns import run_in_netns

    proc = run_in_netns([sys.executable, "-m", "castor", "soak", "--backend", "ray", "--sessions", "2", "--casts", "3",
                         "--seconds", "150", "--json", "--workdir", str(tmp_path / "soak")], timeout_s=400)
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    # What to read when it fails: the figures, not pytest's cut-down repr of the whole report.
    brief = {k: report.get(k) for k in ("must_be_zero", "faults", "casts_started", "casts_completed", "casts_failed",
                                        "casts_aborted", "casts_failed_before_recast", "casts_resumed_by_recast",
                                        "elapsed_s", "notes")}
    brief_text = json.dumps(brief, indent=1) if report else proc.stderr[-4000:]
    assert proc.returncode == 0, brief_text
    assert all(v == 0 for v in report["must_be_zero"].values()), report["must_be_zero"]
    assert report["faults"].get("kill_host", 0) >= 1 and report["faults"].get("kill_node", 0) >= 1, report["faults"]
    assert report["casts_started"] == 6 and report["casts_completed"] == 6, brief_text
    assert report["utility_executions"] > 0, report


@pytest.fixture(scope="module")
def lease_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One run of the lease_to_stopped_node scenario (its cluster's start is ~15 s of the suite) for two tests."""
    require_ray()
    return scenario("lease_to_stopped_node", tmp_path_factory.mktemp("lease"))


def test_a_command_whose_lease_went_to_a_stopped_node_comes_back_as_lost_work(lease_run: dict) -> None:
    """Ray never answers a lease request sent to a node whose raylet is stopped (ray-project/ray#63405):
    a cast on a healthy host whose command was spilled there waited for ever (one CI run: a cast of
    four still active after 120 s). Once the node is declared dead the command is cancelled and
    reported lost, so the cast re-dispatches it; it never ran."""
    result = lease_run
    assert result["killed"] is True and result["ran"] is False and result["started_on"] is None, result
    assert result["stderr"].startswith("lost on the cluster: not started when node"), result
    assert result["seconds"] < 60, result
    # dispatched again (as the cast does with lost work), the command runs on the live node
    assert result["again_ran"] is True and result["again_exit"] == 0 and result["again_seconds"] < 30, result


def test_a_command_needing_more_cpus_than_any_node_has_is_refused_not_queued_for_ever(lease_run: dict) -> None:
    """A socket's ``resources.cpus`` above every node's CPUs: Ray holds such a task as infeasible
    and never runs it, so the cast waited without a word until it was killed (``castor cast`` on a
    cluster of 2-CPU nodes, ``cpus: 64``). It is a spawn error now, said at once; it never ran."""
    result = lease_run
    assert str(result["infeasible"]).startswith("spawn_error: the command needs 64 CPUs"), result
    assert result["infeasible_seconds"] < 10 and result["infeasible_ran"] is False, result


def test_a_command_whose_ray_worker_is_killed_under_it_does_not_outlive_it(lease_run: dict) -> None:
    """The Ray worker running a command killed with ``kill -9`` (the OOM killer, a crash; its
    raylet killed does the same): the cast hears lost work and runs the command again, but the
    command ran in its own session and went on, reparented to init, with no deadline -- two copies
    at once on the shared project, one of them never ended (even by ``ray.shutdown``). A guard
    process the task starts now kills the command's tree (a child that left its process group
    too) when the worker dies."""
    result = lease_run
    assert result["worker_kill_lost"] is True, result
    assert result["worker_kill_tree"] == 2 and result["worker_kill_tree_left"] == 0, result


def test_a_command_whose_node_s_raylet_is_killed_under_it_ends_with_it(lease_run: dict) -> None:
    """A node's raylet killed with ``kill -9`` while a command runs there: the Ray worker running
    it lives on and notices nothing, so the command ran to its end (300 s here) while the cluster
    declared the node dead and the cast ran the command again on a live node. The task now ends
    the command's tree when its worker's parent, the raylet, is gone; the cast hears lost work."""
    result = lease_run
    assert result["raylet_kill_on_node"] is True, result  # it ran under the killed raylet
    assert result["raylet_kill_tree"] == 2 and result["raylet_kill_tree_left"] == 0, result
    assert result["raylet_kill_lost"] is True, result


def test_a_command_whose_serving_process_is_killed_leaves_no_process_behind(lease_run: dict) -> None:
    """The serving process (``castor serve``, ``castor cast``), which owns every cast host and so
    every command, killed with ``kill -9``: Ray ends each command's worker and kills that worker's
    own children, so the command's shell died but its child lived on, reparented to init
    (``castor cast`` killed on a ``ray start`` cluster left ``sleep`` running). The command's
    guard, detached from the worker, kills the rest of the tree."""
    result = lease_run
    assert result["driver_kill_tree"] == 2 and result["driver_kill_tree_left"] == 0, result


def _never_two_copies_at_once(result: dict) -> None:
    """Every project's command ran as one copy on the cut-off node, then again elsewhere, never
    two at once (from the stamps each copy left on the shared project)."""
    _all_complete(result)
    assert result["first_copies_on"] == {"s0": ["worker"], "s1": ["worker"]}, result  # both cut off mid-run
    assert sorted(result["session_hosts"].values()) == ["head", "worker"], result
    assert result["overlaps"] == [], result["overlaps"]
    for sid, copies in result["copies"].items():
        assert len(copies) >= 2 and not copies[0]["ended"], (sid, copies)  # the first was killed, then run again
        assert all(c["ended"] for c in copies[1:]), (sid, copies)
        # on a healthy node a command outlives its lease many times over: the lease is renewed
        assert all(c["last"] - c["start"] >= 2 * result["lease_s"] for c in copies[1:]), (sid, copies)
    # what the cast's events say: the cast on the head's host lost its command with the node (and
    # why; it said only "utility killed"), the other was recast after its host was lost
    on_head = next(sid for sid, where in result["session_hosts"].items() if where == "head")
    assert any("lost on the cluster" in str(why) and "node" in str(why) for why in result["recast_because"][on_head]), \
        result["recast_because"]


def test_a_command_on_a_node_whose_raylet_is_stopped_never_runs_twice_at_once(tmp_path: Path) -> None:
    """The worker node's raylet stopped (SIGSTOP: the cluster declares the node dead while its
    processes run on, as when it is cut off) while two casts' commands run there, one cast on the
    head's host, one on the cut-off node's host. Before, the command ran on to its end (60 s
    here) while the cast, told the work was lost as soon as the node was declared dead, ran it
    again on the head: two copies at once on the shared project. Each command now holds a lease
    its task renews while the cluster says its node is alive: told the node is dead, the task
    kills it at once, and the cast runs it again only once the lease has lapsed."""
    _never_two_copies_at_once(scenario("cut_off_stop_raylet", tmp_path))


def test_an_abort_and_a_recast_at_once_never_run_a_cut_off_command_twice_at_once(tmp_path: Path) -> None:
    """The partition above, and right after the cut the cast on the head's host is aborted and
    recast at once. The abort's cancel cannot reach the cut-off node, where the command runs on
    until its lease lapses; the recast's command started at once on the head's freed CPUs, two
    copies on one project. It now waits in its host's pool until the given-up command is taken
    for lost (its lease and a margin after its node was seen dead), then runs and the cast completes."""
    result = scenario("cut_off_link_down_then_abort", tmp_path)
    _all_complete(result)
    aborted = result["aborted"]
    assert result["session_hosts"][aborted] == "head" and result["recast_at_once"] == "active", result
    assert result["first_copies_on"][aborted] == ["worker"], result
    assert result["overlaps"] == [], result["overlaps"]
    copies = result["copies"][aborted]
    assert len(copies) == 2 and not copies[0]["ended"] and copies[1]["ended"], copies
    # On one machine the recast's start can reach the first copy (it kills what a dead runtime left,
    # found in /proc); across machines it cannot, so the second copy waits until the first is taken
    # for lost: its lease, after its node was seen dead. Before, it started at once.
    assert copies[1]["start"] - result["cut_at"] >= result["lease_s"], (result["cut_at"], copies)
    assert any("abort" in str(why) for why in result["recast_because"][aborted]), result["recast_because"]


def test_a_command_on_a_node_cut_off_by_a_partition_never_runs_twice_at_once(tmp_path: Path) -> None:
    """A real partition: the worker node runs in a network namespace of its own, joined to the
    head's by a veth pair that is taken down while two casts' commands run there (one cast on the
    head's host, one on the cut-off node's host). The node's processes run on and reach nothing;
    the cluster declares the node dead. Before, the cast on the head's host ran the command again
    at once, while the first copy ran on (its node could not even hear a cancel). The cut-off
    command's lease now lapses (its task cannot reach the cluster to renew it) and its guard kills
    it; the cast, and the recovery of the cut-off host's cast, run it again only after the lease
    and a margin have passed since the node was seen dead."""
    _never_two_copies_at_once(scenario("cut_off_link_down", tmp_path))


def _recast_elsewhere_and_never_twice(result: dict) -> None:
    """The stopped (or one-way cut) host's cast was recast on another host before the host ran
    again, the command it had started -- on a healthy node -- was ended first, and nothing the
    old host did once it ran again started the command a third time (from the stamps each copy
    left on the shared project)."""
    assert set(result["status_while_stopped"].values()) == {"complete"}, result
    assert set(result["status"].values()) == {"complete"}, result
    assert [r["host_id"] for r in result["recoveries"]] == [result["victim"]], result
    assert result["overlaps"] == [], result["overlaps"]
    copies = result["copies"]
    assert len(copies) == 2 and not copies[0]["ended"] and copies[1]["ended"], copies
    # the given-up copy ended (its host's grant revoked) before the recast's started, and the recast
    # waited the command's lease from the moment the host was taken for lost
    assert copies[0]["last"] < copies[1]["start"], copies
    assert copies[1]["start"] - result["cut_at"] >= result["lease_s"], (result["cut_at"], copies)
    lost = next(h for h in result["hosts_after"] if h["host_id"] == result["victim"])
    assert lost["alive"] is False and result["old_host_alive_at_end"] is False, result


def test_a_stopped_host_s_cast_is_recast_elsewhere_and_its_command_never_runs_twice(tmp_path: Path) -> None:
    """A cast host's process SIGSTOPped (a frozen VM, a long pause) while its cast's command runs
    on another, healthy node, then SIGCONTed. The cluster sees nothing wrong with a stopped
    process: before, the serving process drained it for ever, every call for its session timed
    out and the cast stayed on it until it ran again. Now a host whose drains go unanswered for
    ``lost_after_silence_s`` is taken for lost: its grant is revoked first (the command's task
    sees it at its next lease renewal and ends the command; the host, if it runs again, ends
    itself), it is killed, and the cast is recast on another host once the command's lease has
    passed since: the command runs twice in sequence, never at once, and never a third time."""
    _recast_elsewhere_and_never_twice(scenario("stopped_host", tmp_path))


def test_a_host_nothing_can_reach_is_taken_for_lost_and_its_command_never_runs_twice(tmp_path: Path) -> None:
    """An asymmetric partition: nothing reaches the host's ports while the host reaches every
    other process (the head, the GCS, its commands' nodes). Calls for its session time out
    (``timeout``, ``may_have_started: true``); its drains go unanswered, so it is taken for lost,
    its grant revoked, and its cast recast elsewhere, its command never twice at once."""
    _recast_elsewhere_and_never_twice(scenario("stopped_unreachable", tmp_path))


def test_a_host_whose_answers_are_lost_is_taken_for_lost_and_its_command_never_runs_twice(tmp_path: Path) -> None:
    """The reverse asymmetric partition: calls reach the host and run there, its answers are lost.
    Its drains run (so its own silence fence never fires) and their items are lost; before, the
    serving process waited on it for ever. Now it is taken for lost like a silent host; it still
    reaches the GCS, learns that its grant was revoked and ends itself, and its cast is recast
    elsewhere, its command never twice at once."""
    _recast_elsewhere_and_never_twice(scenario("stopped_unanswering", tmp_path))


def test_lost_hosts_leave_no_key_each_behind_and_a_stale_host_still_finds_itself_revoked(tmp_path: Path) -> None:
    """Each lost host's revocation was a key of its own in the GCS's key-value store, never deleted:
    one more key per host loss, for as long as the cluster ran. The store now holds a key per *live*
    host (its grant), deleted when the host is taken for lost; a host taken for lost while stopped,
    run again after many other losses, still finds its grant gone: a command with it never starts,
    and the host ends itself."""
    result = scenario("grant_keys", tmp_path)
    assert result["recoveries"] == result["losses"], result
    assert len(result["keys_at_end"]) <= result["live_hosts"] == 2, result  # nothing per lost host
    stale = result["stale_command"]
    assert stale["killed"] and not stale["ran"] and "revoked" in stale["stderr"], result
    assert result["stale_host_alive_15s_after_waking"] is False, result


def test_a_killed_serving_process_s_grant_keys_are_swept_by_the_next_serve(tmp_path: Path) -> None:
    """A serving process killed outright (``kill -9``) cannot delete its live hosts' grant keys:
    they stayed in the cluster's key-value store, one per host, for as long as the cluster ran.
    Each key now names the serving process (its Ray job) that holds it, and the next serving
    process on the cluster deletes the keys of every job the cluster knows to have ended: only its
    own hosts' keys are left, and a command with a swept grant never starts."""
    result = scenario("killed_serving_process", tmp_path)
    assert "error" not in result, result
    killed = sorted(f"grant:{g}" for g in result["killed_grants"])
    assert result["keys_while_serving"] == killed, result
    assert result["keys_after_next_serve"] == result["next_serve_keys"], result  # nothing of the killed one
    stale = result["stale_command"]
    assert stale["killed"] and not stale["ran"] and "revoked" in stale["stderr"], result
