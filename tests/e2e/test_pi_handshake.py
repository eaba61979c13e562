"""Real Pi + the castor extension + the real castor endpoint: start, handshake, prompt."""

from __future__ import annotations

import psutil
import pytest

pytestmark = [pytest.mark.pi, pytest.mark.timeout(60)]


def castor_children(pi) -> list[psutil.Process]:
    return [p for p in psutil.Process(pi.proc.pid).children(recursive=True) if "python" in p.name().lower()]


def test_extension_starts_castor_and_a_prompt_completes(start_pi, castor_command, fake_llm):
    pi = start_pi(castor_command)
    up = pi.wait_ui(
        "setStatus", lambda e: e.get("statusKey") == "castor" and str(e.get("statusText", "")).startswith("castor: up")
    )
    assert "castor: up" in up["statusText"]
    assert len(castor_children(pi)) >= 1, "the extension should have spawned the castor runtime"

    start = pi.prompt("hello through castor")
    end = pi.wait_for(lambda e: e.get("type") == "agent_end", start=start)
    texts = [
        c.get("text")
        for m in end["messages"]
        if m.get("role") == "assistant"
        for c in m["content"]
        if c.get("type") == "text"
    ]
    assert texts == ["FAKE-REPLY: hello through castor"]
    assert fake_llm.log()[-1]["messages"][-1]["content"] in (
        "hello through castor",
        [{"type": "text", "text": "hello through castor"}],
    )
    assert not pi.ui("notify", start=0) or all(n.get("notifyType") != "error" for n in pi.ui("notify"))


def test_castor_command_that_cannot_start_leaves_pi_usable(start_pi, fake_llm, tmp_path):
    pi = start_pi([str(tmp_path / "no-such-castor")], timeout_ms=2000)
    note = pi.wait_ui("notify", lambda e: e.get("notifyType") == "error")
    assert "castor runtime unavailable" in note["message"]
    start = pi.prompt("still works")
    end = pi.wait_for(lambda e: e.get("type") == "agent_end", start=start)
    assert any("FAKE-REPLY: still works" in str(m.get("content")) for m in end["messages"])


OLD_CASTOR = """
import os
from castor.endpoint.connection import Connection
from castor.endpoint.dispatch import Dispatcher
from castor.endpoint.transport import PipeTransport
out = os.dup(1)
os.dup2(2, 1)
Connection(PipeTransport(0, out, owns_fds=False, peer="stdio"), Dispatcher(version="0.0.1")).start().wait_closed()
"""


def test_a_castor_older_than_the_extension_is_named_so_with_how_to_upgrade(start_pi, tmp_path):
    """A castor that answers its hello but has none of the methods casts need came up as "castor: up",
    and each /materia command then failed with a bare "unknown method 'cast.list'"."""
    import sys

    script = tmp_path / "old_castor.py"
    script.write_text(OLD_CASTOR)
    pi = start_pi([sys.executable, str(script)])
    warned = pi.wait_ui("notify", lambda e: "older than this extension" in str(e.get("message")), timeout=40)
    assert warned["notifyType"] == "warning"
    assert warned["message"].startswith("castor 0.0.1 is older than this extension (0.1.0): it has no session.open")
    assert "pip install -U castor" in warned["message"]
    cmd = pi.command("/materia casts")
    failed = pi.wait_ui("notify", lambda e: e.get("notifyType") == "error", start=cmd, timeout=20)
    assert failed["message"].startswith("materia: castor 0.0.1 is older than this extension (0.1.0): it has no "
                                        "cast.list."), failed
    assert failed["message"].endswith("[unknown_method]")


def test_a_python_without_castor_says_so_in_each_commands_error(start_pi):
    """`--castor-python` naming a Python that has no castor: the start's toast quoted "No module named
    castor", but every command after it only said the runtime exited."""
    import sys

    # -I -S: neither PYTHONPATH nor site-packages, so this interpreter has no castor
    pi = start_pi([sys.executable, "-I", "-S", "-m", "castor", "serve", "--stdio"], timeout_ms=5000)
    pi.wait_ui("notify", lambda e: e.get("notifyType") == "error", timeout=40)
    cmd = pi.command("/materia casts")
    failed = pi.wait_ui("notify", lambda e: e.get("notifyType") == "error", start=cmd, timeout=20)
    assert "[runtime_exited]. castor's last stderr lines: " in failed["message"], failed
    assert f"{sys.executable}: No module named castor" in failed["message"], failed


def test_a_castor_on_path_that_is_not_castor_is_named_with_how_to_fix_it(start_pi, tmp_path):
    """A `castor` that prints junk and exits 1 (something else of that name, or a castor without
    `serve --stdio`): the user read only "castor runtime exited during runtime.hello (write EPIPE)"."""
    fake = tmp_path / "bin" / "castor"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'castor: not that castor'\nexit 1\n")
    fake.chmod(0o755)
    pi = start_pi([str(fake)], timeout_ms=5000)
    pi.wait_ui("notify", lambda e: e.get("notifyType") == "error", timeout=40)
    cmd = pi.command("/materia status")
    failed = pi.wait_ui("notify", lambda e: e.get("notifyType") == "error", start=cmd, timeout=20)
    message = failed["message"]
    assert f"{fake} exited before answering its handshake: it is not castor serve --stdio" in message, message
    assert "pip install -U castor" in message and "--castor-command" in message, message
    assert "[runtime_exited]" in message and "undefined" not in message and "[object Object]" not in message
