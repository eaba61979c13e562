"""The shared utility pool: ``/root/utility`` with ``slot-<n>`` UtilityExecutorActors.

:func:`utility_pool_spec` builds a one-for-one supervisor with ``settings.utility_slots``
PERMANENT slots. Each slot runs **one** ``RunUtility`` at a time on its own thread, so at most
N commands run at once however many casts ask (a thousand casts cannot fork-bomb the machine).

| step | rule |
|---|---|
| submit | :func:`submit_utility` picks the slot with the fewest outstanding jobs; more than ``slots + utility_queue_limit`` outstanding → ``MailboxFull`` (the cast fails that visit with ``DispatchFailed``) |
| command | the pool's :class:`~castor.ports.utility_runner.UtilityRunner` (locally :func:`castor.adapters.materia.process_runner.spawn`): no shell, cwd = project, cast input JSON on stdin, deadline → SIGTERM to the whole tree, SIGKILL after the grace; stdout/stderr capped; the environment is castor's plus ``CASTOR_VISIT_ID`` (the dispatch's visit id: an idempotency key, never reused for another dispatch) , ``CASTOR_RUN_DIR`` and ``CASTOR_RUNTIME_PID`` |
| built-in | ``project.ensureIgnored`` / ``vcs.detect`` via the runner (locally :func:`castor.adapters.materia.builtins.run_builtin`) |
| while a command may run | it is recorded (by visit id, before it starts) in the cast's run dir (:mod:`castor.adapters.materia.command_records`), so a runtime that starts after this one died kills it — found by its environment — before the cast runs it again |
| result | ``UtilityFinished(visit_id, ...)`` written into the command's record (fsynced) and then told to the cast's handle; the engine writes the artifacts, and the cast removes the record once that transition is saved -- a runtime killed in between leaves the outcome for the recast, which takes it instead of running the command again |
| same ``visit_id`` again | never executed twice: the recorded outcome is re-sent (a duplicate of a running job is dropped) |
| slot killed / ``kill_process`` / crash mid-job | the tree is SIGKILLed (``owned_pids()`` is the running tree); the cast gets ``WorkLost`` and re-dispatches under a **new** visit id; a command that ran and was killed is marked ``command_started``, so the cast says it runs again from the start |
| ``CancelWork`` (abort; a restarted cast giving up the visit it re-dispatches) | :func:`cancel_utility` kills the visit's tree, or drops the job if it is still queued; its outcome is ignored by the engine |
| a cast recast here from a cast host taken for lost (``castor.scaleout``) | its commands wait until that host's may no longer run (:meth:`UtilityPoolState.hold_commands`: the serving process says until when; its slot's activity says so) |
| a cast taken up here (any runtime) whose run dir records a command a cast host started on a cluster and never saw end | its commands wait that command's lease and margin (its record says how long): the copy on the cluster cannot be found or killed from here (the cast's own start holds them, see ``CastActor``) |
| a cast's next command while one it gave up is still ending (an abort, then a recast at once; on a cluster node cut off from the cluster, the old one runs until its lease lapses) | waits for it (:meth:`UtilityPoolState.wait_for_earlier`; its slot's activity says so), so two commands of one cast never run at once; at most ``GIVEN_UP_GRACE_S`` past the earlier command's own deadline (by then it has certainly ended; a runner still waiting is stuck: a warning) |
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from castor import tree
from castor.actors.materia.activity import running_utility
from castor.actors.materia.messages import CastOutcome, UtilityJob, WorkLost
from castor.domain.materia.cast_messages import RunUtility, UtilityFinished
from castor.messages.errors import ActorStopped, CastorError, MailboxFull, NotFound
from castor.ports.utility_runner import (
    RUN_DIR_ENV,
    RUNTIME_PID_ENV,
    VISIT_ID_ENV,
    RunningCommand,
    UtilityCommand,
    UtilityRunner,
    UtilitySpawnError,
)
from castor.supervision import Actor, ChildSpec, handles
from castor.supervision.threads import start_thread

POOL_PATH = "/root/utility"
LEDGER_SIZE = 10_000
GIVEN_UP_GRACE_S = 60.0
"""How long past its own deadline a started command has certainly ended, wherever it runs: the
kill's grace, and on a cluster the command's lease and margin (15 + 3 s by default) and the time
the cluster takes to declare a cut-off node dead. A cast's next command waits no longer for it."""


class UtilityPoolState:
    """Shared by the slots of one pool (survives slot restarts): load, ledger, running jobs."""

    def __init__(self, slots: int, queue_limit: int, runner: UtilityRunner | None = None) -> None:
        self.slots = slots
        self.queue_limit = queue_limit
        self.runner = runner  # how commands and built-ins run (the runtime passes the local one)
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)  # a claimed job ended, or a queued one was cancelled
        self._load = [0] * slots
        self._ledger: OrderedDict[str, UtilityFinished] = OrderedDict()
        self._running: dict[str, RunningCommand | None] = {}
        # The cast (its run dir) of each claimed command job, in the order they were claimed: a
        # cast's next command waits for the ones claimed before it (see wait_for_earlier).
        self._casts: dict[str, str] = {}
        # When a started command of a cast has certainly ended (its deadline and GIVEN_UP_GRACE_S):
        # a later command of the cast waits for it no longer than that.
        self._ends_by: dict[str, float] = {}
        # cancelled while still queued or starting: the grace its command gets when it starts
        # anyway (None: SIGKILL at once, an abort; a number: SIGTERM, SIGKILL after it)
        self._cancelled: OrderedDict[str, float | None] = OrderedDict()
        self.remote_runner: Any = None  # a cast host's: commands start as cluster tasks (castor.scaleout)
        # cast id -> time.monotonic() until which its commands wait: a lost host's may still run
        self._held: dict[str, float] = {}
        # A cast host's fence: True once the host was taken for lost elsewhere (its grant revoked);
        # its slots then start nothing more and tell their casts nothing (castor.scaleout.host).
        self.refuses: Callable[[], bool] | None = None

    def hold_commands(self, cast_id: str, until: float) -> None:
        """No command of ``cast_id`` starts in this pool before ``time.monotonic()`` ``until``: the
        cast was recast here from a cast host taken for lost, whose commands may run until then."""
        with self._lock:
            self._held[cast_id] = max(until, self._held.get(cast_id, until))

    def held_for(self, visit_id: str) -> float:
        """How many seconds the command of ``visit_id`` must still wait (see :meth:`hold_commands`)."""
        with self._lock:
            until = self._held.get(visit_id.split(":", 1)[0])
        return 0.0 if until is None else max(0.0, until - time.monotonic())

    def wait_until_released(self, visit_id: str) -> bool:
        """Wait out :meth:`held_for`; False when ``visit_id`` was cancelled meanwhile (it must not start)."""
        with self._ended:
            while visit_id not in self._cancelled:
                until = self._held.get(visit_id.split(":", 1)[0])
                left = 0.0 if until is None else until - time.monotonic()
                if left <= 0:
                    return True
                self._ended.wait(left)
            return False

    def fenced(self) -> bool:
        """Whether this pool's host lost its grant: nothing may be started or recorded here."""
        refuses = self.refuses
        return refuses is not None and refuses()

    def pick(self) -> int:
        with self._lock:
            if sum(self._load) >= self.slots + self.queue_limit:
                raise MailboxFull(f"utility pool full: {sum(self._load)} jobs outstanding",
                                  data={"slots": self.slots, "queue_limit": self.queue_limit}, may_have_started=False)
            slot = min(range(self.slots), key=self._load.__getitem__)
            self._load[slot] += 1
            return slot

    def done(self, slot: int) -> None:
        with self._lock:
            self._load[slot] = max(0, self._load[slot] - 1)

    def begin(self, visit_id: str, run_dir: str | None = None) -> UtilityFinished | str | None:
        """``UtilityFinished`` if already done, ``"running"`` if in progress, ``"cancelled"`` if
        cancelled before it started, else None (claimed now, for the cast of ``run_dir``: a
        command job)."""
        with self._lock:
            if visit_id in self._ledger:
                return self._ledger[visit_id]
            if visit_id in self._running:
                return "running"
            if visit_id in self._cancelled:
                return "cancelled"
            self._running[visit_id] = None
            if run_dir is not None:
                self._casts[visit_id] = run_dir
            return None

    def earlier_of_the_same_cast(self, visit_id: str) -> str | None:
        """The visit id of a command job of the same cast claimed before ``visit_id`` and not
        ended yet (the oldest), or None."""
        with self._lock:
            return self._earlier_locked(visit_id)

    def _earlier_locked(self, visit_id: str, passed: set[str] | frozenset[str] = frozenset()) -> str | None:
        run_dir = self._casts.get(visit_id)
        if run_dir is None:
            return None
        for other, its_dir in self._casts.items():  # in claim order
            if other == visit_id:
                return None
            if its_dir == run_dir and other not in passed:
                return other
        return None

    def wait_for_earlier(self, visit_id: str, overdue: Callable[[str], None] | None = None) -> bool:
        """Wait until no command job of the same cast claimed before ``visit_id`` is left; False
        when ``visit_id`` was cancelled meanwhile (it must not start).

        Why: a cast runs one command at a time, but a command it gave up (an abort, then a recast
        at once) may still be ending -- SIGKILLed a moment ago, or on a cluster node cut off from
        the cluster, where it runs until its lease lapses. The cast's next command started at once
        ran beside it on the same project. Claim order keeps two waiters from waiting on each other.

        Not for ever: a started command has certainly ended ``GIVEN_UP_GRACE_S`` after its own
        deadline (its tree is killed there, on any node). A job whose wait for its runner goes on
        past that is no reason to hold the cast: ``overdue(visit_id)`` is told (once per earlier
        job) and it is waited for no longer."""
        passed: set[str] = set()
        with self._ended:
            while True:
                earlier = self._earlier_locked(visit_id, passed)
                if earlier is None or visit_id in self._cancelled:
                    return visit_id not in self._cancelled
                ends_by = self._ends_by.get(earlier)
                left = None if ends_by is None else ends_by - time.monotonic()
                if left is not None and left <= 0:
                    passed.add(earlier)
                    if overdue is not None:
                        overdue(earlier)
                    continue
                self._ended.wait(left)

    def started(self, visit_id: str, running: RunningCommand, timeout_s: float | None = None) -> None:
        with self._lock:
            if visit_id in self._running:
                self._running[visit_id] = running
                if timeout_s is not None and visit_id in self._casts:
                    self._ends_by[visit_id] = time.monotonic() + timeout_s + GIVEN_UP_GRACE_S
            cancelled = visit_id in self._cancelled
            grace_s = self._cancelled.get(visit_id)
        if cancelled:  # cancelled while it was being started: ended as the cancel asked
            if grace_s is None:
                running.kill()
            else:
                running.terminate(grace_s)

    def is_cancelled(self, visit_id: str) -> bool:
        with self._lock:
            return visit_id in self._cancelled

    def finish(self, visit_id: str, outcome: UtilityFinished | None) -> None:
        with self._lock:
            self._running.pop(visit_id, None)
            self._ends_by.pop(visit_id, None)
            if self._casts.pop(visit_id, None) is not None:
                self._ended.notify_all()
            if outcome is not None:
                self._ledger[visit_id] = outcome
                while len(self._ledger) > LEDGER_SIZE:
                    self._ledger.popitem(last=False)

    def running_of(self, visit_id: str) -> RunningCommand | None:
        with self._lock:
            return self._running.get(visit_id)

    def progress_of(self, visit_id: str) -> tuple[str, int | None]:
        """Where the job of ``visit_id`` is, for a snapshot: ``("running", pid)`` (its command's
        process), ``("started", None)`` (claimed by a slot: being started, or a built-in running),
        ``("waiting", None)`` (claimed, waiting for the cast's previous command to end: see
        :meth:`wait_for_earlier`), ``("finished", None)`` or ``("queued", None)`` (waiting in a
        slot's mailbox)."""
        with self._lock:
            claimed = visit_id in self._running
            running = self._running.get(visit_id)
            finished = visit_id in self._ledger
            behind = self._earlier_locked(visit_id) if claimed and running is None else None
        if running is not None:  # the root pid a local command knows (no process-tree walk per snapshot)
            pid = getattr(running, "pid", None)
            return "running", pid if isinstance(pid, int) else None
        if behind is not None:
            return "waiting", None
        if claimed:
            return "started", None
        return ("finished", None) if finished else ("queued", None)

    def deadline_of(self, visit_id: str) -> float | None:
        """The monotonic instant the running command of ``visit_id`` is stopped at (its
        ``timeoutMs``), for a snapshot; None while it does not run (queued, starting, ended)."""
        with self._lock:
            ends_by = self._ends_by.get(visit_id) if self._running.get(visit_id) is not None else None
        return None if ends_by is None else ends_by - GIVEN_UP_GRACE_S

    def all_running(self) -> list[RunningCommand]:
        with self._lock:
            return [r for r in self._running.values() if r is not None]

    def cancel_queued(self, visit_id: str, grace_s: float | None = None) -> None:
        """A job of ``visit_id`` that has no process yet (queued, or claimed and starting) will
        not run: it is skipped, or ended as soon as it is started -- SIGKILLed (``grace_s``
        None), or SIGTERMed and SIGKILLed after ``grace_s``, as a running one would have been."""
        with self._lock:
            if self._running.get(visit_id) is None and visit_id not in self._ledger:
                self._cancelled[visit_id] = grace_s
                while len(self._cancelled) > LEDGER_SIZE:
                    self._cancelled.popitem(last=False)
                self._ended.notify_all()  # a job waiting for an earlier one of its cast gives up

    def outstanding(self) -> int:
        with self._lock:
            return sum(self._load)


_POOLS: weakref.WeakKeyDictionary[Any, UtilityPoolState] = weakref.WeakKeyDictionary()


def pool_of(registry: Any) -> UtilityPoolState:
    pool = _POOLS.get(registry)
    if pool is None:
        raise NotFound("this runtime has no utility pool", data={"path": POOL_PATH})
    return pool


def submit_utility(registry: Any, job: UtilityJob) -> None:
    """Queue ``job`` on the least-loaded slot (raises MailboxFull / NotFound / ActorStopped)."""
    pool = pool_of(registry)
    slot = pool.pick()
    try:
        registry.lookup(f"{POOL_PATH}/slot-{slot}").tell(job)
    except BaseException:
        pool.done(slot)
        raise


UTILITY_STOP_GRACE_S = 1.0
"""A running command stopped with its cast or the runtime gets SIGTERM, then SIGKILL after this long."""


def cancel_utility(registry: Any, visit_id: str, *, grace_s: float | None = None) -> bool:
    """End the tree of ``visit_id`` if it runs now (True), else make sure a queued job of it never
    starts (False). ``grace_s`` None: SIGKILL at once (an abort). A number: gently -- SIGTERM,
    SIGKILL after ``grace_s`` -- on a thread of its own, so the caller does not wait (a cast that
    stops while its command runs: nobody would take the command's outcome, and a continue runs it
    again)."""
    pool = _POOLS.get(registry)
    running = pool.running_of(visit_id) if pool is not None else None
    if running is None:
        if pool is not None:
            # It may be starting now (spawned, not yet registered): it then ends as gently.
            pool.cancel_queued(visit_id, grace_s)
        return False
    if grace_s is None:
        running.kill()
    else:
        start_thread(running.terminate, args=(grace_s,), name="utility-stop", owner="/root/utility",
                     purpose="end the command of a cast that stopped")
    return True


def terminate_running(registry: Any, grace_s: float) -> int:
    """End every running command of the pool gently (SIGTERM to its tree, SIGKILL after
    ``grace_s``), all at once; a runtime shutting down calls it once its casts have stopped and
    before it stops the slots, because a slot busy waiting on its command cannot take a stop
    message. Returns how many were running."""
    pool = _POOLS.get(registry)
    running = pool.all_running() if pool is not None else []
    threads = [start_thread(r.terminate, args=(grace_s,), name=f"utility-terminate-{i}", owner="/root/utility",
                            purpose="end a running utility command at shutdown")
               for i, r in enumerate(running)]
    for thread in threads:
        thread.join(grace_s + 2.0)
    return len(running)


class UtilityExecutorActor(Actor):
    """One pool slot: runs one utility job at a time."""

    def __init__(self, pool: UtilityPoolState, slot: int) -> None:
        super().__init__()
        self.pool = pool
        self.slot = slot
        self._job: UtilityJob | None = None
        self._running: RunningCommand | None = None
        self._lost_why: str | None = None  # why the runner lost the running command (remote runners say)

    def on_start(self) -> None:
        _POOLS[self.handle.registry] = self.pool

    @handles(UtilityJob)
    def _on_job(self, job: UtilityJob) -> None:
        effect: RunUtility = job.effect
        try:
            seen = self.pool.begin(effect.visit_id, job.run_dir if effect.command else None)
            if isinstance(seen, UtilityFinished):
                self._answer(job, CastOutcome(event=seen))  # a re-sent job: answer, never re-run
                return
            if seen in ("running", "cancelled"):
                return  # a duplicate of a running job, or one the cast gave up before it started
            self._job = job
            self._lost_why = None
            outcome = self._execute(effect, job.run_dir)
            self._job = None
            self.pool.finish(effect.visit_id, outcome)
            if outcome is None:  # with why, when the runner knows (a cluster task: its node died, ...)
                why = f": {self._lost_why}" if self._lost_why else ""
                self._answer(job, WorkLost(visit_id=effect.visit_id, reason=f"utility killed in {self.path}{why}",
                                           command_started=effect.command is not None))
            else:
                self._answer(job, CastOutcome(event=outcome))
        finally:
            if self._job is None:
                self.pool.done(self.slot)

    def _answer(self, job: UtilityJob, message: CastOutcome | WorkLost) -> None:
        """Tell the cast how its job ended. A cast that has stopped meanwhile (aborted, ended, its
        session closed) hears nothing: its outcome is in the ledger for a recast, and that is no
        fault of this slot's (it was logged as a warning on every abort of a running command).
        Nor does a cast whose host lost its grant (:meth:`UtilityPoolState.fenced`): the cast
        runs on another host, and this one records nothing more."""
        if self.pool.fenced():
            self.log.warning("{visit}: this host's grant was revoked; its outcome is not recorded",
                             visit=job.effect.visit_id)
            return
        try:
            job.cast.tell(message)
        except ActorStopped:
            self.log.debug("{visit}: its cast has stopped; the outcome stays in the ledger", visit=job.effect.visit_id)

    def _execute(self, effect: RunUtility, run_dir: str | None) -> UtilityFinished | None:
        """Run the job; None when it was killed from outside (work lost, not a result)."""
        if effect.command:
            try:
                cmd = UtilityCommand(argv=list(effect.command), cwd=Path(effect.cwd or "."), stdin=effect.stdin_json,
                                     timeout_ms=max(1, int(effect.timeout_ms)),
                                     max_output_bytes=effect.max_output_bytes,
                                     env={**os.environ, VISIT_ID_ENV: effect.visit_id,
                                          RUNTIME_PID_ENV: str(os.getpid()),
                                          **({RUN_DIR_ENV: run_dir} if run_dir else {})})
            except ValidationError as exc:  # a command no process can be given (a NUL in an argument)
                why = "; ".join(str(e.get("msg", "")) for e in exc.errors())
                return UtilityFinished(visit_id=effect.visit_id, spawn_error=f"the command cannot be run: {why}",
                                       exit_code=None, at=time.time())
            earlier = self.pool.earlier_of_the_same_cast(effect.visit_id)
            if earlier is not None:  # the cast's command before this one is still ending
                self.report_activity("utility", f"waiting for the cast's previous command (visit {earlier}) to end "
                                     f"before running {effect.socket_id}'s",
                                     {"visit_id": effect.visit_id, "waits_for": earlier, "socket": effect.socket_id})
                if not self.pool.wait_for_earlier(effect.visit_id, self._overdue):
                    return None  # given up while it waited (CancelWork)
            held_s = self.pool.held_for(effect.visit_id)
            if held_s > 0:  # recast here from a lost host whose commands may still run
                self.report_activity("utility", f"waiting {held_s:.0f} s for the commands of the cast's lost host to "
                                     f"end before running {effect.socket_id}'s",
                                     {"visit_id": effect.visit_id, "socket": effect.socket_id})
                if not self.pool.wait_until_released(effect.visit_id):
                    return None  # given up while it waited (CancelWork)
            if self.pool.fenced():
                return None  # this host was taken for lost: its casts run elsewhere
            runner = self._runner()
            remote = self.pool.remote_runner
            record = runner.record_path(run_dir, effect.visit_id) if run_dir else None
            if record is not None and not runner.record_running(  # before it can run at all
                    record, effect.visit_id, cluster_fence_s=remote.fence_s if remote is not None else None):
                record = None  # .commands is not a directory: it runs unrecorded
            finished: UtilityFinished | None = None
            try:
                if self.pool.is_cancelled(effect.visit_id):
                    return None  # given up between being claimed and starting (CancelWork)
                try:
                    running = remote.spawn(cmd, effect.resources) if remote is not None else runner.spawn(cmd)
                except UtilitySpawnError as exc:
                    return UtilityFinished(visit_id=effect.visit_id, spawn_error=exc.message, exit_code=None,
                                           at=time.time())
                self._running = running
                self.pool.started(effect.visit_id, running, cmd.timeout_ms / 1000.0)
                self.report_activity(*running_utility(effect, cmd.argv, running.pids()),
                                     deadline=time.monotonic() + cmd.timeout_ms / 1000.0)  # its timeoutMs
                try:
                    result = running.wait()
                    self._lost_why = getattr(running, "lost_why", None)
                    self.observe_metric("utility_run_seconds", result.duration_ms / 1000.0)
                except UtilitySpawnError as exc:  # a cluster task learns it only on its node
                    return UtilityFinished(visit_id=effect.visit_id, spawn_error=exc.message, exit_code=None,
                                           at=time.time())
                finally:
                    self._running = None
                if result.killed:
                    return None
                finished = UtilityFinished(visit_id=effect.visit_id, stdout=result.stdout, stderr=result.stderr,
                                           exit_code=result.exit_code, signal=result.signal_name,
                                           timed_out=result.timed_out, stdout_truncated=result.stdout_truncated,
                                           stderr_truncated=result.stderr_truncated, at=time.time())
                if record is not None:
                    finished = self._recorded(runner, record, finished)
                return finished
            finally:
                if record is not None and finished is None:  # ended without an outcome: nothing to keep
                    runner.forget(record)
        try:
            text = self._runner().run_builtin(effect.builtin or "", effect.params, cwd=effect.cwd or ".")
        except (CastorError, OSError) as exc:
            return UtilityFinished(visit_id=effect.visit_id, error=str(getattr(exc, "message", exc)), at=time.time())
        return UtilityFinished(visit_id=effect.visit_id, stdout=text, at=time.time())

    def _recorded(self, runner: UtilityRunner, record: Path, finished: UtilityFinished) -> UtilityFinished:
        """``finished``, written into the command's record before the cast hears of it: a runtime
        killed before the cast saved it leaves it there, and the recast takes it instead of
        running the command again (the cast removes the record once it saved the outcome). One that
        cannot be written removes the record, as before: the command may then run again after a
        kill, as the warning says."""
        try:
            runner.record_outcome(record, finished.visit_id, finished.model_dump(mode="json"))
        except OSError as exc:
            self.log.warning("the outcome of {visit} could not be recorded ({exc}); a runtime killed before the cast "
                             "saves it runs the command again", visit=finished.visit_id, exc=exc)
            runner.forget(record)
        return finished

    def _overdue(self, earlier: str) -> None:
        self.log.warning("the cast's previous command (visit {earlier}) has not been seen to end {grace:g} s past "
                         "its deadline; this one starts anyway (its runner is stuck: a castor or cluster fault)",
                         earlier=earlier, grace=GIVEN_UP_GRACE_S)

    def _runner(self) -> UtilityRunner:
        runner = self.pool.runner
        if runner is None:  # a pool built without one: castor's own wiring bug, not the caller's
            raise RuntimeError("this utility pool was built without a utility runner")
        return runner

    # -- faults and exits ---------------------------------------------------
    def owned_pids(self) -> list[int]:
        running = self._running
        return running.pids() if running is not None and not running.finished else []

    def kill_owned(self) -> None:
        running = self._running
        if running is not None:
            running.kill()  # marks the result "killed": reported as lost work, not as a failure

    def on_terminate(self, cause: str) -> None:
        if cause == "stopped":
            return
        job = self._job
        current = self.handle.current
        if job is None and current is not None and isinstance(current.message, UtilityJob):
            job = current.message  # crashed before the handler ran (crash_next)
        if job is None:
            return
        self._job = None
        self.pool.finish(job.effect.visit_id, None)
        self.pool.done(self.slot)
        try:
            job.cast.tell(WorkLost(visit_id=job.effect.visit_id, reason=f"utility slot {self.path} {cause}"))
        except CastorError:
            pass


def utility_pool_spec(settings: Any, runner: UtilityRunner) -> ChildSpec:
    """``/root/utility``: ``settings.utility_slots`` slots, ``settings.utility_queue_limit`` queued jobs,
    commands and built-ins run by ``runner``."""
    pool = UtilityPoolState(settings.utility_slots, settings.utility_queue_limit, runner)

    def slot_factory(n: int) -> Callable[[], UtilityExecutorActor]:
        return lambda: UtilityExecutorActor(pool, n)

    slots = [tree.UTILITY_SLOT.child_spec(slot_factory(n), id=f"slot-{n}")
             for n in range(settings.utility_slots)]
    return tree.UTILITY.supervisor_spec(slots)
