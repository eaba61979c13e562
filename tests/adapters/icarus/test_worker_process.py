"""WorkerProcess against the real worker program and the reference backend."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import psutil
import pytest

from castor.adapters.icarus.launch import WorkerLaunch
from castor.adapters.icarus.worker_process import (
    IcarusCallError,
    WorkerProcess,
    next_request_id,
    reply_result,
)
from castor.adapters.icarus.worker_program import READY_LINE
from castor.messages.errors import CastorError, Conflict, ErrorCode, Timeout, WorkerCrashed, WorkerRetired
from tests.support.icarus import REFERENCE_ICARUS, gone
from tests.support.icarus import read_jsonl as read_call_log
from tests.support.waiting import wait_for


def call(worker: WorkerProcess, module: str, function: str, *args, deadline_s: float | None = 10, **kwargs):
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    reply = worker.call(next_request_id(), module, function, list(args), kwargs, deadline)
    return reply_result(reply, f"{module}.{function}")


def test_lazy_spawn_and_persistent_state(harness):
    worker = harness.worker()
    assert worker.pid is None and not worker.started
    assert call(worker, "hooks", "counter") == 1
    pid = worker.pid
    assert call(worker, "hooks", "counter") == 2  # module globals persist: one process
    assert worker.pid == pid


def test_reply_carries_request_id_and_error_envelope(harness):
    worker = harness.worker()
    rid = next_request_id()
    reply = worker.call(rid, "hooks", "boom", [], {}, time.monotonic() + 10)
    assert reply["id"] == rid and reply["ok"] is False and reply["error"] == "boom"
    assert "ValueError" in reply["traceback"]
    with pytest.raises(IcarusCallError) as info:
        reply_result(reply, "hooks.boom")
    assert info.value.message == "boom" and info.value.data["reason"] == "backend_error"
    assert call(worker, "hooks", "counter") == 1  # the worker survived the exception


def test_a_function_the_package_lacks_is_not_found_and_never_ran(harness):
    """A package without the function asked for (an older or customised Icarus: no
    ``on_session_end``, no ``fabric_brief``) answered ``internal``, "may have started", with a
    traceback of castor's own worker program: an error of castor's, a function that might have
    acted. It is ``not_found`` (reason ``missing_function``), nothing ran, and the worker lives on."""
    worker = harness.worker()
    rid = next_request_id()
    reply = worker.call(rid, "tools", "fabric_no_such_tool", [{}], {}, time.monotonic() + 10)
    assert reply["id"] == rid and reply["ok"] is False
    with pytest.raises(CastorError) as info:
        reply_result(reply, "tools.fabric_no_such_tool")
    assert info.value.code == ErrorCode.NOT_FOUND
    assert info.value.data == {"reason": "missing_function", "target": "tools.fabric_no_such_tool",
                               "may_have_started": False}
    assert "fabric_no_such_tool" in info.value.message
    assert call(worker, "hooks", "counter") == 1  # the same worker, alive


def test_a_reply_larger_than_the_bound_fails_its_call_and_castor_never_holds_it(harness):
    """A runaway backend answering hundreds of megabytes: castor gathered the whole line, joined,
    decoded and parsed it (a 300 MB answer peaked castor at 1.2 GB, 470 MB kept after) only to
    find it too large to send on. A reply line over ``max_reply_bytes`` is now dropped as it
    arrives: its call fails (``internal``, reason ``reply_too_large``) and the worker, which kept
    its state, answers the next call."""
    worker = harness.worker(max_reply_bytes=1 << 20)
    assert call(worker, "hooks", "counter") == 1
    with pytest.raises(IcarusCallError) as info:
        call(worker, "hooks", "echo", "x" * (3 << 20))
    assert info.value.data["reason"] == "reply_too_large" and info.value.may_have_started is True
    assert "1048576" in info.value.message
    assert call(worker, "hooks", "counter") == 2  # the same process: nothing of the session was lost
    assert call(worker, "hooks", "echo", "y" * 1000) == {"args": ["y" * 1000], "kwargs": {}}
    assert worker.stats().garbage_lines == 0


def test_the_default_reply_bound_is_above_any_reply_a_frame_can_carry():
    """An answer that could still reach the harness is never cut: escaped JSON is at most three
    times the UTF-8 text it carries ("\\u00e9" for a two-byte "é"), and a frame holds 16 MiB."""
    from castor.adapters.icarus.worker_process import MAX_REPLY_BYTES
    from castor.endpoint.framing import FrameLimits

    assert MAX_REPLY_BYTES >= 3 * FrameLimits().max_buffer_size


def test_tool_call_shape_reaches_backend(harness):
    worker = harness.worker()
    result = call(worker, "tools", "fabric_search", {"query": "q"})
    assert result == {"query": "q", "count": 0, "results": []}
    (record,) = harness.calls("tools.fabric_search")
    assert record["args"] == [{"query": "q"}] and record["kwargs"] == {}


def test_identity_env_reaches_backend(harness):
    worker = harness.worker()
    ident = call(worker, "state", "identity")
    assert ident["fabric_dir"] == str(harness.fabric)
    assert ident["agent"] == "test-agent" and ident["project_id"] == "test-project"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (' {"x": [1, 2]} ', {"x": [1, 2]}),
        ("[1, 2]", [1, 2]),
        ("[fabric] not json", "[fabric] not json"),
        ("  {broken ", "  {broken "),  # the original, unstripped string
        ("plain", "plain"),
        (None, None),
    ],
)
def test_json_looking_strings_are_normalised(harness, value, expected):
    worker = harness.worker()
    assert call(worker, "hooks", "identity", value) == expected


@pytest.mark.timeout(60)
def test_a_json_text_result_goes_on_the_reply_line_as_the_backend_wrote_it(harness):
    """A backend's JSON text (Fabric's tools answer ``json.dumps(...)``) was parsed by the worker
    and encoded again for the reply line: a 10 KiB answer paid a second encoding of every
    character (about a third of the worker's instructions a call). Parsed, it is checked as before;
    sendable as it is -- ASCII, one line, no NaN or infinity -- it goes on the line unchanged."""
    from castor.adapters.icarus.launch import WORKER_PROGRAM

    launch = harness.launch()
    text = '{"b":1,"a":[1.5,"x",{"c":null}]}'
    request = json.dumps({"id": 7, "module": "hooks", "function": "identity", "args": [" " + text + "\n"]})
    done = subprocess.run([sys.executable, "-u", str(WORKER_PROGRAM)], input=request.encode() + b"\n",
                          capture_output=True, env=dict(launch.env), cwd=launch.cwd, timeout=30)
    lines = done.stdout.splitlines()
    assert lines[0] + b"\n" == READY_LINE, done.stderr[-2000:]
    assert lines[1] == b'{"id": 7, "ok": true, "result": ' + text.encode() + b"}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1, "a": 2}', {"a": 2}),  # the last of a repeated key, as json.loads
        ("[12345678901234567890, 1.0e-7, 0.1, -0.0, 2.5E3, true, false, null]",
         [12345678901234567890, 1.0e-7, 0.1, -0.0, 2500.0, True, False, None]),
        ('["\\ud800x", "\\u00e9\\n"]', ["\ufffdx", "\u00e9\n"]),  # a lone surrogate becomes U+FFFD
        ('{"\u00e9": "\u00fc \u2603"}', {"\u00e9": "\u00fc \u2603"}),  # not ASCII: encoded again, as before
        ('{\n  "a": [1,\r\n 2]\n}', {"a": [1, 2]}),  # on several lines: encoded again, as before
        ("[[[[[[[[[[[]]]]]]]]]]]", [[[[[[[[[[[]]]]]]]]]]]),
        ("[1] [2]", "[1] [2]"),  # more than one value: not JSON, the string itself
        ('{"a": 1}}', '{"a": 1}}'),
        ('{"a": tru}', '{"a": tru}'),
    ],
)
@pytest.mark.timeout(60)
def test_a_json_text_result_reaches_castor_as_its_parse(harness, text, expected):
    worker = harness.worker()
    result = call(worker, "hooks", "identity", text)
    assert result == expected
    assert json.dumps(result) == json.dumps(expected)  # -0.0 stays -0.0, ints stay ints


@pytest.mark.parametrize("text", ["[1e400]", "[-1e999]", "[-Infinity]", '{"a": Infinity}', "[NaN]"])
@pytest.mark.timeout(60)
def test_a_json_text_with_a_non_finite_number_is_still_unserializable(harness, text):
    worker = harness.worker()
    reply = worker.call(next_request_id(), "hooks", "identity", [text], {}, time.monotonic() + 10)
    assert reply["ok"] is False and reply["error"] == "unserializable result"
    assert call(worker, "hooks", "counter") == 1


def test_nan_result_is_reported_not_emitted(harness):
    worker = harness.worker()
    reply = worker.call(next_request_id(), "hooks", "identity", ["[NaN]"], {}, time.monotonic() + 10)
    assert reply["ok"] is False and reply["error"] == "unserializable result"
    assert call(worker, "hooks", "counter") == 1


def test_sequential_calls_run_in_order(harness):
    worker = harness.worker()
    for tag in ("a", "b", "c"):
        call(worker, "hooks", "sleep", ms=20 if tag == "a" else 0, tag=tag)
    records = [r for r in harness.calls("hooks.sleep")]
    assert [r["kwargs"]["tag"] for r in records] == ["a", "b", "c"]


def test_stdout_noise_python_and_native_does_not_corrupt_protocol(harness):
    worker = harness.worker()
    assert call(worker, "hooks", "noisy") == "ok"
    assert call(worker, "hooks", "native_noise") == "ok"
    assert call(worker, "hooks", "counter") == 1
    stats = worker.stats()
    assert stats.garbage_lines == 0 and stats.mismatched_replies == 0
    wait_for(lambda: "raw fd 1 noise" in worker.stderr_tail(), timeout=5, what="the raw fd 1 noise on stderr")
    tail = worker.stderr_tail()
    for text in ("python-level noise", "fd-level noise", "native printf noise", "raw fd 1 noise"):
        assert text in tail


def test_noise_during_imports_and_controls(harness):
    # The control makes every pre_llm_call print at both levels before running.
    worker = harness.worker(harness.launch(ICARUS_REF_CONTROLS='{"hooks.pre_llm_call": {"noise": true}}'))
    assert call(worker, "hooks", "pre_llm_call", user_message="anything") is None
    assert worker.stats().garbage_lines == 0


def test_planted_json_py_in_project_is_not_imported(harness):
    (harness.project / "json.py").write_text("raise RuntimeError('project json.py was imported')\n")
    (harness.project / "importlib.py").write_text("raise RuntimeError('project importlib.py was imported')\n")
    # Even a relative "." and the project itself on the inherited PYTHONPATH are dropped.
    launch = harness.launch(PYTHONPATH=os.pathsep.join([".", str(harness.project), ""]))
    worker = harness.worker(launch)
    where = call(worker, "hooks", "where")
    assert where["cwd"] == str(harness.project)
    assert not where["json_module"].startswith(str(harness.project))
    assert all(not p.startswith(str(harness.project)) and os.path.isabs(p) for p in where["sys_path"])


def test_decoy_icarus_on_pythonpath_is_not_loaded(harness, tmp_path):
    decoy_root = tmp_path / "decoy"
    (decoy_root / "icarus").mkdir(parents=True)
    (decoy_root / "icarus" / "__init__.py").write_text("DECOY = True\n")
    (decoy_root / "icarus" / "hooks.py").write_text("def where():\n    return 'decoy'\n")
    base = harness.launch()
    # Put the decoy FIRST, ahead of everything the bridge would add.
    env = dict(base.env, PYTHONPATH=os.pathsep.join([str(decoy_root), base.env["PYTHONPATH"]]))
    worker = harness.worker(WorkerLaunch(argv=base.argv, cwd=base.cwd, env=env, icarus_dir=base.icarus_dir))
    where = call(worker, "hooks", "where")
    assert where["reference"] is True
    assert where["package"] == str(REFERENCE_ICARUS / "__init__.py")


def test_timeout_raises_and_kills_the_tree_without_reading_further(harness):
    worker = harness.worker()
    grandchild = call(worker, "hooks", "spawn_sleeper", 60)
    pid = worker.pid
    with pytest.raises(Timeout) as info:  # a 60 s sleep: only the deadline (0.3 s) can end the call first
        call(worker, "hooks", "sleep", 60, deadline_s=0.3)
    assert info.value.code == ErrorCode.TIMEOUT and info.value.may_have_started is True
    assert gone(pid) and gone(grandchild)
    assert worker.state() == "retired"
    # The timed-out call started but never finished; a later call is refused without a write.
    assert len(harness.calls("hooks.sleep")) == 1 and harness.calls("hooks.sleep", phase="end") == []
    with pytest.raises(WorkerRetired) as later:
        call(worker, "hooks", "counter")
    assert later.value.may_have_started is False
    assert harness.calls("hooks.counter") == []


def test_external_sigkill_mid_call_raises_worker_crashed_promptly(harness):
    worker = harness.worker()
    call(worker, "hooks", "counter")
    outcome: dict = {}
    entered = threading.Event()

    def run():
        entered.set()
        try:
            call(worker, "hooks", "sleep", 30, deadline_s=30)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    assert entered.wait(5)
    wait_for(lambda: harness.calls("hooks.sleep"), timeout=5, what="the sleep call to start")
    os.kill(worker.pid, signal.SIGKILL)
    thread.join(15)  # the call's own deadline is 30 s: only the kill can end it first
    assert not thread.is_alive()
    error = outcome["error"]
    assert isinstance(error, WorkerCrashed)  # not Timeout: the kill ended it, not the deadline
    assert error.data["exit_code"] == -signal.SIGKILL
    # what the tool's caller reads: the signal by name, not a negative exit code ("code -9")
    assert error.message == "icarus worker ended (killed by SIGKILL) during hooks.sleep", error.message


def test_crash_mid_call_reports_exit_code_and_stderr_tail(harness):
    worker = harness.worker()
    call(worker, "hooks", "noisy")
    with pytest.raises(WorkerCrashed) as info:
        call(worker, "hooks", "crash", 7)
    assert info.value.data["exit_code"] == 7 and info.value.may_have_started is True
    assert info.value.message == "icarus worker ended (exit code 7) during hooks.crash", info.value.message
    assert "python-level noise" in info.value.stderr_tail
    assert "stderr_tail" not in info.value.data  # diagnostics never cross the wire
    with pytest.raises(WorkerCrashed):
        call(worker, "hooks", "counter")


def test_control_crash_on_a_tool(harness):
    worker = harness.worker(harness.launch(ICARUS_REF_CONTROLS='{"tools.fabric_write": {"crash": 5}}'))
    with pytest.raises(WorkerCrashed) as info:
        call(worker, "tools", "fabric_write", {"type": "n", "summary": "s", "content": "c"})
    assert info.value.data["exit_code"] == 5
    assert harness.calls("tools.fabric_write", phase="end") == []


def test_kill_tree_from_another_thread_wakes_blocked_call(harness):
    worker = harness.worker()
    call(worker, "hooks", "counter")
    result: dict = {}

    def run():
        try:
            call(worker, "hooks", "sleep", 30, deadline_s=30)
        except Exception as exc:  # noqa: BLE001 - the test records whatever the call raised
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    wait_for(lambda: harness.calls("hooks.sleep"), timeout=5, what="the sleep call to start")
    pid = worker.pid
    worker.kill_tree("cancelled")
    thread.join(15)  # the call's own deadline is 30 s: only the kill can end it first
    assert not thread.is_alive()
    assert isinstance(result["error"], WorkerRetired)  # not Timeout: the kill woke it
    assert result["error"].data["reason"] == "cancelled"
    assert gone(pid)
    worker.kill_tree("again")  # idempotent


def test_kill_tree_of_a_reaped_worker_never_signals_the_process_that_has_its_pid_now(harness):
    """Once the worker is reaped its pid may be given to an unrelated process (pids wrap at 32,768
    on many hosts): a kill_tree then must not end that process, its children or its group. The
    reuse is staged: the reaped worker's Popen is pointed at an innocent session leader's pid."""
    worker = harness.worker()
    call(worker, "hooks", "counter")
    os.kill(worker.pid, signal.SIGKILL)
    proc = worker._proc
    proc.wait(10)  # reaped, as a poll() on the call path reaps a dead worker
    innocent = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    try:
        wait_for(lambda: psutil.Process(innocent.pid).children() or None, timeout=10, what="the innocent's child")
        child = psutil.Process(innocent.pid).children()[0]
        proc.pid = innocent.pid  # the worker's pid is the innocent's now
        worker.kill_tree("retired after a crash")
        assert innocent.poll() is None and child.is_running(), "kill_tree signalled a pid that was not the worker's"
    finally:
        os.killpg(innocent.pid, signal.SIGKILL)
        innocent.wait(10)


def test_concurrent_call_is_refused(harness):
    worker = harness.worker()
    call(worker, "hooks", "counter")
    thread = threading.Thread(target=lambda: call(worker, "hooks", "sleep", ms=500))
    thread.start()
    wait_for(lambda: harness.calls("hooks.sleep"), timeout=5, what="the sleep call to start")
    with pytest.raises(Conflict):
        call(worker, "hooks", "counter")
    thread.join(5)
    assert call(worker, "hooks", "counter") == 2


def test_stderr_tail_is_bounded(harness):
    worker = harness.worker(stderr_max_lines=50, stderr_max_bytes=2000)
    assert call(worker, "hooks", "spew", 5000, 100) == 5000
    assert call(worker, "hooks", "counter") == 1  # a full stderr pipe never blocked the child
    lines, size = worker.stats().stderr_tail_lines, worker.stats().stderr_tail_bytes
    assert lines <= 50 and size <= 2000
    assert len(worker.stderr_tail()) <= 2000 + 50


def test_spawn_failure_is_typed_and_prompt(harness):
    worker = harness.worker(harness.launch(harness.settings(python="/nonexistent/python")))
    began = time.monotonic()
    with pytest.raises(WorkerCrashed) as info:
        call(worker, "hooks", "counter", deadline_s=10)
    assert time.monotonic() - began < 1.0  # at once, not at the call's deadline
    assert info.value.data["reason"] == "spawn_failed" and info.value.may_have_started is False


def test_request_ids_unique_across_workers_and_threads(harness):
    seen: list[list[int]] = [[] for _ in range(4)]

    def take(slot):
        for _ in range(2000):
            seen[slot].append(next_request_id())

    threads = [threading.Thread(target=take, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [i for ids in seen for i in ids]
    assert len(set(flat)) == len(flat)
    assert all(ids == sorted(ids) for ids in seen)
    first, second = harness.worker(), harness.worker()
    a, b = next_request_id(), next_request_id()
    assert first.call(a, "hooks", "counter", [], {}, time.monotonic() + 10)["id"] == a
    assert second.call(b, "hooks", "counter", [], {}, time.monotonic() + 10)["id"] == b
    assert b > a > max(flat)


def test_stats_report_process_resources(harness):
    worker = harness.worker()
    call(worker, "hooks", "counter")
    stats = worker.stats()
    assert stats.alive and stats.pid == worker.pid and stats.state == "running"
    assert stats.rss_bytes and stats.rss_bytes > 1_000_000
    assert stats.num_fds and stats.calls == 1


# --------------------------------------------------------------------------- stream hygiene
# A non-castor "worker" (a program that writes the ready line, then anything) writes to the
# protocol stream directly; the bridge must survive and report it.

_FAKE = r"""
import json, sys
sys.stdout.write('{"ready": "castor-icarus-worker"}\n')
sys.stdout.flush()
for line in sys.stdin:
    req = json.loads(line)
    if req["function"] == "garbage":
        sys.stdout.write("this is not json\n")
    elif req["function"] == "wrong_id":
        sys.stdout.write(json.dumps({"id": req["id"] + 1000, "ok": True, "result": "stale"}) + "\n\n")
    sys.stdout.write(json.dumps({"id": req["id"], "ok": True, "result": req["function"]}) + "\n")
    sys.stdout.flush()
"""


def _fake_worker(harness):
    launch = WorkerLaunch(argv=(sys.executable, "-u", "-c", _FAKE), cwd=str(harness.project),
                          env=dict(os.environ), icarus_dir=str(REFERENCE_ICARUS))
    return harness.worker(launch)


def test_a_line_that_is_not_a_reply_is_dropped_and_counted_and_the_call_gets_its_reply(harness):
    """pi-icarus-hook's rule: a non-JSON line on the worker's stdout, then a valid reply -- the
    valid one resolves. castor failed the call (``protocol_garbage``) and dropped its reply."""
    worker = _fake_worker(harness)
    assert call(worker, "hooks", "garbage") == "garbage"
    assert call(worker, "hooks", "after") == "after"
    stats = worker.stats()
    assert stats.garbage_lines == 1 and stats.mismatched_replies == 0


def test_mismatched_reply_ids_are_discarded_and_counted(harness):
    worker = _fake_worker(harness)
    assert call(worker, "hooks", "wrong_id") == "wrong_id"
    assert worker.stats().mismatched_replies == 1


# --------------------------------------------------------------------------- raw protocol

def _raw(harness):
    launch = harness.launch()
    proc = subprocess.Popen(list(launch.argv), cwd=launch.cwd, env=launch.env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout.readline() == READY_LINE  # the program's first line, before any request
    return proc


def _exchange(proc, lines: list[bytes], replies: int) -> list[dict]:
    import json

    proc.stdin.write(b"".join(lines))
    proc.stdin.flush()
    return [json.loads(proc.stdout.readline()) for _ in range(replies)]


def test_malformed_request_lines_get_errors_and_the_loop_survives(harness):
    proc = _raw(harness)
    try:
        replies = _exchange(proc, [
            b"not json\n",
            b"[1, 2]\n",
            b'{"id": 5, "module": "os", "function": "system", "args": ["true"]}\n',
            b'{"id": 6, "module": "hooks", "function": "__import__"}\n',
            b'{"id": 7, "module": "hooks", "function": "counter", "args": {}}\n',
            b"\xff\xfe\n",
            b"\n",
            b'{"id": 8, "module": "hooks", "function": "counter"}\n',
        ], 7)
    finally:
        proc.kill()
        proc.wait()
    assert [r["id"] for r in replies] == [None, None, 5, 6, 7, None, 8]
    assert all(r["ok"] is False for r in replies[:-1])
    assert "module must be one of" in replies[2]["error"]
    assert replies[-1] == {"id": 8, "ok": True, "result": 1}


def test_pipelined_requests_execute_in_arrival_order(harness):
    proc = _raw(harness)
    try:
        replies = _exchange(proc, [
            b'{"id": 1, "module": "hooks", "function": "sleep", "kwargs": {"ms": 200, "tag": "first"}}\n',
            b'{"id": 2, "module": "hooks", "function": "sleep", "kwargs": {"ms": 0, "tag": "second"}}\n',
        ], 2)
    finally:
        proc.kill()
        proc.wait()
    assert [r["id"] for r in replies] == [1, 2]
    assert [r["kwargs"]["tag"] for r in harness.calls("hooks.sleep")] == ["first", "second"]
    # One at a time: the first finished before the second started.
    order = [(r["phase"], r["seq"]) for r in read_call_log(harness.call_log) if r["call"] == "hooks.sleep"]
    assert order == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]


def test_worker_program_module_list_matches_the_domain():
    import ast
    from pathlib import Path

    from castor.adapters.icarus import launch
    from castor.domain.icarus.worker_protocol import ALLOWED_MODULES

    tree = ast.parse(Path(launch.WORKER_PROGRAM).read_text())
    assigned = {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "ALLOWED_MODULES"}
    assert assigned["ALLOWED_MODULES"] == ALLOWED_MODULES


# --------------------------------------------------------------------------- hostile backends

def _backend(harness, tmp_path, source: str, **kwargs: Any) -> WorkerProcess:
    """A worker on a one-module backend written here (the private plugin cannot exist in tests)."""
    backend = tmp_path / "hostile_icarus"
    backend.mkdir()
    (backend / "__init__.py").write_text("")
    (backend / "tools.py").write_text(source)
    return harness.worker(harness.launch(harness.settings(icarus_dir=str(backend))), **kwargs)


def test_a_lone_surrogate_in_backend_text_is_replaced_not_a_crash(harness, tmp_path):
    worker = _backend(harness, tmp_path, 'def text():\n    return "bad \\ud800 memory"\n'
                                         'def escaped():\n    return \'{"text": "bad \\\\ud800 memory"}\'\n')
    assert call(worker, "tools", "text") == "bad \ufffd memory"
    assert call(worker, "tools", "escaped") == {"text": "bad \ufffd memory"}  # JSON text is parsed on the way
    assert worker.usable  # the same worker goes on


@pytest.mark.parametrize("escape, text", [
    ("\\ud800", "\ufffd"), ("\\uDFFF", "\ufffd"), ("\\uDc00", "\ufffd"),  # lone, any case of hex digit
    ("\\ud83d\\ude00", "\U0001f600"),  # a pair is one astral character, kept
    ("\\u00e9", "\u00e9"), ("\\\\ud800", "\\ud800"),  # not a surrogate; an escaped backslash
])
def test_a_reply_line_is_checked_for_every_surrogate_escape(escape, text):
    from castor.adapters.icarus.worker_process import _decode_reply

    reply = _decode_reply(('{"id": 1, "ok": true, "result": "a' + escape + 'b"}').encode())
    assert reply == {"id": 1, "ok": True, "result": "a" + text + "b"}
    reply["result"].encode("utf-8")  # well formed: it can be audited and sent on


def test_arguments_json_cannot_carry_are_refused_before_anything_is_sent(harness, tmp_path):
    worker = _backend(harness, tmp_path, "def echo(x):\n    return x\n")
    assert call(worker, "tools", "echo", 1) == 1
    pid = worker.pid
    with pytest.raises(CastorError) as refused:
        call(worker, "tools", "echo", float("nan"))
    assert refused.value.code == ErrorCode.INVALID_PARAMS and refused.value.may_have_started is False
    assert worker.usable and worker.pid == pid and call(worker, "tools", "echo", 2) == 2


@pytest.mark.timeout(60)
def test_a_stderr_flood_without_newlines_keeps_memory_bounded(harness, tmp_path):
    import psutil

    worker = _backend(harness, tmp_path, "import os\ndef flood():\n"
                                         "    for _ in range(200):\n        os.write(2, b'E' * (1 << 20))\n"
                                         "    return 'done'\n")
    before = psutil.Process().memory_info().rss
    assert call(worker, "tools", "flood", deadline_s=50) == "done"
    assert psutil.Process().memory_info().rss - before < 64 * 1024 * 1024  # 200 MiB went through the pipe
    assert len(worker.stderr_tail()) <= 64 * 1024


UNPRINTABLE_HOOKS = '''
class Unprintable:
    def __str__(self):
        raise RuntimeError("no text")


class UnprintableError(Exception):
    def __str__(self):
        raise RuntimeError("no text")


def returns_unprintable():
    return {"value": Unprintable()}


def raises_unprintable():
    raise UnprintableError()


def counter():
    global _n
    _n = globals().get("_n", 0) + 1
    return _n
'''


@pytest.mark.timeout(30)
def test_a_value_or_an_error_whose_str_raises_is_an_error_reply_and_the_worker_lives_on(harness, tmp_path):
    """The worker encoded a result's odd values with ``str`` and caught only the encoder's usual
    errors, and wrote a failure's ``str(exc)`` unguarded: a backend value or exception whose
    ``__str__`` raises ended the worker (exit 1: its state gone, every queued call failed)."""
    package = tmp_path / "pkg" / "icarus"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "hooks.py").write_text(UNPRINTABLE_HOOKS)
    worker = harness.worker(harness.launch(harness.settings(icarus_dir=str(package))))
    assert call(worker, "hooks", "counter") == 1
    pid = worker.pid
    reply = worker.call(next_request_id(), "hooks", "returns_unprintable", [], {}, time.monotonic() + 10)
    assert reply["ok"] is False and reply["error"] == "unserializable result"
    reply = worker.call(next_request_id(), "hooks", "raises_unprintable", [], {}, time.monotonic() + 10)
    assert reply["ok"] is False and reply["error"] == "UnprintableError"
    assert call(worker, "hooks", "counter") == 2 and worker.pid == pid  # the same process, its state kept


def test_output_before_the_program_runs_is_dropped_not_the_first_calls_reply(harness, tmp_path):
    """A wrapper script that prints a banner, or a sitecustomize that prints, writes to the pipe
    before castor's program has isolated stdout: the first call of every worker failed as
    "non-protocol line" (and a startup context was lost). The parent now reads up to the
    program's ready line and drops the rest, counted as noise."""
    base = harness.launch()
    wrapper = WorkerLaunch(argv=("/bin/sh", "-c", 'echo "Welcome to the venv"; echo "{half"; exec "$0" "$@"',
                                 *base.argv), cwd=base.cwd, env=base.env, icarus_dir=base.icarus_dir)
    worker = harness.worker(wrapper)
    assert call(worker, "hooks", "identity", 41) == 41
    assert worker.stats().garbage_lines == 2
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("print('sitecustomize says hello')\n")
    env = {**base.env, "PYTHONPATH": base.env["PYTHONPATH"] + os.pathsep + str(site)}
    worker = harness.worker(WorkerLaunch(argv=base.argv, cwd=base.cwd, env=env, icarus_dir=base.icarus_dir))
    assert call(worker, "hooks", "identity", 42) == 42
    assert worker.stats().garbage_lines == 1


def test_output_without_a_newline_before_the_program_runs_still_lets_its_ready_line_through(harness, tmp_path):
    """A banner without a newline (``printf``, ``sys.stdout.write`` in a sitecustomize) makes one
    line of itself and the program's ready line: the ready line was never seen, and the first call
    of every worker waited out its deadline (a ``timeout`` that killed the worker, and the next
    one the same). The ready line at the end of such a line counts now; what came before is
    dropped and counted as noise."""
    base = harness.launch()
    wrapper = WorkerLaunch(argv=("/bin/sh", "-c", 'printf "Welcome, no newline"; exec "$0" "$@"', *base.argv),
                           cwd=base.cwd, env=base.env, icarus_dir=base.icarus_dir)
    worker = harness.worker(wrapper)
    assert call(worker, "hooks", "identity", 41, deadline_s=10) == 41
    assert worker.stats().garbage_lines == 1
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.stdout.write('x' * 200000)\nsys.stdout.flush()\n")
    env = {**base.env, "PYTHONPATH": base.env["PYTHONPATH"] + os.pathsep + str(site)}
    worker = harness.worker(WorkerLaunch(argv=base.argv, cwd=base.cwd, env=env, icarus_dir=base.icarus_dir))
    assert call(worker, "hooks", "identity", 42, deadline_s=10) == 42
    assert call(worker, "hooks", "identity", 43) == 43 and worker.usable


def test_a_worker_that_dies_before_it_is_ready_fails_the_call_as_not_started(harness):
    base = harness.launch()
    dead = WorkerLaunch(argv=("/bin/sh", "-c", "echo 'no python here'; exit 3"), cwd=base.cwd, env=base.env,
                        icarus_dir=base.icarus_dir)
    with pytest.raises(CastorError) as info:
        call(harness.worker(dead), "hooks", "identity", 1)
    assert info.value.code == "worker_crashed" and info.value.may_have_started is False


@pytest.mark.timeout(60)
def test_a_large_reply_is_read_in_time_linear_in_its_size(harness, tmp_path):
    """A reply line was gathered with ``buffer += chunk`` per 64 KiB read and the whole buffer
    searched for its newline after each one: quadratic, so a 48 MB value (a runaway recall) took
    about 15 s to read on a 2-core host and a 64 MB one 28 s, close to the 30 s default deadline,
    after which the worker is killed with its session's state. pi-icarus-hook reads it at once."""
    worker = _backend(harness, tmp_path, "def big(n):\n    return 'x' * n\n")
    size = 48 * 1000 * 1000
    assert len(call(worker, "tools", "big", size, deadline_s=8)) == size
    assert worker.usable


@pytest.mark.timeout(60)
def test_a_large_request_is_read_by_the_worker_in_time_linear_in_its_size(harness, tmp_path):
    """The worker program gathered request lines the same quadratic way (``buffered += chunk``)."""
    worker = _backend(harness, tmp_path, "def size(text):\n    return len(text)\n")
    size = 48 * 1000 * 1000
    assert call(worker, "tools", "size", "y" * size, deadline_s=8) == size
    assert worker.usable


@pytest.mark.timeout(30)
def test_a_json_looking_text_nested_too_deep_to_parse_is_returned_as_text(harness, tmp_path):
    """A string result that looks like JSON is parsed, and returned unchanged when it does not
    parse; one nested deeper than the parser's recursion limit raised ``RecursionError``, which
    the parse did not catch: the call failed (``internal``) instead of returning the text."""
    worker = _backend(harness, tmp_path, "def deep():\n    return ' ' + '[' * 100000 + ']' * 100000\n"
                                         "def fine():\n    return '[1]'\n")
    assert call(worker, "tools", "deep") == " " + "[" * 100000 + "]" * 100000  # unstripped, as written
    assert call(worker, "tools", "fine") == [1] and worker.usable


_TIMES_OUT = r'''
import json, sys, time
from castor.adapters.icarus.launch import build_launch
from castor.adapters.icarus.worker_process import WorkerProcess
from castor.domain.icarus.settings import IcarusSettings
from castor.messages.errors import Timeout
settings = IcarusSettings(icarus_dir=sys.argv[1], fabric_dir=sys.argv[2], python=sys.executable,
                          agent="a", project_id="p")
worker = WorkerProcess(build_launch(settings, cwd=sys.argv[3]))
worker.call(1, "hooks", "spawn_sleeper", [60], {}, time.monotonic() + 10)
started = time.monotonic()
try:
    worker.call(2, "hooks", "sleep", [60], {}, started + 0.3)
except Timeout:
    pass
print(json.dumps({"took": time.monotonic() - started}))
'''

# Adopts the orphans below it and never reaps them (as a container's PID 1 may not): it only
# waits for its own child, castor, and passes castor's output on.
_LAZY_REAPER = r'''
import ctypes, subprocess, sys
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
done = subprocess.run([sys.executable, "-c", sys.argv[1], *sys.argv[2:]], capture_output=True, text=True)
sys.stdout.write(done.stdout)
sys.stderr.write(done.stderr)
sys.exit(done.returncode)
'''


@pytest.mark.timeout(60)
def test_a_timeout_does_not_wait_for_someone_else_to_reap_the_workers_children(harness, tmp_path):
    """After killing the tree, castor waited until each of the worker's descendants had vanished;
    an orphan vanishes only when whoever adopted it (PID 1, a subreaper) reaps it. A container's
    PID 1 that reaps late or never held every timeout and close of a worker whose backend had
    started a process for 2 s more. Dead is dead: a zombie counts as ended now."""
    import json

    out = subprocess.run([sys.executable, "-c", _LAZY_REAPER, _TIMES_OUT, str(REFERENCE_ICARUS),
                          str(tmp_path / "fabric"), str(harness.project)], capture_output=True, text=True,
                         timeout=50, env={**os.environ, "PYTHONPATH": os.getcwd()}, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1])["took"] < 1.5


UNREADABLE_HOOKS = '''
import sys


def long_int():
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)  # as an interpreter before 3.11 has it: no limit
    return {"n": 10 ** 5000}


def deep():
    sys.setrecursionlimit(100000)
    value = []
    for _ in range(5000):
        value = [value]
    return value


def counter():
    global _n
    _n = globals().get("_n", 0) + 1
    return _n
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize("function", ["long_int", "deep"])
def test_a_reply_castor_cannot_read_fails_its_call_at_once_and_keeps_the_worker(harness, tmp_path, function):
    """A reply the worker could write but castor's parser cannot read (an integer of more than
    4,300 digits, which a worker Python before 3.11 writes; nesting past castor's recursion limit)
    was dropped as a line that is not a reply: its call waited out its deadline (30 s by default)
    and then the worker was killed with its session's state. The call fails at once now, as an
    unserializable result does, and the worker goes on."""
    package = tmp_path / "pkg" / "icarus"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "hooks.py").write_text(UNREADABLE_HOOKS)
    worker = harness.worker(harness.launch(harness.settings(icarus_dir=str(package))))
    assert call(worker, "hooks", "counter") == 1
    pid = worker.pid
    started = time.monotonic()
    with pytest.raises(IcarusCallError) as info:
        call(worker, "hooks", function, deadline_s=20)
    assert time.monotonic() - started < 5
    assert info.value.message.startswith("unreadable result") and info.value.may_have_started is True
    assert call(worker, "hooks", "counter") == 2 and worker.pid == pid  # the same process, its state kept


_STORAGE_BACKEND = '''
import errno, os, sqlite3

def os_full():
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/fabric/db")

def wrapped_read_only():
    try:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    except OSError as exc:
        raise RuntimeError("could not save the memory") from exc

def sqlite_full():
    raise sqlite3.OperationalError("database or disk is full")

def not_storage():
    raise ValueError("a bug of the backend")

def missing():
    raise FileNotFoundError(errno.ENOENT, "gone")
'''


def test_a_backend_the_storage_refused_is_storage_unavailable_not_internal(harness, tmp_path):
    """A backend that raised because the disk refused it (a full disk, a read-only one; an OSError,
    one it was raised from, or SQLite's own "database or disk is full") was ``internal``, castor's
    bug by the contract, and logged as one. The worker names the errno; the call answers
    ``storage_unavailable`` with ``data.errno``. Anything else a backend raises stays ``internal``."""
    worker = _backend(harness, tmp_path, _STORAGE_BACKEND)
    for function, name in (("os_full", "ENOSPC"), ("wrapped_read_only", "EROFS"), ("sqlite_full", "ENOSPC")):
        with pytest.raises(CastorError) as refused:
            call(worker, "tools", function)
        assert refused.value.code == ErrorCode.STORAGE_UNAVAILABLE, (function, refused.value.to_wire())
        assert refused.value.data["errno"] == name and refused.value.data["reason"] == "backend_error"
        assert refused.value.may_have_started is True
    for function in ("not_storage", "missing"):
        with pytest.raises(CastorError) as failed:
            call(worker, "tools", function)
        assert failed.value.code == ErrorCode.INTERNAL and "errno" not in failed.value.data, failed.value.to_wire()
    assert worker.usable


def test_worker_program_storage_errnos_match_castors():
    from castor.adapters import fs
    from castor.adapters.icarus import worker_program

    assert set(worker_program.STORAGE_ERRNOS) == {errno_name(n) for n in fs.STORAGE_ERRNOS}


def errno_name(number: int) -> str:
    import errno

    return errno.errorcode[number]


PROTOCOL_WRITER = '''
import os, stat, fcntl, threading


def _reply_channel():
    """The worker program's reply pipe (fd 1 is stderr's by now): backend code that finds it."""
    err = os.fstat(2)
    for fd in range(3, 64):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if stat.S_ISFIFO(st.st_mode) and (fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE) == os.O_WRONLY \\
                and (st.st_ino, st.st_dev) != (err.st_ino, err.st_dev):
            return fd


def _write(n):
    view = memoryview(b"z" * n)
    fd = _reply_channel()
    while view:
        view = view[os.write(fd, view):]


def spew(n):
    _write(n)
    return "spewed"


def spew_after(n):
    threading.Thread(target=_write, args=(n,)).start()  # blocks on the full pipe until castor reads
    return "spewing"


def ok():
    return "ok"


def spew_then_answer(n, size):
    _write(n)
    return "a" * size


def hang_up_and_live():
    os.close(_reply_channel())
    import time
    time.sleep(60)
'''


@pytest.mark.timeout(60)
def test_output_without_a_newline_on_the_reply_channel_is_dropped_and_the_call_still_gets_its_reply(harness, tmp_path):
    """Backend code writing to the reply channel without a newline (10 MB of it), during a call or
    between calls: what it wrote and the call's reply then make one line, which was dropped whole
    as garbage -- the call waited out its deadline and its worker was killed with the session's
    state, blamed for output that came before it. The reply at the line's end is the call's now:
    the garbage before it is counted and dropped, and the worker goes on."""
    worker = _backend(harness, tmp_path, PROTOCOL_WRITER)
    assert call(worker, "tools", "ok") == "ok"
    assert call(worker, "tools", "spew", 10_000_000) == "spewed"
    assert call(worker, "tools", "spew_after", 10_000_000) == "spewing"  # goes on between the calls
    import select

    waiting = select.poll()
    waiting.register(worker._out_fd, select.POLLIN)
    wait_for(lambda: waiting.poll(0), timeout=10, what="the output between calls to arrive")
    assert call(worker, "tools", "ok") == "ok"
    assert call(worker, "tools", "ok") == "ok"
    assert worker.usable and worker.stats().garbage_lines >= 2


@pytest.mark.timeout(60)
def test_output_without_a_newline_past_the_reply_bound_still_lets_the_reply_behind_it_through(harness, tmp_path):
    """More output without a newline than castor gathers of a line (``max_reply_bytes``; 1 MiB
    here, 64 MiB by default), then the call's reply: the line went over the bound and was dropped
    as it came -- the reply at its end with it -- and the call waited out its deadline, killing the
    worker with the session's state. castor now keeps looking, as it drops such output, for the
    call's reply (the worker program's reply head with its id): the reply comes through, the output
    is counted and dropped, the worker goes on; and no more than the bound is ever gathered. A reply
    that is itself over the bound, after such output, still fails ``reply_too_large``."""
    worker = _backend(harness, tmp_path, PROTOCOL_WRITER, max_reply_bytes=1 << 20)
    assert call(worker, "tools", "ok") == "ok"
    started = time.monotonic()
    assert call(worker, "tools", "spew", 3 << 20, deadline_s=20) == "spewed"
    assert time.monotonic() - started < 10
    assert call(worker, "tools", "spew_then_answer", 3 << 20, 1000) == "a" * 1000
    with pytest.raises(IcarusCallError) as info:
        call(worker, "tools", "spew_then_answer", 3 << 20, 2 << 20)
    assert info.value.data["reason"] == "reply_too_large"
    assert call(worker, "tools", "ok") == "ok" and worker.usable
    assert worker.stats().garbage_lines >= 2


@pytest.mark.timeout(120)
def test_output_without_a_newline_past_64_mib_still_lets_the_reply_behind_it_through(harness, tmp_path):
    """The same at the default bound: 70 MB of output without a newline, then the reply."""
    worker = _backend(harness, tmp_path, PROTOCOL_WRITER)
    assert call(worker, "tools", "spew", 70_000_000, deadline_s=60) == "spewed"
    assert call(worker, "tools", "ok") == "ok" and worker.usable


@pytest.mark.timeout(30)
def test_a_worker_that_closes_its_reply_channel_mid_call_and_lives_on_is_killed_and_said_so(harness, tmp_path):
    """A worker that closes its reply channel during a call and lives on: the call fails
    ``worker_crashed`` (it may have run) within about a second, the worker is killed (nothing left
    running), and the error says what happened -- it said "icarus worker ended (exit status
    unknown)" of a worker that had not ended; castor ended it."""
    worker = _backend(harness, tmp_path, PROTOCOL_WRITER)
    assert call(worker, "tools", "ok") == "ok"
    pid = worker.pid
    started = time.monotonic()
    with pytest.raises(WorkerCrashed) as info:
        call(worker, "tools", "hang_up_and_live", deadline_s=20)
    assert time.monotonic() - started < 5 and info.value.may_have_started is True
    assert info.value.data["reason"] == "reply_channel_closed", info.value.data
    assert "closed its reply channel" in info.value.message and "ended" not in info.value.message
    wait_for(lambda: gone(pid), timeout=5, what="the worker to be killed")
    assert not worker.usable


@pytest.mark.timeout(30)
def test_a_worker_stopped_across_its_deadline_times_out_and_is_killed_stopped(harness):
    """A worker SIGSTOPped mid-call (a debugger, a job-control stop) past the call's deadline: the
    call fails ``timeout`` at its deadline (it may have run), the stopped worker is killed (SIGKILL
    ends a stopped process) and reaped, nothing of it is left, and the worker is retired."""
    worker = harness.worker()
    assert call(worker, "hooks", "counter") == 1
    pid = worker.pid
    threading.Timer(0.2, lambda: os.kill(pid, signal.SIGSTOP)).start()
    started = time.monotonic()
    with pytest.raises(Timeout) as info:
        call(worker, "hooks", "sleep", 0.5, deadline_s=1.5)
    assert 1.4 < time.monotonic() - started < 4 and info.value.may_have_started is True
    assert gone(pid) and not worker.usable
    with pytest.raises(WorkerRetired):
        call(worker, "hooks", "counter")


@pytest.mark.timeout(60)
def test_a_request_with_long_strings_is_the_encoders_line_byte_for_byte():
    """A long string that needs no escape is written between quotes without the C encoder's
    escaping loop (a 10 KiB tool query: ~20 us a call): the line must be the one the encoder
    writes, whatever character sits in such a string, wherever the string is (a tool's params,
    a keyword argument, nested, a key), at the length bound and past it."""
    from castor.adapters.icarus.worker_process import _LONG_STRING, _encode_request

    def encoded(args, kwargs):
        return (json.dumps({"id": 2 ** 70, "module": "tools", "function": "f", "args": args, "kwargs": kwargs},
                           ensure_ascii=True, allow_nan=False) + "\n").encode()

    odd = [chr(c) for c in range(0x80)] + ["\u00e9", "\ud800", "\U0001f600", "\u2028"]
    for ch in odd:
        for n in (_LONG_STRING - 2, _LONG_STRING - 1, _LONG_STRING, 3 * _LONG_STRING):
            for text in ("x" * n + ch, ch + "y" * n, "z" * (n // 2) + ch + "z" * (n // 2)):
                for args, kwargs in (([{"query": text, "limit": 3}], {}), ([text, 1], {}),
                                     ([], {"user_message": text, "is_first_turn": False}),
                                     ([{"q": [text, {text: None}]}], {"k": [text]})):
                    assert _encode_request(2 ** 70, "tools", "f", args, kwargs) == encoded(args, kwargs), (ch, n)
