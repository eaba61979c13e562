"""Audit privacy end to end: no raw prompt or memory text in audits or in castor's own logs.

A filtered retrieval runs through the runtime's Icarus component (reference
backend in a real worker, JSONL session log, stand-in classifier). Everything
castor logs meanwhile is captured with loguru at DEBUG (formatted like
castor's own sinks: message, extras, exception text). Then no 12-character
run of the prompt or of the retrieved context may appear in the audit entries
or in that log. The same holds when the classifier fails with an error whose
text quotes the prompt.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from loguru import logger

from castor.ports.classifier import ClassifierResponse

from .conftest import read_jsonl

pytestmark = pytest.mark.timeout(40)

RUN = 12
PROMPT = "PRIVATE-PROMPT: how do I rotate the kubernetes signing keys for cluster zeta"
RELEVANT = ("PRIVATE-MEMORY rotate kubernetes signing keys with kubeadm certs renew",
            "contains the cluster zeta root credentials rotation notes")
OFF_TOPIC = ("LASAGNA-NOTE: grandma's secret bechamel recipe from the old street",
             "the kubernetes of lasagna is the bechamel")


def leaks(haystack: str, secrets: list[str]) -> list[str]:
    found = set()
    for secret in secrets:
        for i in range(len(secret) - RUN + 1):
            run = secret[i:i + RUN]
            if run.strip() and run in haystack:
                found.add(run)
    return sorted(found)


@pytest.fixture
def castor_log() -> Iterator[list[str]]:
    lines: list[str] = []
    logger.enable("castor")  # as a program that reads castor's log does (a library's lines are off until then)
    sink = logger.add(lambda message: lines.append(str(message)), level="DEBUG", backtrace=False, diagnose=False,
                      format="{time} {level} {name}:{function} {message} | {extra}\n{exception}")
    yield lines
    logger.remove(sink)


def _retrieve(world, classifier=None) -> tuple[str, list[dict]]:
    if classifier is not None:
        world.classifier = classifier
    rt = world.runtime()
    _, sess = world.open(rt, "privacy-session")
    for summary, content in (RELEVANT, OFF_TOPIC):
        sess.tool("fabric_write", {"type": "note", "summary": summary, "content": content})
    rt.dispatch_event("privacy-session", "session_start", {})
    result = rt.dispatch_event("privacy-session", "before_agent_start", {"prompt": PROMPT})
    rt.close_session("privacy-session")
    audits = [e for e in read_jsonl(world.session_log_path) if e.get("customType") == "icarus-context-filter"]
    return result["message"]["content"], audits


def test_a_filtered_retrieval_leaves_no_raw_text_in_the_audit_or_the_log(icarus_world, castor_log):
    content, audits = _retrieve(icarus_world)
    assert RELEVANT[0] in content and OFF_TOPIC[0] not in content  # it really filtered
    [audit] = audits
    assert audit["data"]["outcome"] == "filtered" and audit["data"]["counts"]["rejected"] == 1
    secrets = [PROMPT, content, *RELEVANT, *OFF_TOPIC]
    assert leaks(json.dumps(audits), secrets) == []
    log = "\n".join(castor_log)
    assert "context classified" in log or "icarus" in log  # the sink did capture castor's logging
    assert leaks(log, secrets) == []


class _LeakyProvider:
    """A classifier provider that fails, quoting the prompt and candidates in its error text."""

    def __init__(self, mode: str) -> None:
        from .conftest import OverlapClassifier

        self.model = OverlapClassifier.model
        self.mode = mode

    def list_models(self, deadline=None):
        return [self.model]

    def complete(self, request, deadline):
        text = request.messages[-1].content
        if self.mode == "raise":
            raise RuntimeError(f"provider rejected the request: {text}")
        return ClassifierResponse(text=f"I cannot comply. You asked: {text}")


@pytest.mark.parametrize("mode", ["raise", "garbage"])
def test_a_failing_provider_quoting_the_prompt_leaks_nothing(icarus_world, castor_log, mode):
    content, audits = _retrieve(icarus_world, _LeakyProvider(mode))
    assert RELEVANT[0] in content and OFF_TOPIC[0] in content  # original kept on failure
    [audit] = audits
    expected = "provider_error" if mode == "raise" else "malformed_response"
    assert (audit["data"]["outcome"], audit["data"]["reason"]) == ("fallback", expected)
    secrets = [PROMPT, content, *RELEVANT, *OFF_TOPIC]
    assert leaks(json.dumps(audits), secrets) == []
    assert leaks("\n".join(castor_log), secrets) == []
