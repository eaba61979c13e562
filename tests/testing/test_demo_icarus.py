"""The Icarus section of ``castor demo``: run for real, every check must pass.

The section drives a real Runtime over the reference backend (a stand-in for
the private Icarus plugin) in real worker subprocesses; only the classifier
model is a stand-in (castor/testing/demo_icarus.py WordOverlapClassifier).
"""

from __future__ import annotations

import json
import time

import pytest
from rich.console import Console

import castor.testing.demo_icarus as demo_icarus
from castor.ports.classifier import ChatMessage, ClassifierRequest
from castor.testing.report import DemoReport


def _report() -> DemoReport:
    return DemoReport(Console(quiet=True))


@pytest.mark.timeout(60)
def test_the_icarus_section_passes_every_check_and_its_artifacts_show_each_claim(tmp_path):
    """The demo's own verdicts must all pass, and the claims are checked again from the files it
    left (the audit in the session log, the backend's own call log), independently of the demo's
    code. (How long the section takes is bench material: docs/reliability.md gives the figure.)"""
    report = _report()
    demo_icarus.section_icarus(report, tmp_path)
    failed = [(c.name, c.detail) for c in report.checks if not c.ok]
    assert failed == []
    names = " | ".join(c.name for c in report.checks)
    for must in ("pre_llm_call", "audit persisted", "no raw text", "worker_retired", "fresh worker",
                 "no queued call ever executed", "did not re-run on_session_start"):
        assert must in names
    assert len(report.checks) >= 10 and all(c.section == "icarus" for c in report.checks)
    # The evidence is on disk where the demo says: the audit in the session log, the calls in the backend log.
    base = tmp_path / "icarus"
    audits = [json.loads(line) for line in (base / "session.jsonl").read_text().splitlines()]
    assert [a["customType"] for a in audits] == ["icarus-context-filter"] * 2
    calls = [json.loads(line) for line in (base / "backend-calls.jsonl").read_text().splitlines()]
    assert not any("QUEUED-WRITE" in json.dumps(c.get("args")) for c in calls)
    assert len({c["pid"] for c in calls if c["call"] == "hooks.pre_llm_call"}) == 2  # a fresh worker
    starts = [c for c in calls if c["call"] == "hooks.on_session_start" and c.get("phase", "start") == "start"]
    assert len(starts) == 1  # the fresh worker did not re-run session start-up
    # no raw prompt or memory text in the audits: no 12-character run of either appears in them
    raw = json.dumps(audits)
    for secret in (demo_icarus.PROMPT, demo_icarus.RELEVANT, demo_icarus.OFF_TOPIC):
        assert not any(secret[i:i + 12] in raw for i in range(len(secret) - 11)), secret


@pytest.mark.timeout(20)
def test_a_missing_reference_backend_is_a_failing_check(tmp_path, monkeypatch):
    monkeypatch.setattr(demo_icarus, "reference_backend", lambda: tmp_path / "nowhere" / "icarus")
    report = _report()
    demo_icarus.section_icarus(report, tmp_path)
    assert [(c.name, c.ok) for c in report.checks] == [("reference backend present", False)]
    assert not report.ok


def test_the_stand_in_classifier_answers_the_decision_format_by_word_overlap():
    payload = {"request": "sqlite lock contention", "candidates": [
        {"id": "c1", "section": "fabric", "text": "[2026-01-01] pi-agent: sqlite WAL fixed it"},
        {"id": "c2", "section": "fabric", "text": "[2026-01-01] pi-agent: chocolate cake"}]}
    request = ClassifierRequest(provider="demo", model="word-overlap", max_tokens=100, messages=(
        ChatMessage(role="system", content="x"), ChatMessage(role="user", content=json.dumps(payload))))
    answer = json.loads(demo_icarus.WordOverlapClassifier().complete(request, time.monotonic() + 1).text)
    assert answer == {"decisions": [{"id": "c1", "relevant": True, "confidence": 0.9},
                                    {"id": "c2", "relevant": False, "confidence": 0.9}]}


def test_the_leak_detector_finds_a_twelve_character_run():
    assert demo_icarus.leaked_runs('{"x": "...lock contention..."}', ["sqlite lock contention"]) != []
    assert demo_icarus.leaked_runs('{"outcome": "filtered"}', ["sqlite lock contention"]) == []
