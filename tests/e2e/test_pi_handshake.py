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
