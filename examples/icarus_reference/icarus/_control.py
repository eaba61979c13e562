"""Test controls of the reference backend (STAND-IN; not part of real Icarus).

``traced`` wraps every public backend function: it appends a ``start`` record to
the call log *before* the function runs (so a call absent from the log never
executed), applies the configured faults, runs the function (its answer replaced
by the control ``result_json`` when one is set) and appends ``end``.
"""

import functools
import json
import os
import sys
import time

CALL_LOG_ENV = "ICARUS_REF_CALL_LOG"
CONTROLS_ENV = "ICARUS_REF_CONTROLS"
CONTROL_FILE_ENV = "ICARUS_REF_CONTROL_FILE"

_seq = 0


def _append_log(record):
    path = os.environ.get(CALL_LOG_ENV)
    if not path:
        return
    data = (json.dumps(record, default=str) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _controls_for(name):
    controls = {}
    raw = os.environ.get(CONTROLS_ENV)
    if raw:
        controls.update(json.loads(raw).get(name, {}))
    path = os.environ.get(CONTROL_FILE_ENV)
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            controls.update(json.load(handle).get(name, {}))
    return controls


def noise(tag):
    """Write to stdout at the Python level and straight to fd 1."""
    print("python-level noise from %s" % tag)
    sys.stdout.flush()
    os.write(1, ("fd-level noise from %s\n" % tag).encode())


def apply_faults(name):
    controls = _controls_for(name)
    if controls.get("noise"):
        noise(name)
    if controls.get("sleep_ms"):
        time.sleep(float(controls["sleep_ms"]) / 1000.0)
    if "crash" in controls:
        os._exit(int(controls["crash"]))
    if controls.get("raise"):
        raise RuntimeError(str(controls["raise"]))


def traced(module):
    def decorate(fn):
        name = "%s.%s" % (module, fn.__name__)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            global _seq
            _seq += 1
            base = {"pid": os.getpid(), "seq": _seq, "call": name}
            _append_log(dict(base, phase="start", args=list(args), kwargs=kwargs, t=time.time()))
            apply_faults(name)
            result = fn(*args, **kwargs)
            if "result_json" in _controls_for(name):  # the backend answers this text instead
                result = _controls_for(name)["result_json"]
            _append_log(dict(base, phase="end", t=time.time()))
            return result

        return wrapper

    return decorate


def read_call_log(path):
    """Parse a call log file (used by tests and the demo)."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
