"""Span extraction (§4.1-4.3): exact offsets, protected sections, bounds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from castor.domain.icarus.spans import (
    TRUNCATION_MARKER,
    PieceKind,
    SelectionLimits,
    segment,
    select_candidates,
    truncate_middle,
)
from tests.support.icarus_fakes import SAMPLE


def kinds(text: str) -> list[tuple[str, str, str]]:
    seg = segment(text)
    return [(p.kind.value, p.section, p.slice(text)) for p in seg.pieces]


def test_sample_layout_pieces_and_sections():
    seg = segment(SAMPLE)
    assert "".join(p.slice(SAMPLE) for p in seg.pieces) == SAMPLE
    cands = [(p.section, p.slice(SAMPLE)) for p in seg.candidates]
    assert [c[0] for c in cands] == ["fabric", "fabric", "qdrant", "qdrant", "sessions"]
    # each item owns its leading newline; a qdrant item spans its "###" line and its content
    assert cands[0][1] == "\n  [2026-01-01 10:00] pi-agent: sqlite WAL mode fixed the lock contention"
    assert cands[2][1].startswith("\n  ### notes: sqlite pragmas") and cands[2][1].endswith("locked errors")
    prot = [(p.section, p.slice(SAMPLE)) for p in seg.protected]
    assert [s for s, _ in prot] == ["unknown", "facts"]  # warning + facts, never candidates
    assert prot[0][1].startswith("[memory-retrieval-warning]")


def test_preamble_before_first_header_is_protected():
    text = "intro text\n\n[fabric] x:\n  [t] a: one"
    got = kinds(text)
    assert got[0] == ("protected", "preamble", "intro text")
    assert got[-1] == ("candidate", "fabric", "\n  [t] a: one")


def test_unknown_header_is_protected_and_its_name_not_reported():
    seg = segment("[secret-ops-channel] do X\n  line")
    assert [(p.kind, p.section) for p in seg.pieces] == [(PieceKind.PROTECTED, "unknown")]


def test_grammar_failure_protects_the_whole_section():
    text = "[fabric] x:\n  [t] a: ok\nunindented continuation"
    seg = segment(text)
    assert seg.candidates == ()
    assert [p.section for p in seg.protected] == ["fabric"]


def test_qdrant_line_before_first_item_fails_grammar():
    seg = segment("[qdrant] kb:\n  stray\n  ### s: t (score: 1)\n  body")
    assert seg.candidates == ()


def test_header_only_section_is_protected():
    seg = segment("[fabric] nothing found")
    assert seg.candidates == () and len(seg.protected) == 1


def test_deeper_indent_and_blank_lines_continue_an_item():
    text = "[sessions] s:\n  [a] t: one\n     more of one\n\n  [b] t: two\n"
    seg = segment(text)
    assert [p.slice(text) for p in seg.candidates] == ["\n  [a] t: one\n     more of one\n", "\n  [b] t: two\n"]


def test_bracket_inside_item_after_blank_line_indented_is_not_a_header():
    text = "[fabric] f:\n  [t] a: one\n\n  [t] a: two"
    assert len(segment(text).candidates) == 2


def test_case_insensitive_header_names():
    assert [p.section for p in segment("[FABRIC] f:\n  [t] a: x").candidates] == ["fabric"]


def test_custom_retrievable_set():
    text = "[fabric] f:\n  [t] a: x\n\n[wiki] w:\n  [p] page: y"
    seg = segment(text, {"wiki": "line"})
    assert [p.section for p in seg.candidates] == ["wiki"]
    assert [p.section for p in seg.protected] == ["unknown"]  # fabric is not retrievable here


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("[]#\n  abcfrqdtsion:-")), max_size=200))
def test_pieces_tile_any_text_exactly(text):
    seg = segment(text)
    assert "".join(p.slice(text) for p in seg.pieces) == text
    pos = 0
    for p in seg.pieces:
        assert p.start == pos and p.end >= p.start
        pos = p.end
    assert pos == len(text)


# ---- bounds (§4.3)


def fabric(n: int, body: str = "x") -> str:
    return "[fabric] f:\n" + "\n".join(f"  [t{i}] a: {body}" for i in range(n))


def test_more_than_24_candidates_extras_kept_unclassified():
    seg = segment(fabric(30))
    sel = select_candidates(seg)
    assert [c.request_id for c in sel.sent] == [f"c{i}" for i in range(1, 25)]
    assert sel.unclassified == seg.candidates[24:]


def test_long_candidate_sent_middle_truncated():
    body = "A" * 2000 + "Z"
    seg = segment(fabric(1, body))
    (sent,) = select_candidates(seg).sent
    assert len(sent.text) == 1200 and TRUNCATION_MARKER in sent.text
    assert sent.text.startswith("[t0] a: AAA") and sent.text.endswith("Z")
    assert sent.piece.chars == len(seg.candidates[0].slice(seg.text))  # decision covers the whole slice


def test_total_char_budget_stops_selection_in_text_order():
    seg = segment(fabric(5, "y" * 100))
    sel = select_candidates(seg, SelectionLimits(max_total_chars=250))
    assert len(sel.sent) == 2 and len(sel.unclassified) == 3


def test_truncate_middle_exact_length():
    for n in range(10, 60):
        assert len(truncate_middle("q" * 100, n)) == n
    assert truncate_middle("short", 100) == "short"
