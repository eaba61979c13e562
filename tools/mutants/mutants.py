"""The guarantee mutants: each breaks one promise of docs/reliability.md / docs/supervision.md.

A mutant is a name, the guarantee it breaks (the row of docs/reliability.md's "Promises" table, or
the docs/supervision.md section), one or more edits — ``(file, exact old snippet, new snippet)``,
each old snippet occurring exactly once in its file — and the test node ids that back the
guarantee, fastest killer first (they run with ``-x``).

Keep snippets small and on stable lines; when the code moves, the runner's drift check names the
mutant whose snippet no longer matches, and the snippet is updated here, never dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Edit:
    file: str
    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    name: str
    guarantee: str
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]


def mutant(name: str, guarantee: str, edits: list[tuple[str, str, str]], tests: list[str]) -> Mutant:
    return Mutant(name, guarantee, tuple(Edit(*e) for e in edits), tuple(tests))


SUP = "tests/supervision"
MAT = "tests/actors/materia"
ADA = "tests/adapters"
ADM = "tests/adapters/materia"
AIC = "tests/actors/icarus"

MUTANTS: list[Mutant] = [
    # ---- row 1: one failure model, restarts, intensity ---------------------------------------------
    mutant("ask-failure-does-not-crash", "R1 failure model",
           [("castor/supervision/actor.py",
             "                reply.fail(exc)\n            self._crash(exc, envelope)",
             "                reply.fail(exc)\n            if reply is None:\n"
             "                self._crash(exc, envelope)")],
           [f"{SUP}/test_strategies.py::test_restart_types",
            f"{SUP}/test_strategies.py::test_one_for_one_restarts_only_the_failed_child"]),
    mutant("failing-message-redelivered", "R1 failure model",
           [("castor/supervision/actor.py",
             "            handle.failed += 1\n            if reply is not None:\n                reply.fail(exc)\n"
             "            self._crash(exc, envelope)",
             "            handle.failed += 1\n            if reply is not None:\n                reply.fail(exc)\n"
             "            self.inbox.put_back(envelope)\n            self._crash(exc, envelope)")],
           [f"{SUP}/test_strategies.py::test_queued_messages_survive_a_restart_but_the_failing_one_is_not_redelivered"]),
    mutant("factory-base-exception-crashes-supervisor", "R1 failure model (a failed start is the starter's answer)",
           [("castor/supervision/supervisor.py",
             "        except BaseException as exc:  # noqa: BLE001 - the child's factory failed",
             "        except Exception as exc:  # noqa: BLE001 - the child's factory failed")],
           [f"{SUP}/test_hostile_use.py::"
            "test_a_child_whose_factory_raises_a_base_exception_is_refused_to_its_starter_like_any_failed_start"]),
    mutant("intensity-never-exceeded", "R1 failure model (R restarts in T s, then escalate)",
           [("castor/supervision/supervisor.py",
             "        if not self._intensity.allow():\n            raise RestartIntensityExceeded(\n",
             "        if False:\n            raise RestartIntensityExceeded(\n")],
           [f"{SUP}/test_escalation_and_shutdown.py::test_intensity_escalates_through_two_levels_to_a_fatal_root"]),
    mutant("child-never-given-up", "R1 failure model (a child past its own intensity is given up)",
           [("castor/supervision/supervisor.py",
             "if failed.intensity is not None and not failed.intensity.allow():",
             "if False and failed.intensity is not None and not failed.intensity.allow():")],
           [f"{SUP}/test_escalation_and_shutdown.py::test_a_child_past_its_own_intensity_is_given_up_without_failing_its_supervisor"]),
    # ---- row 2: no ask is ever stranded ---------------------------------------------------------------
    mutant("stranded-ask-race", "R2 no stranded ask",
           [("castor/supervision/mailbox.py",
             "        with self._lock:\n            if self._closed is not None:\n"
             "                if not self._revivable:\n                    self.rejected += 1\n"
             "                raise MailboxClosed(self._closed(), self._revivable)",
             "        closed = self._closed  # pykka's window: checked outside the lock that close() takes\n"
             "        time.sleep(0.0005)\n"
             "        with self._lock:\n            if closed is not None:\n"
             "                if not self._revivable:\n                    self.rejected += 1\n"
             "                raise MailboxClosed(self._closed(), self._revivable)")],
           [f"{SUP}/test_asks_and_mailboxes.py::test_no_ask_is_ever_stranded_by_a_racing_stop_crash_or_retirement"]),
    mutant("queued-asks-not-failed-on-close", "R2 no stranded ask",
           [("castor/supervision/handle.py",
             "            if envelope.reply is not None:\n                envelope.reply.fail(make())",
             "            if False:\n                envelope.reply.fail(make())")],
           [f"{SUP}/test_direct_start.py::test_a_crashed_direct_child_is_removed_and_its_queued_asks_fail",
            f"{SUP}/test_retirement.py::test_retire_rejects_every_queued_request_and_never_replays_it"]),
    mutant("ask-deadline-dropped", "R2 every ask has a deadline",
           [("castor/supervision/handle.py",
             "return PendingAsk(self, envelope, mailbox, now + (DEFAULT_ASK_TIMEOUT if timeout is None else timeout),"
             " now)",
             "return PendingAsk(self, envelope, mailbox, now + (1e9 if timeout is None else timeout), now)")],
           [f"{SUP}/test_default_deadlines.py"]),
    mutant("ask-default-deadline-infinite", "R2 every ask has a deadline",
           [("castor/supervision/handle.py", "DEFAULT_ASK_TIMEOUT = 10.0", "DEFAULT_ASK_TIMEOUT = 1e9")],
           [f"{SUP}/test_default_deadlines.py"]),
    mutant("may-have-started-wrong", "R2 a timed-out ask says whether it may have started",
           [("castor/supervision/handle.py", "may_have_started=not withdrawn,", "may_have_started=withdrawn,")],
           [f"{SUP}/test_asks_and_mailboxes.py::test_ask_timeout_says_whether_the_work_may_have_started"]),
    mutant("connection-call-deadline-dropped", "R2 every ask has a deadline (the endpoint's calls)",
           [("castor/endpoint/connection.py",
             "timeout = self.default_timeout if timeout is None else timeout",
             "timeout = 1e9 if timeout is None else timeout")],
           ["tests/endpoint/test_default_deadlines.py"]),
    mutant("harness-request-deadline-dropped", "R2 every ask has a deadline (the endpoint's calls to the harness)",
           [("castor/endpoint/harness_link.py",
             "timeout = UI_DEADLINE_S if deadline is None else",
             "timeout = None if deadline is None else")],
           ["tests/endpoint/test_default_deadlines.py"]),
    mutant("interrupted-call-left-open", "R2 no stranded call: a call interrupted from outside closes its connection",
           [("castor/endpoint/connection.py",
             'self.close("interrupted")',
             "pass")],
           ["tests/endpoint/test_interrupted_call.py"]),
    mutant("loop-heads-a-try", "R2 no stranded call: an interrupt at a loop's jump still hands the reader role back",
           [("castor/endpoint/connection.py",
             "            waited = False  # an instruction ahead of the loop, inside the try: see _read_as_caller\n",
             "")],
           ["tests/endpoint/test_lock_sections.py::test_no_loop_in_castor_heads_a_try"]),
    mutant("close-callbacks-on-the-writers-thread",
           "R2 no stranded close: a write that finds the peer gone closes its sessions on a thread of their own",
           [("castor/endpoint/connection.py",
             "self.close(overflow, callbacks_apart=True,  # any thread sends: an actor's, mid-handler",
             "self.close(overflow,  # any thread sends: an actor's, mid-handler")],
           ["tests/endpoint/test_connection.py::"
            "test_a_write_that_fails_closes_without_running_the_close_callbacks_on_the_writing_thread",
            f"{AIC}/test_session_endpoint.py::"
            "test_a_write_that_finds_the_peer_gone_on_the_hooks_thread_still_ends_the_icarus_session_at_once"]),
    mutant("icarus-client-ask-unbounded", "R2 every ask has a deadline (the Icarus client)",
           [("castor/actors/icarus/worker.py",
             "return self._handle.ask(message, timeout=timeout_s + ASK_GRACE_S)",
             "return self._handle.ask(message, timeout=1e9)")],
           [f"{AIC}/test_worker_default_deadline.py"]),
    # ---- supervision.md "Retirement" ------------------------------------------------------------------
    mutant("retirement-queue-not-rejected", "supervision: retirement rejects the queue, never replays it",
           [("castor/supervision/actor.py",
             "        handle.reject_all(reason, error, revivable=True, mailbox=self.inbox)\n",
             "")],
           [f"{SUP}/test_retirement.py::test_retire_rejects_every_queued_request_and_never_replays_it"]),
    mutant("retiring-answer-before-close", "supervision: a handler that retires its actor answers only once the "
           "mailbox is closed, so the asker's next send is new demand",
           [("castor/supervision/actor.py",
             "                self._close_for_retirement(*self._retire_request)  # before the answer: see there\n",
             "                pass\n")],
           [f"{SUP}/test_ask_after_a_retiring_failure.py"]),
    mutant("retired-child-restarted", "supervision: a retired child is never restarted",
           [("castor/supervision/supervisor.py",
             '        if message.kind is ExitKind.RETIRED:\n',
             '        if message.kind == "retired-never":\n')],
           [f"{SUP}/test_retirement.py::test_retire_rejects_every_queued_request_and_never_replays_it",
            f"{SUP}/test_retirement.py::test_a_retired_temporary_child_is_removed_not_revived"]),
    mutant("retired-temporary-child-kept", "supervision: a retired temporary child is removed, not revived",
           [("castor/supervision/supervisor.py",
             "            if not slot.handle.revive_on_demand:\n                self._remove(slot, \"retired\")",
             "            if False:\n                self._remove(slot, \"retired\")")],
           [f"{SUP}/test_retirement.py::test_a_retired_temporary_child_is_removed_not_revived"]),
    # ---- supervision.md: ordered, bounded shutdown; direct starts -----------------------------------
    mutant("shutdown-waits-for-a-stuck-child", "supervision: a child past its shutdown timeout is killed",
           [("castor/supervision/supervisor.py", "                slot.handle.abandon()\n",
             "                slot.handle.stop(60)\n")],
           [f"{SUP}/test_escalation_and_shutdown.py::test_a_child_that_overruns_its_shutdown_timeout_is_killed_and_shutdown_is_bounded"]),
    mutant("direct-child-outlives-supervisor", "supervision: no direct child outlives its supervisor",
           [("castor/supervision/supervisor.py",
             "            if self._closed:\n                return None\n            if path in self._slots:",
             "            if False:\n                return None\n            if path in self._slots:")],
           [f"{SUP}/test_direct_start.py::test_no_direct_child_outlives_a_supervisor_that_stops_while_they_start"]),
    # ---- row 3: the cast loses nothing -----------------------------------------------------------------
    mutant("incarnation-fence-off", "R3 a zombie incarnation cannot write",
           [("castor/adapters/materia/state_store.py",
             "if current is not None and incarnation < stored_incarnation:",
             "if False and current is not None and incarnation < stored_incarnation:")],
           [f"{ADM}/test_state_store.py::test_zombie_incarnation_is_refused_and_leaves_state_untouched"]),
    mutant("outbox-replay-skipped", "R3 the restarted CastActor replays the outbox",
           [("castor/actors/materia/cast_actor.py",
             "        self._replay_outbox(stored.state.get(OUTBOX_KEY) or [])\n",
             "")],
           [f"{MAT}/test_faults.py::test_restart_replays_the_last_transitions_file_effects_without_duplicates"]),
    mutant("outbox-replay-duplicates-events", "R3 replay never duplicates an event",
           [("castor/actors/materia/cast_actor.py",
             "                if json.dumps(json.loads(json.dumps(record)), sort_keys=True) not in seen_events:",
             "                if True:")],
           [f"{MAT}/test_faults.py::test_restart_replays_the_last_transitions_file_effects_without_duplicates"]),
    mutant("visit-id-reused", "R3/R4 lost work is re-dispatched under a new visit id",
           [("castor/domain/materia/engine.py", "    s.dispatch_seq += 1\n", "    s.dispatch_seq += 0\n")],
           [f"{MAT}/test_faults.py::test_late_duplicate_outcome_is_ignored_never_applied_twice",
            f"{MAT}/test_faults.py::test_killed_socket_actor_is_redispatched_and_its_late_outcome_ignored"]),
    mutant("stale-outcome-accepted", "R3 a late answer to an old visit is ignored",
           [("castor/domain/materia/engine.py",
             "    if s.pending is None or s.pending.kind != pending_kind or s.pending.visit_id != visit_id:",
             "    if s.pending is None or s.pending.kind != pending_kind:")],
           [f"{MAT}/test_faults.py::test_late_duplicate_outcome_is_ignored_never_applied_twice"]),
    mutant("stale-work-lost-accepted", "R3 a late loss report of an old visit is ignored",
           [("castor/actors/materia/cast_actor.py",
             "        if s is None or not s.active or s.pending is None or s.pending.visit_id != message.visit_id:",
             "        if s is None or not s.active or s.pending is None:")],
           [f"{MAT}/test_faults.py::test_late_duplicate_outcome_is_ignored_never_applied_twice"]),
    # ---- row 3/6: atomic durable state ------------------------------------------------------------------
    mutant("non-atomic-write", "R3/R6 state is saved atomically",
           [("castor/adapters/fs.py",
             "fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)",
             "fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)"),
            ("castor/adapters/fs.py",
             "        os.replace(tmp, target)\n    except BaseException as exc:",
             "        pass\n    except BaseException as exc:")],
           [f"{ADA}/test_atomic_write.py"]),
    mutant("file-fsync-dropped", "R3/R6 state is saved durably (file fsync before the rename)",
           [("castor/adapters/fs.py",
             "            _write_all(fd, data)\n            os.fsync(fd)\n",
             "            _write_all(fd, data)\n")],
           [f"{ADA}/test_atomic_write.py::test_temp_write_then_file_fsync_then_rename_then_directory_fsync_in_that_order"]),
    mutant("dir-fsync-dropped", "R3/R6 state is saved durably (directory fsync after the rename)",
           [("castor/adapters/fs.py",
             "    if sync_dir:\n        fsync_dir(directory)",
             "    if False:\n        fsync_dir(directory)")],
           [f"{ADA}/test_atomic_write.py::test_temp_write_then_file_fsync_then_rename_then_directory_fsync_in_that_order"]),
    # ---- row 4: at most one run of a utility command per dispatch ----------------------------------------
    mutant("duplicate-job-re-run", "R4 a duplicate job is answered from the ledger, never re-run",
           [("castor/actors/materia/utility_pool.py",
             "            if visit_id in self._ledger:\n                return self._ledger[visit_id]",
             "            if False:\n                return self._ledger[visit_id]")],
           [f"{MAT}/test_utilities.py::test_a_duplicate_job_is_never_run_twice_its_recorded_outcome_is_re_sent"]),
    mutant("running-duplicate-started", "R4 a duplicate of a running job is dropped",
           [("castor/actors/materia/utility_pool.py",
             '            if visit_id in self._running:\n                return "running"',
             '            if False:\n                return "running"')],
           [f"{MAT}/test_utilities.py::test_a_duplicate_of_a_running_job_is_dropped_not_started_again"]),
    mutant("visit-id-env-missing", "R4 the command sees CASTOR_VISIT_ID",
           [("castor/actors/materia/utility_pool.py",
             "env={**os.environ, VISIT_ID_ENV: effect.visit_id,",
             "env={**os.environ,")],
           [f"{MAT}/test_utilities.py::test_a_duplicate_job_is_never_run_twice_its_recorded_outcome_is_re_sent"]),
    # ---- row 5: the Icarus worker ----------------------------------------------------------------------
    mutant("worker-not-retired-on-timeout", "R5 a timed-out worker retires; its queue is rejected, never replayed",
           [("castor/actors/icarus/worker.py",
             '            self.retire(f"call {target} timed out", error=WorkerRetired)\n',
             ""),
            ("castor/actors/icarus/worker.py",  # and the next call quietly gets a fresh worker
             "if worker is None or worker.exited_while_idle():",
             "if worker is None or worker.exited_while_idle() or not worker.usable:")],
           [f"{AIC}/test_worker_actor.py::test_timeout_rejects_all_100_queued_calls_none_ever_executes"]),
    mutant("expired-call-sent-anyway", "R5 a call whose deadline passed in the queue is never sent",
           [("castor/actors/icarus/worker.py", "        if now >= deadline:\n", "        if False:\n")],
           [f"{AIC}/test_worker_actor.py::test_deadline_expired_in_queue_is_not_sent_and_keeps_the_worker"]),
    mutant("worker-queue-not-rejected-on-crash", "R5 a crashed worker retires; its queue is rejected",
           [("castor/actors/icarus/worker.py",
             '                self.retire(f"worker crashed during {target}{words}{tail}", error=WorkerCrashed)\n',
             "")],
           [f"{AIC}/test_worker_actor.py::test_crash_rejects_pending_with_worker_crashed"]),
    mutant("worker-crash-loop-never-given-up",
           "R5 a worker that dies in call after call is given up: calls refused at once, no process started",
           [("castor/actors/icarus/worker.py", "            wait_s = self._crash_loop.admit()\n",
             "            wait_s = None\n")],
           [f"{AIC}/test_worker_crash_loop.py::"
            "test_a_worker_that_dies_in_every_call_is_given_up_refused_at_once_said_once_and_recovers"]),
    # ---- row 6: the whole runtime process dies -----------------------------------------------------------
    mutant("lease-never-taken", "R6 a cast held by a live runtime is a conflict (flock lease)",
           [("castor/adapters/materia/cast_lease.py",
             "            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n        except BlockingIOError:\n"
             "            os.close(fd)\n            return None",
             "            pass\n        except BlockingIOError:\n            os.close(fd)\n            return None")],
           [f"{ADM}/test_cast_lease.py::test_one_holder_at_a_time_and_the_probe_sees_it"]),
    # ---- row 7: load beyond capacity --------------------------------------------------------------------
    mutant("string-length-read-to-the-frame-limit",
           "R7 bounded input: a string announced over its limit is refused at its header",
           [("castor/endpoint/connection.py",
             "refused = self._refused_at_a_header()",
             "refused = None")],
           ["tests/endpoint/test_connection.py::"
            "test_a_string_or_binary_announced_over_its_limit_closes_the_connection_at_its_header"]),
    mutant("mailbox-unbounded", "R7 a bounded mailbox rejects overflow at once",
           [("castor/supervision/mailbox.py",
             "if self.capacity is not None and len(self._queue) >= self.capacity:",
             "if False:")],
           [f"{SUP}/test_asks_and_mailboxes.py::test_a_bounded_mailbox_rejects_overflow_at_once_and_never_blocks_the_sender"]),
    mutant("utility-queue-unbounded", "R7 the utility pool's queue bound fails the visit DispatchFailed",
           [("castor/actors/materia/utility_pool.py",
             "if sum(self._load) >= self.slots + self.queue_limit:",
             "if False:")],
           [f"{MAT}/test_utilities.py::test_the_runtime_pool_refuses_a_job_past_its_queue_bound_and_the_cast_fails_the_visit"]),
]
