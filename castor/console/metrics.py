"""``/metrics``: the runtime's figures as Prometheus text (prometheus-client's exposition).

Gauges are read from one snapshot of the actor tree at scrape time (nothing is messaged);
counters and histograms come from the actor system's meters (castor/supervision/meters.py).
Labels are bounded: actor *kinds* (class names), a cast's *status* (one of
:data:`CAST_STATUSES`), never paths, ids or names from a user's config (a socket's id), so 1,000
casts, or 1,000 loadouts, do not make 1,000 series. The counters by kind have a sample (0 until it counts) for
every kind that ever started, so the first crash of a kind is an increase; so do the gauges by kind
(0 once the kind's last actor is gone; ``castor_actors`` one per state), so no series vanishes; the unlabelled metrics,
histograms included, are served (at 0) from the start.

=========================================  =========  ==========================================
metric                                     type       what
=========================================  =========  ==========================================
castor_actors{kind,state}                  gauge      actors by kind and state
castor_mailbox_depth{kind}                 gauge      queued messages, summed over the kind
castor_mailbox_oldest_age_seconds{kind}    gauge      age of the oldest queued message (max)
castor_actor_restarts{kind}                gauge      restarts of the live actors (sum)
castor_activity_age_seconds{kind}          gauge      how long the kind's longest-busy actor has done what it does
castor_restarts_total{kind}                counter    restarts by a supervisor
castor_crashes_total{kind}                 counter    crashes (a handler raised, a kill)
castor_retirements_total{kind}             counter    retirements (mailbox rejected)
castor_starts_total{kind}                  counter    incarnations started
castor_ask_timeouts_total{kind}            counter    asks to the kind that timed out
castor_ask_seconds{kind}                   histogram  ask latency (send to answer), by target kind
castor_casts{phase}                        gauge      live casts by status (CAST_STATUSES; every one sampled)
castor_socket_visits_total                 counter    agent socket visits, each once (restarts aside)
castor_socket_visit_restarts_total         counter    a visit's agent turn sent again (retry, rerun, recast)
castor_utility_running                     gauge      utility commands running now (their slots)
castor_utility_runs_total                  counter    utility commands run (= histogram count)
castor_utility_run_seconds                 histogram  utility command durations
castor_worker_calls_total                  counter    calls into Icarus worker processes
castor_worker_timeouts_total               counter    worker calls that timed out (worker retired)
castor_worker_give_ups_total               counter    Icarus workers given up after a crash loop
castor_worker_calls_refused_total          counter    worker calls refused while a worker is given up
castor_sessions                            gauge      open harness sessions
castor_hello_refusals_total                counter    runtime.hello calls refused: no or a wrong token
castor_memory_trim_seconds                 histogram  allocator trims after closed sessions (malloc_trim)
=========================================  =========  ==========================================
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from castor.actors.materia.socket_actor import SOCKET_VISIT_RESTARTS, SOCKET_VISITS
from castor.endpoint.auth import REFUSED_HELLOS
from castor.supervision.kinds import HandleState
from castor.supervision.meters import BUCKETS
from castor.supervision.registry import WATCH_PACE_S

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_KIND_COUNTERS = {"restarts": "restarts by a supervisor", "crashes": "crashes (a handler raised, or a kill)",
                  "retirements": "retirements (the mailbox is rejected)", "starts": "incarnations started",
                  "ask_timeouts": "asks to actors of the kind that timed out"}


#: The values of ``castor_casts``'s ``phase`` label: a live cast's status, from its activity.
#: A fixed set (each one always has a sample, 0 when no cast is in it): the socket a cast is at is a
#: name from the user's loadout, which would make the label's values unbounded.
CAST_STATUSES: tuple[str, ...] = ("starting", "running", "interrupted", "paused", "ended")
_STATUS_OF_ACTIVITY = {"starting": "starting", "interrupted": "interrupted", "paused": "paused", "ended": "ended"}


class RuntimeCollector(Collector):
    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Any]:
        system = self.runtime.system
        actors = system.snapshot_data(pace_s=WATCH_PACE_S)["actors"]
        states = GaugeMetricFamily("castor_actors", "actors by kind and state", labels=["kind", "state"])
        depth = GaugeMetricFamily("castor_mailbox_depth", "queued messages, summed over the kind", labels=["kind"])
        oldest = GaugeMetricFamily("castor_mailbox_oldest_age_seconds",
                                   "age of the oldest queued message of the kind", labels=["kind"])
        restarts = GaugeMetricFamily("castor_actor_restarts", "restarts of the live actors of the kind",
                                     labels=["kind"])
        casts = GaugeMetricFamily("castor_casts", "live casts by status", labels=["phase"])
        busy = GaugeMetricFamily("castor_activity_age_seconds",
                                 "how long the actor of the kind busy the longest has been doing what it does now "
                                 "(an agent turn awaited, a command, a worker call); 0 when all are idle",
                                 labels=["kind"])
        by_state: dict[tuple[str, str], int] = defaultdict(int)
        depths: dict[str, int] = defaultdict(int)
        ages: dict[str, float] = defaultdict(float)
        restart_sum: dict[str, int] = defaultdict(int)
        busy_for: dict[str, float] = defaultdict(float)
        phases: dict[str, int] = dict.fromkeys(CAST_STATUSES, 0)
        utilities_running = 0
        for actor in actors:
            kind, box, activity = actor["kind"], actor["mailbox"], actor["activity"]
            by_state[(kind, actor["state"])] += 1
            depths[kind] += box["depth"]
            ages[kind] = max(ages[kind], box["oldest_age_s"] or 0.0)
            restart_sum[kind] += actor["restarts"]
            if activity is not None and activity["kind"] != "idle":
                # what grows while a cast is stuck: a turn never reported, a command that never ends
                busy_for[kind] = max(busy_for[kind], float(activity.get("age_s") or 0.0))
            if activity is not None and activity["kind"] == "utility" and activity["data"].get("pid") is not None:
                utilities_running += 1  # a slot whose command runs (one waiting for its turn has no pid)
            if kind == "CastActor" and activity is not None:
                # its status, never the socket it is at (a name from the user's loadout); any
                # other activity (at a socket, handling a message) is a cast that runs
                phases[_STATUS_OF_ACTIVITY.get(activity["kind"], "running")] += 1
        counters, histograms = system.registry.meters.collect()
        # Every kind that ever started (or runs now) has a sample of each gauge by kind too, 0 once
        # its last actor is gone (a cast that ended takes its CastActor and SocketActor with it),
        # and of castor_actors one per state: a series that vanished would leave a gap in a graph
        # and an alert on it reading "no data" rather than 0.
        kinds = {kind for (counter, kind) in counters if counter == "starts"} | set(depths)
        every_state = [state.value for state in HandleState]
        every_state += sorted({state for (_kind, state) in by_state} - set(every_state))
        for kind in sorted(kinds):
            for state in every_state:
                states.add_metric([kind, state], by_state.get((kind, state), 0))
            depth.add_metric([kind], depths.get(kind, 0))
            oldest.add_metric([kind], ages.get(kind, 0.0))
            restarts.add_metric([kind], restart_sum.get(kind, 0))
            busy.add_metric([kind], busy_for.get(kind, 0.0))
        for status in CAST_STATUSES:
            casts.add_metric([status], phases[status])
        yield from (states, depth, oldest, restarts, busy, casts)
        running = GaugeMetricFamily("castor_utility_running", "utility commands running now (their slots)")
        running.add_metric([], utilities_running)
        yield running
        sessions = GaugeMetricFamily("castor_sessions", "open harness sessions")
        sessions.add_metric([], len(self.runtime.sessions()))
        yield sessions
        refused = CounterMetricFamily("castor_hello_refusals",
                                      "runtime.hello calls refused for a missing or wrong token (every endpoint)")
        refused.add_metric([], REFUSED_HELLOS.count)
        yield refused

        # Every kind that ever started (or runs now) has a sample of each counter, 0 until it
        # counts: a series that first appears at 1 shows no increase, so the first crash of a
        # kind would never fire an alert on increase(castor_crashes_total[5m]).
        for name, help_text in _KIND_COUNTERS.items():
            family = CounterMetricFamily(f"castor_{name}", help_text, labels=["kind"])
            of_name = {kind: n for (counter, kind), n in counters.items() if counter == name}
            for kind in sorted(kinds | set(of_name)):
                family.add_metric([kind], of_name.get(kind, 0))
            yield family
        # A visit counts once, when its cast enters the socket: its turn sent again (a retry, a
        # rerun, a recast after its cast or castor restarted -- each a new SocketActor) is a restart.
        for name, meter, help_text in (
                ("socket_visits", SOCKET_VISITS, "agent socket visits, each counted once whatever restarts"),
                ("socket_visit_restarts", SOCKET_VISIT_RESTARTS,
                 "agent turns of a visit sent again (a retry, a rerun after an interruption, a recast after its "
                 "cast or castor restarted); the visit is not counted again")):
            family = CounterMetricFamily(f"castor_{name}", help_text)
            family.add_metric([], sum(n for (c, _k), n in counters.items() if c == meter))
            yield family
        for name, help_text in (("worker_calls", "calls into Icarus worker processes"),
                                ("worker_timeouts", "worker calls that timed out (the worker is retired)"),
                                ("worker_give_ups", "Icarus workers given up after dying in call after call "
                                                    "(a crash loop)"),
                                ("worker_calls_refused", "worker calls refused at once while the session's "
                                                         "worker is given up")):
            family = CounterMetricFamily(f"castor_{name}", help_text)
            family.add_metric([], sum(n for (c, _k), n in counters.items() if c == name))
            yield family
        asks = HistogramMetricFamily("castor_ask_seconds", "ask latency, send to answer, by target kind",
                                     labels=["kind"])
        runs = HistogramMetricFamily("castor_utility_run_seconds", "utility command durations")
        trims = HistogramMetricFamily("castor_memory_trim_seconds",
                                      "allocator trims after closed sessions (malloc_trim), how long each took")
        # The unlabelled histograms have their series from the start, every bucket 0 until the first
        # observation (as the counters do): the first slow command is an increase, not a new series.
        empty = [0.0] * (len(BUCKETS) + 2)
        merged_runs, merged_trims = list(empty), list(empty)
        for (name, kind), row in sorted(histograms.items()):
            if name == "ask_seconds":
                buckets, total = _cumulative(row)
                asks.add_metric([kind], buckets, total)
            elif name == "utility_run_seconds":
                merged_runs = [a + b for a, b in zip(merged_runs, row, strict=True)]
            elif name == "memory_trim_seconds":
                merged_trims = [a + b for a, b in zip(merged_trims, row, strict=True)]
        yield asks
        buckets, total = _cumulative(merged_trims)
        trims.add_metric([], buckets, total)
        yield trims
        buckets, total = _cumulative(merged_runs)
        runs.add_metric([], buckets, total)
        utility_total = int(sum(merged_runs[:-1]))
        yield runs
        runs_total = CounterMetricFamily("castor_utility_runs", "utility commands run")
        runs_total.add_metric([], utility_total)
        yield runs_total


def _cumulative(row: list[float]) -> tuple[list[tuple[str, float]], float]:
    """Meters' per-bucket counts (+Inf last, then the sum) as Prometheus cumulative buckets."""
    out, running = [], 0.0
    for bound, n in zip([*map(str, BUCKETS), "+Inf"], row[:-1], strict=True):
        running += n
        out.append((bound, running))
    return out, row[-1]


def metrics_text(runtime: Any) -> bytes:
    """The exposition of one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RuntimeCollector(runtime))
    return generate_latest(registry)
