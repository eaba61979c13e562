"""STAND-IN for ``icarus.hooks``: the Hermes lifecycle hooks plus test hooks.

Every hook accepts ``**kwargs`` (Hermes adds fields over time). Context text uses
the real layout: sections joined by a blank line, a bracketed header line, items
indented by two spaces.
"""

import os
import subprocess
import sys
import time

from icarus import state
from icarus._control import noise, traced

_counter = 0


def _fabric_section(entries):
    lines = ["[fabric] relevant to your request:"]
    for e in entries:
        stamp = time.strftime("%Y-%m-%d", time.gmtime(e["ts"] or 0))
        lines.append("  [%s] %s: %s" % (stamp, e["agent"], e["summary"]))
    return "\n".join(lines)


def _facts_section(facts):
    return "\n".join(["[facts] durable facts about the user/environment:"] + ["  - " + f for f in facts])


@traced("hooks")
def on_session_start(session_id="", platform="", **kwargs):
    state.reset_session(session_id)
    text = os.environ.get("ICARUS_REF_STARTUP_CONTEXT", "")
    return {"context": text} if text else None


@traced("hooks")
def pre_llm_call(session_id="", user_message="", is_first_turn=False, platform="", **kwargs):
    sections = []
    warning = os.environ.get("ICARUS_REF_WARNING")
    if warning:
        sections.append("[memory-retrieval-warning]\n  " + warning)
    found = [e for e in state.search_entries(user_message, limit=8) if e["id"] not in state._injected_fabric]
    if found:
        state._injected_fabric.update(e["id"] for e in found)
        sections.append(_fabric_section(found))
    if is_first_turn:
        facts = state.facts()
        if facts:
            sections.append(_facts_section(facts))
    state.log_recall(user_message, [e["id"] for e in found], "pre_llm_call")
    return {"context": "\n\n".join(sections)} if sections else None


@traced("hooks")
def post_llm_call(session_id="", user_message="", assistant_response="", platform="", **kwargs):
    state.exchanges.append({"user": user_message, "assistant": assistant_response})
    state.db().execute(
        "INSERT INTO exchanges (ts, session_id, user_message, assistant_response) VALUES (?,?,?,?)",
        (time.time(), session_id, user_message, assistant_response))
    return None


@traced("hooks")
def on_session_end(session_id="", platform="", completed=False, **kwargs):
    return None


# ----------------------------------------------------------------------------- test hooks

@traced("hooks")
def counter():
    global _counter
    _counter += 1
    return _counter


@traced("hooks")
def sleep(seconds=0, ms=None, tag=None):
    time.sleep(float(ms) / 1000.0 if ms is not None else float(seconds))
    return {"slept": True, "tag": tag}


@traced("hooks")
def crash(code=3):
    os._exit(int(code))


@traced("hooks")
def noisy():
    noise("noisy")
    return "ok"


@traced("hooks")
def native_noise():
    """Write through C stdio (printf + fflush), as a native extension would."""
    import ctypes
    libc = ctypes.CDLL(None)
    libc.printf(b"native printf noise\n")
    libc.fflush(None)
    os.write(1, b"raw fd 1 noise\n")
    return "ok"


@traced("hooks")
def boom():
    raise ValueError("boom")


@traced("hooks")
def json_string():
    return '{"a": 1}'


@traced("hooks")
def bracket_text():
    return "[fabric] not json"


@traced("hooks")
def echo(*args, **kwargs):
    return {"args": list(args), "kwargs": kwargs}


@traced("hooks")
def where():
    import icarus
    return {"file": __file__, "package": icarus.__file__, "reference": getattr(icarus, "REFERENCE_BACKEND", False),
            "sys_path": list(sys.path), "cwd": os.getcwd(),
            "json_module": sys.modules["json"].__file__}


@traced("hooks")
def spawn_sleeper(seconds=60):
    """Start a grandchild process (to prove the whole tree is killed)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(%f)" % float(seconds)])
    return child.pid


@traced("hooks")
def identity(value=None):
    """Return ``value`` unchanged (to exercise the worker's JSON normalisation)."""
    return value


def _protocol_pipes():
    """The worker's protocol pipe ends (fd, access mode): every FIFO past stderr that is not stderr."""
    import fcntl
    import stat

    stderr_pipe = os.fstat(2).st_ino
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            info = os.fstat(fd)
            mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        except OSError:
            continue
        if fd > 2 and stat.S_ISFIFO(info.st_mode) and info.st_ino != stderr_pipe:
            found.append((fd, mode))
    return found


def _after(delay_ms, action):
    """Run ``action`` on a thread of its own ``delay_ms`` after now (this call's reply goes first)."""
    import threading

    def run():
        time.sleep(float(delay_ms) / 1000.0)
        action()

    threading.Thread(target=run, daemon=True).start()


@traced("hooks")
def hang_up(delay_ms=50):
    """After this call's reply, close the worker's reply channel (its protocol stdout) and live on:
    to the bridge the worker ended between calls while its process has not (yet) exited."""
    def close_reply_channel():
        for fd, mode in _protocol_pipes():
            if mode == os.O_WRONLY:
                os.close(fd)

    _after(delay_ms, close_reply_channel)
    return "hanging up"


@traced("hooks")
def close_input(delay_ms=50):
    """After this call's reply, close the worker's request channel (its protocol stdin) and become
    ``sleep 60`` (exec: the same process, its threads gone) keeping the reply channel open: to the
    bridge the worker can no longer be written to while its process has not exited and its stdout
    has not ended (a dying worker's files are closed before its exit shows)."""
    def become_a_sleeper():
        for fd, mode in _protocol_pipes():
            if mode == os.O_RDONLY:
                os.close(fd)
            else:
                os.set_inheritable(fd, True)  # the reply channel stays open in the sleeper
        os.execv("/bin/sleep", ["sleep", "60"])

    _after(delay_ms, become_a_sleeper)
    return "closing input"


@traced("hooks")
def spew(lines=1000, width=100):
    """Write many lines to stderr (to exercise the bridge's bounded stderr tail)."""
    for i in range(int(lines)):
        sys.stderr.write(("%06d " % i) + "x" * int(width) + "\n")
    sys.stderr.flush()
    return int(lines)
