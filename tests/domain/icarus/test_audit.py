"""Audit entry (§5): schema, ids, usage nulls, release rule, and privacy as a property."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from castor.domain.icarus.audit import CUSTOM_TYPE, build_audit, needs_audit, release
from castor.domain.icarus.classify import (
    ClassifierUsage,
    Outcome,
    Reason,
    classify_context,
    parse_choice,
)
from castor.messages.errors import Timeout
from tests.support.icarus_fakes import SAMPLE, FakeClassifier

AT = datetime(2026, 11, 29, 18, 0, 0, 123456, tzinfo=UTC)


def classify(fake, context=SAMPLE, prompt="fix sqlite locks", choice="default"):
    return classify_context(context, prompt, parse_choice(choice), list_models=fake.list_models,
                            complete=lambda r: fake.complete(r, float("inf")))


def test_filtered_entry_schema():
    res = classify(FakeClassifier(reject_words=("cake",), confidence=0.8123456,
                                  usage=ClassifierUsage(input=812, output=40, total_tokens=852)))
    data = build_audit(res, at=AT, duration_ms=640).to_data()
    assert CUSTOM_TYPE == "icarus-context-filter"
    assert data["version"] == 1 and data["at"] == "2026-11-29T18:00:00.123Z"
    assert data["outcome"] == "filtered" and data["reason"] is None
    assert data["classifier"] == {"provider": "ollama", "model": "qwen3:4b", "local": True, "selection": "default"}
    assert [s["id"] for s in data["spans"]] == [f"s{i}" for i in range(1, 8)]
    assert [(s["kind"], s["section"], s["decision"]) for s in data["spans"]] == [
        ("protected", "unknown", "protected"),
        ("candidate", "fabric", "keep"), ("candidate", "fabric", "reject"),
        ("candidate", "qdrant", "keep"), ("candidate", "qdrant", "reject"),
        ("candidate", "sessions", "keep"), ("protected", "facts", "protected"),
    ]
    assert data["spans"][2]["confidence"] == 0.812
    assert data["injectedIds"] == ["s1", "s2", "s4", "s6", "s7"]
    assert data["counts"] == {"candidates": 5, "kept": 3, "rejected": 2, "unclassified": 0, "protected": 2}
    assert data["chars"] == {"original": len(SAMPLE), "injected": len(res.text)}
    assert data["usage"] == {"input": 812, "output": 40, "cacheRead": None, "cacheWrite": None,
                             "totalTokens": 852, "cost": None}
    assert data["durationMs"] == 640
    assert sum(s["chars"] for s in data["spans"] if s["decision"] == "reject") == len(SAMPLE) - len(res.text)


def test_51_unknown_usage_is_null_not_zero():
    data = build_audit(classify(FakeClassifier()), at=AT, duration_ms=None).to_data()
    assert data["usage"] is None and data["durationMs"] is None


def test_fallback_entry_has_reason_only_and_everything_injected():
    res = classify(FakeClassifier(raise_exc=Timeout("provider said: SECRET-DETAIL")))
    data = build_audit(res, at=AT, duration_ms=5).to_data()
    assert (data["outcome"], data["reason"]) == ("fallback", "timeout")
    assert "SECRET" not in json.dumps(data)
    assert data["injectedIds"] == [s["id"] for s in data["spans"]]
    assert data["counts"]["unclassified"] == 5


def test_53_all_rejected_audit_written_with_nothing_injected():
    ctx = "[fabric] f:\n  [t] a: cake one\n  [t] a: cake two"
    res = classify(FakeClassifier(reject_words=("cake",)), context=ctx)
    data = build_audit(res, at=AT, duration_ms=1).to_data()
    assert res.text is None and needs_audit(res)
    assert data["injectedIds"] == [] and data["chars"]["injected"] == 0


def test_release_rule():
    res = classify(FakeClassifier(reject_words=("cake",)))
    assert release(SAMPLE, res, persisted=True) == (res.text, False)
    assert release(SAMPLE, res, persisted=False) == (SAMPLE, True)  # 50: original + warning
    fb = classify(FakeClassifier(raw="nope"))
    assert fb.reason is Reason.MALFORMED_RESPONSE
    assert release(SAMPLE, fb, persisted=False) == (SAMPLE, False)  # best-effort audit
    assert release(SAMPLE, None, persisted=False) == (SAMPLE, False)  # classifier none
    assert release("  ", None, persisted=True) == (None, False)


# ---- privacy property (49): no substring (>= 8 chars) of context or prompt in the audit

#: Words the audit contains by design (keys, enums, recognised section names,
#: configured model names). A window equal to a piece of these is not a leak.
VOCABULARY = " ".join([
    "version at outcome reason classifier provider model local selection default exact spans id kind",
    "protected candidate section chars decision confidence keep reject unclassified injectedIds counts",
    "candidates kept rejected original injected usage input output cacheRead cacheWrite totalTokens",
    "cost durationMs filtered fallback no_candidates aborted no_registry no_model model_unavailable",
    "timeout provider_error malformed_response invalid_classifier fabric qdrant sessions facts",
    "preamble unknown ollama qwen3:4b true false null",
])

_free = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=8, max_size=60).map(
    lambda s: s.replace("\n", " ").strip() or "x" * 8)


@st.composite
def secret_context(draw):
    f = [draw(_free) for _ in range(draw(st.integers(1, 3)))]
    q = [draw(_free) for _ in range(draw(st.integers(1, 2)))]
    text = "[" + draw(st.sampled_from(["ops-secret-notes", "memory-retrieval-warning"])) + "] " + draw(_free)
    text += "\n\n[fabric] " + draw(_free) + "\n" + "\n".join(f"  [t] a: {x}" for x in f)
    text += "\n\n[qdrant] kb:\n" + "\n".join(f"  ### {x} (score: 0.5)\n  {x[::-1]}" for x in q)
    text += "\n\n[facts] " + draw(_free) + "\n  - " + draw(_free)
    return text


def windows(s: str, n: int = 8):
    return {s[i:i + n] for i in range(len(s) - n + 1)}


@settings(max_examples=150, deadline=None)
@given(secret_context(), _free, st.sampled_from(["filter", "timeout", "malformed", "abort"]),
       st.floats(0, 1, allow_nan=False))
def test_audit_never_contains_context_or_prompt_substrings(ctx, prompt, mode, conf):
    from castor.messages.errors import Cancelled
    fake = FakeClassifier(reject_words=(ctx[30:34],), confidence=conf,
                          usage=ClassifierUsage(input=len(ctx), output=7))
    if mode == "timeout":
        fake.raise_exc = Timeout(f"provider echoed: {ctx} {prompt}")
    elif mode == "malformed":
        fake.raw = f"prose echoing {ctx} {prompt}"
    elif mode == "abort":
        fake.raise_exc = Cancelled(ctx)
    res = classify(fake, context=ctx, prompt=prompt)
    audit = json.dumps(build_audit(res, at=AT, duration_ms=12).to_data(), ensure_ascii=False)
    leaks = {w for w in windows(ctx) | windows(prompt) if w in audit and w not in VOCABULARY}
    assert not leaks
    assert res.outcome in (Outcome.FILTERED, Outcome.FALLBACK, Outcome.ABORTED)
