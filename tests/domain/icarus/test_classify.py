"""Classifier rules (§4.4-4.9): selection, request, validation, exact slices, fallbacks."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from castor.domain.icarus.classify import (
    ClassifierUsage,
    Decision,
    MalformedAnswer,
    ModelEndpoint,
    Outcome,
    Reason,
    SpanDecision,
    apply_decisions,
    build_request,
    classify_context,
    is_loopback_url,
    parse_choice,
    parse_decisions,
    plan_filter,
    select_model,
)
from castor.domain.icarus.spans import PieceKind
from castor.messages.errors import Cancelled, Timeout
from tests.support.icarus_fakes import LOCAL, REMOTE, SAMPLE, FakeClassifier


def run(fake: FakeClassifier, choice: str = "default", context: str = SAMPLE, prompt: str = "fix sqlite locks"):
    return classify_context(
        context, prompt, parse_choice(choice),
        list_models=fake.list_models,
        complete=lambda req: fake.complete(req, deadline=float("inf")),
    )


# ---- model selection table (§4.4)

def m(provider, mid, url, auth=True):
    return ModelEndpoint(provider=provider, id=mid, base_url=url, has_auth=auth)


@pytest.mark.parametrize("url,local", [
    ("http://127.0.0.1:11434", True),
    ("http://127.8.9.10/v1", True),
    ("http://localhost:8080", True),
    ("http://LOCALHOST.:8080", True),
    ("http://models.localhost/v1", True),
    ("http://[::1]:8000/v1", True),
    ("http://[::ffff:127.0.0.1]:8000", True),
    ("127.0.0.1:11434", True),
    ("http://0.0.0.0:11434", False),
    ("http://localhost.example.com", False),
    ("https://api.openai.com/v1", False),
    ("http://10.0.0.5:11434", False),
    ("", False),
    (None, False),
    ("http://[not-an-ip", False),
])
def test_locality_is_judged_by_loopback_hostname(url, local):
    assert is_loopback_url(url) is local


def test_default_prefers_local_over_remote_and_provider_named_local_is_not_local():
    fake_local = m("local", "llama", "https://remote.example.com/v1")
    ollama = m("ollama", "qwen", "http://127.0.0.1:11434", auth=False)
    sel = select_model(parse_choice("default"), [REMOTE, fake_local, ollama])
    assert sel.model == ollama and sel.model.local and not sel.discloses_remotely


def test_default_falls_back_to_current_main_model_then_first_remote_with_auth():
    a, b = m("p", "a", "https://a"), m("q", "b", "https://b")
    noauth = m("r", "c", "https://c", auth=False)
    assert select_model(parse_choice("default"), [noauth, a, b], current=("q", "b")).model == b
    sel = select_model(parse_choice("default"), [noauth, a, b], current=("zz", "none"))
    assert sel.model == a and sel.discloses_remotely
    assert select_model(parse_choice("default"), [noauth]).reason is Reason.NO_MODEL


def test_exact_is_never_substituted():
    sel = select_model(parse_choice("p/m"), [LOCAL, REMOTE])
    assert sel.model is None and sel.reason is Reason.MODEL_UNAVAILABLE
    noauth = m("p", "m", "https://p", auth=False)
    assert select_model(parse_choice("p/m"), [noauth, LOCAL]).reason is Reason.MODEL_UNAVAILABLE
    ok = m("p", "m/with/slashes", "https://p")
    assert select_model(parse_choice("p/m/with/slashes"), [LOCAL, ok]).model == ok


@pytest.mark.parametrize("raw,kind", [
    ("default", "default"), ("DEFAULT", "default"), (" None ", "none"), (None, "default"),
    ("p/m", "exact"), ("nomodel", "invalid"), ("/m", "invalid"), ("p/", "invalid"), ("", "invalid"),
])
def test_parse_choice(raw, kind):
    assert parse_choice(raw).kind == kind


def test_no_registry_api():
    assert select_model(parse_choice("default"), None).reason is Reason.NO_REGISTRY


# ---- request (§4.5)

def test_request_shape_temperature_tokens_and_truncated_prompt():
    plan = plan_filter(SAMPLE, "p" * 5000)
    req = build_request(plan, LOCAL)
    assert req.temperature == 0 and req.max_tokens == 40 * 5 + 64
    assert (req.provider, req.model) == ("ollama", "qwen3:4b")
    body = json.loads(req.messages[1].content)
    assert body["request"] == "p" * 2000
    assert [c["id"] for c in body["candidates"]] == ["c1", "c2", "c3", "c4", "c5"]
    assert [c["section"] for c in body["candidates"]] == ["fabric", "fabric", "qdrant", "qdrant", "sessions"]
    all_text = json.dumps(body)
    assert "terse answers" not in all_text and "vector store" not in all_text  # protected never sent
    assert "data" in req.messages[0].content and "JSON" in req.messages[0].content


# ---- validation (§4.6)

IDS = ["c1", "c2"]


@pytest.mark.parametrize("answer", [
    "Sure! c1 is relevant.",
    "[]",
    '{"decision": []}',
    '{"decisions": {}}',
    '{"decisions": ["c1"]}',
    '{"decisions": [{"id": "c9", "relevant": true}]}',
    '{"decisions": [{"id": "c1", "relevant": true}, {"id": "c1", "relevant": false}]}',
    '{"decisions": [{"relevant": true}]}',
    '{"decisions": [{"id": 1, "relevant": true}]}',
    '{"decisions": [{"id": "c1", "relevant": "yes"}]}',
    '{"decisions": [{"id": "c1", "relevant": 0}]}',
    '{"decisions": [{"id": "c1", "relevant": false, "confidence": 1.5}]}',
    '{"decisions": [{"id": "c1", "relevant": false, "confidence": -0.1}]}',
    '{"decisions": [{"id": "c1", "relevant": false, "confidence": NaN}]}',
    '{"decisions": [{"id": "c1", "relevant": false, "confidence": Infinity}]}',
    '{"decisions": [{"id": "c1", "relevant": false, "confidence": "0.9"}]}',
    '{"decisions": [{"id": "c1", "relevant": false, "confidence": true}]}',
    '{"decisions": [{"id": "c1", "relevant": false, "confidence": null}]}',
    "",
])
def test_malformed_answers(answer):
    with pytest.raises(MalformedAnswer):
        parse_decisions(answer, IDS)


def test_fenced_answer_and_missing_ids_and_integer_confidence():
    got = parse_decisions('```json\n{"decisions": [{"id": "c2", "relevant": false, "confidence": 1}]}\n```', IDS)
    assert got == {"c2": Decision(False, 1.0)}


@pytest.mark.parametrize("relevant,conf,rejects", [
    (False, 0.6, True), (False, 0.59, False), (False, None, False), (True, 0.99, False), (False, 1.0, True),
])
def test_reject_threshold(relevant, conf, rejects):
    assert Decision(relevant, conf).rejects is rejects


# ---- §8 conformance 41-48, 51-54 and the fallback matrix

def test_41_none_has_no_registry_access_and_returns_verbatim():
    fake = FakeClassifier()
    assert run(fake, "none") is None
    assert fake.list_calls == 0 and fake.requests == []


def test_42_facts_and_warning_not_sent_and_kept_verbatim():
    fake = FakeClassifier(reject_words=("cake",))
    res = run(fake)
    assert not any("terse" in t or "vector store" in t for t in fake.sent_texts())
    assert "[memory-retrieval-warning]\nTell the user the vector store was unreachable." in res.text
    assert "[facts] durable facts about the user/environment:\n  - The user prefers terse answers" in res.text


def test_43_rejecting_one_line_removes_exactly_that_slice():
    fake = FakeClassifier(reject_words=("chocolate",))
    res = run(fake)
    line = "\n  [2026-01-02 11:00] pi-agent: grandma's chocolate cake needs three eggs"
    assert res.outcome is Outcome.FILTERED
    assert res.text == SAMPLE.replace(line, "")


def test_orphaned_header_and_its_separator_are_dropped():
    fake = FakeClassifier(reject_words=("cake", "Debugging"))
    res = run(fake)
    assert "[sessions]" not in res.text
    assert res.text == (
        SAMPLE.replace("\n  [2026-01-02 11:00] pi-agent: grandma's chocolate cake needs three eggs", "")
        .replace("\n  ### notes: baking (score: 0.40)\n  the cake frosting recipe uses butter and icing sugar", "")
        .replace("[sessions] prior conversations on this topic:\n"
                 "  [yesterday] Debugging sqlite: we compared WAL against rollback journals\n\n", "")
    )


@pytest.mark.parametrize("raw", ["I think they are all relevant.",
                                 '{"decisions": [{"id": "c42", "relevant": false, "confidence": 0.9}]}',
                                 '{"decisions": [{"id": "c1", "relevant": false, "confidence": 0.9},'
                                 ' {"id": "c1", "relevant": false, "confidence": 0.9}]}',
                                 "\x00\xff garbage {{{"])
def test_44_prose_unknown_or_duplicate_id_keeps_original(raw):
    res = run(FakeClassifier(raw=raw))
    assert res.text == SAMPLE and res.outcome is Outcome.FALLBACK and res.reason is Reason.MALFORMED_RESPONSE


def test_timeout_keeps_original_exactly():
    res = run(FakeClassifier(raise_exc=Timeout("slow", may_have_started=True)))
    assert res.text == SAMPLE and res.reason is Reason.TIMEOUT


def test_provider_error_keeps_original_and_no_error_text():
    res = run(FakeClassifier(raise_exc=RuntimeError("HTTP 500: secret internal detail")))
    assert res.text == SAMPLE and res.reason is Reason.PROVIDER_ERROR


def test_absent_registry_keeps_original():
    res = run(FakeClassifier(models=None))
    assert res.text == SAMPLE and res.reason is Reason.NO_REGISTRY


def test_registry_method_unknown_is_no_registry():
    from castor.messages.errors import UnknownMethod
    fake = FakeClassifier()
    res = classify_context(SAMPLE, "q", parse_choice("default"),
                           list_models=lambda: (_ for _ in ()).throw(UnknownMethod("model.list")),
                           complete=lambda r: fake.complete(r, float("inf")))
    assert res.text == SAMPLE and res.reason is Reason.NO_REGISTRY and fake.requests == []


def test_no_usable_model_keeps_original():
    res = run(FakeClassifier(models=[m("r", "c", "https://c", auth=False)]))
    assert res.text == SAMPLE and res.reason is Reason.NO_MODEL


def test_46_abort_yields_nothing():
    res = run(FakeClassifier(raise_exc=Cancelled("turn aborted")))
    assert res.text is None and res.outcome is Outcome.ABORTED


def test_47_exact_model_missing_calls_nothing():
    fake = FakeClassifier(models=[LOCAL])
    res = run(fake, "p/m")
    assert fake.requests == [] and res.text == SAMPLE and res.reason is Reason.MODEL_UNAVAILABLE


def test_48_default_selects_loopback_model():
    fake = FakeClassifier(models=[REMOTE, m("local", "x", "https://remote.example"),
                                  m("ollama", "q", "http://127.0.0.1:11434")])
    run(fake)
    assert (fake.requests[0].provider, fake.requests[0].model) == ("ollama", "q")


def test_invalid_choice_behaves_like_none_but_reports():
    fake = FakeClassifier()
    res = run(fake, "garbage")
    assert fake.list_calls == 0 and res.text == SAMPLE and res.reason is Reason.INVALID_CLASSIFIER


def test_51_usage_absent_is_none_and_present_is_kept():
    assert run(FakeClassifier()).usage is None
    u = ClassifierUsage(input=10, output=3)
    res = run(FakeClassifier(usage=u))
    assert res.usage == u and res.usage.cost is None


def test_52_extras_over_24_kept_unclassified_and_not_sent():
    ctx = "[fabric] f:\n" + "\n".join(f"  [t{i}] a: item number {i:02d}" for i in range(30))
    fake = FakeClassifier(reject_words=("item",))
    res = run(fake, context=ctx)
    assert len(fake.sent_texts()) == 24
    assert not any("item number 24" in t for t in fake.sent_texts())
    decisions = [v.decision for v in res.verdicts]
    assert decisions == [SpanDecision.REJECT] * 24 + [SpanDecision.UNCLASSIFIED] * 6
    assert res.text == "[fabric] f:\n" + "\n".join(f"  [t{i}] a: item number {i:02d}" for i in range(24, 30))


def test_53_everything_rejected_no_protected_injects_nothing():
    ctx = "[fabric] f:\n  [t] a: cake\n\n[qdrant] q:\n  ### s: t (score: 1)\n  cake"
    res = run(FakeClassifier(reject_words=("cake",)), context=ctx)
    assert res.text is None and res.outcome is Outcome.FILTERED
    assert [v.decision for v in res.verdicts] == [SpanDecision.REJECT] * 2


def test_no_candidates_skips_the_classifier():
    fake = FakeClassifier()
    res = run(fake, context="[facts] f:\n  - a fact")
    assert res.outcome is Outcome.NO_CANDIDATES and res.text == "[facts] f:\n  - a fact"
    assert fake.list_calls == 0 and fake.requests == []


def test_low_confidence_and_missing_decisions_are_kept():
    plan = plan_filter(SAMPLE, "q")
    res = apply_decisions(plan, {"c2": Decision(False, 0.3), "c4": Decision(False, None)})
    assert res.text == SAMPLE
    assert [v.decision for v in res.verdicts if v.piece.kind is PieceKind.CANDIDATE] == [
        SpanDecision.UNCLASSIFIED, SpanDecision.KEEP, SpanDecision.UNCLASSIFIED,
        SpanDecision.KEEP, SpanDecision.UNCLASSIFIED]


# ---- exact-slice retention as a property (§4.8)

_line = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"),
                min_size=1, max_size=30).filter(lambda s: s.strip() == s and s != "")


@st.composite
def contexts(draw):
    sections = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["fabric", "qdrant", "sessions", "facts", "other"]))
        n = draw(st.integers(1, 4))
        if kind == "qdrant":
            items = [f"  ### {draw(_line)} (score: 0.5)\n  {draw(_line)}" for _ in range(n)]
        elif kind == "facts":
            items = [f"  - {draw(_line)}" for _ in range(n)]
        else:
            items = [f"  [{i}] {draw(_line)}" for i in range(n)]
        sections.append(f"[{kind}] {draw(_line)}\n" + "\n".join(items))
    return "\n\n".join(sections)


def is_ordered_subsequence_of_slices(output: str, original: str, pieces) -> bool:
    """output == concatenation of some original pieces, in order."""
    pos = 0
    for p in pieces:
        s = p.slice(original)
        if output.startswith(s, pos) and s:
            pos += len(s)
    return pos == len(output)


@settings(max_examples=200, deadline=None)
@given(contexts(), st.data())
def test_output_is_original_minus_some_slices(ctx, data):
    plan = plan_filter(ctx, "q")
    decisions = {
        c.request_id: Decision(data.draw(st.booleans()), data.draw(st.sampled_from([None, 0.1, 0.6, 0.95])))
        for c in plan.selection.sent if data.draw(st.booleans())
    }
    res = apply_decisions(plan, decisions)
    out = res.text or ""
    assert is_ordered_subsequence_of_slices(out, ctx, plan.segmentation.pieces)
    rejected = [v.piece for v in res.verdicts if v.decision is SpanDecision.REJECT]
    # every non-rejected content slice survives verbatim, every rejected one is gone from its place
    for v in res.verdicts:
        if v.decision is not SpanDecision.REJECT and v.piece.slice(ctx).strip():
            assert v.piece.slice(ctx) in out
    if not rejected:
        assert out == ctx
    # removing exactly the rejected slices (and emptied sections) never adds characters
    assert len(out) <= len(ctx) - sum(p.chars for p in rejected) or out == ""


def test_implausible_classifier_usage_figures_count_as_not_reported():
    """A valid classification is never dropped for its telemetry; NaN never reaches an audit."""
    from castor.domain.icarus.classify import ClassifierUsage

    odd = ClassifierUsage.model_validate({"input": 1.5, "output": float("nan"), "cacheRead": -1,
                                          "totalTokens": 10 ** 30, "cost": float("inf")})
    assert odd == ClassifierUsage()
    fine = ClassifierUsage.model_validate({"input": 3, "output": 4.0, "cacheRead": 2, "cost": 0.01})
    assert (fine.input, fine.output, fine.cache_read, fine.cost) == (3, 4, 2, 0.01)
