"""Span extraction from the context text Icarus returns.

Guarantees
----------
* Every piece keeps exact ``[start, end)`` offsets into the original string and
  the pieces tile the text: concatenating ``text[p.start:p.end]`` for every
  piece, in order, gives back the original text byte for byte. Nothing is ever
  re-serialised.
* Only items of *recognised retrievable* sections (``[fabric]``, ``[qdrant]``,
  ``[sessions]`` by default) become candidates. Everything else is protected:
  text before the first header (``preamble``), ``[facts]``, any unknown
  bracketed section (``unknown`` -- its raw header name is never reported, it
  is context text), and any recognised section whose item grammar fails to
  parse (if in doubt, keep).
* Candidate selection is bounded (:class:`SelectionLimits`); over-limit
  candidates are *kept* and marked unclassified, never dropped.

Grammar (our decision, documented in docs/icarus.md "Classifier")
-----------------------------------------------------------------
* A section starts at the beginning of the text or at a line that begins with
  ``[`` right after a blank-line run. The blank-line run itself is a
  ``separator`` piece. A blank-line run *not* followed by ``[`` stays inside
  its section (so a multi-paragraph item is not split).
* A header is the first line when it matches ``[name]``; ``name`` is compared
  case-insensitively.
* ``line`` grammar (fabric, sessions): each item starts on a line indented by
  exactly two spaces then a non-space. Lines indented by three or more spaces
  and whitespace-only lines continue the previous item. Any other line fails.
* ``block`` grammar (qdrant): each item starts on a line beginning with
  ``"  ### "`` and runs up to the next such line. A line before the first
  item start fails.
* Each item slice owns the newline that precedes it, so removing an item
  leaves its neighbours and the section separators exactly as they were.
  Trailing whitespace of a section belongs to its last item.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Grammar = Literal["line", "block"]

#: Recognised retrievable sections and the grammar of their items. Installations
#: may pass their own mapping (the set is configurable on purpose).
DEFAULT_RETRIEVABLE: dict[str, Grammar] = {"fabric": "line", "qdrant": "block", "sessions": "line"}

#: Protected section names that may appear in audits. Unknown headers are
#: reported as ``unknown`` because their names are context text.
FACTS = "facts"
PREAMBLE = "preamble"
UNKNOWN = "unknown"

_SEPARATOR = re.compile(r"\n(?:[ \t]*\n)+(?=\[)")
_HEADER = re.compile(r"\[([^\]\n]+)\]")
_LINE_ITEM = re.compile(r"  \S")
_LINE_CONTINUATION = re.compile(r"   +\S.*|[ \t]*")
_BLOCK_ITEM = re.compile(r"  ### ")


class PieceKind(StrEnum):
    SEPARATOR = "separator"  # blank-line run between sections
    HEADER = "header"  # header line of a recognised retrievable section
    CANDIDATE = "candidate"  # one item of a recognised retrievable section
    PROTECTED = "protected"  # kept verbatim, never sent to the classifier


@dataclass(frozen=True, slots=True)
class Piece:
    """One exact slice ``[start, end)`` of the original text."""

    kind: PieceKind
    start: int
    end: int
    section: str  # recognised name, "facts", "preamble" or "unknown"
    section_index: int  # index into Segmentation.sections (-1 for separators)

    @property
    def chars(self) -> int:
        return self.end - self.start

    def slice(self, text: str) -> str:
        return text[self.start : self.end]


@dataclass(frozen=True, slots=True)
class Section:
    index: int
    start: int
    end: int
    name: str
    retrievable: bool  # True only when the items parsed as candidates


@dataclass(frozen=True, slots=True)
class Segmentation:
    """The text cut into pieces that tile it exactly, in order."""

    text: str
    sections: tuple[Section, ...]
    pieces: tuple[Piece, ...]

    @property
    def candidates(self) -> tuple[Piece, ...]:
        return tuple(p for p in self.pieces if p.kind is PieceKind.CANDIDATE)

    @property
    def protected(self) -> tuple[Piece, ...]:
        """Protected pieces that carry content (whitespace-only ones are not spans)."""
        return tuple(
            p for p in self.pieces if p.kind is PieceKind.PROTECTED and p.slice(self.text).strip()
        )

    def separator_before(self, section_index: int) -> Piece | None:
        for p in self.pieces:
            if p.kind is PieceKind.SEPARATOR and p.section_index == section_index:
                return p
        return None


def segment(text: str, retrievable: dict[str, Grammar] | None = None) -> Segmentation:
    """Cut ``text`` into separator, header, candidate and protected pieces.

    Never raises for any string; unparseable structure degrades to protected.
    """
    grammars = DEFAULT_RETRIEVABLE if retrievable is None else retrievable
    bounds: list[tuple[int, int]] = []  # section [start, end)
    seps: list[tuple[int, int]] = []  # separator before section i+1
    cursor = 0
    for m in _SEPARATOR.finditer(text):
        bounds.append((cursor, m.start()))
        seps.append((m.start(), m.end()))
        cursor = m.end()
    bounds.append((cursor, len(text)))

    sections: list[Section] = []
    pieces: list[Piece] = []
    for i, (start, end) in enumerate(bounds):
        if i > 0:
            s0, s1 = seps[i - 1]
            pieces.append(Piece(PieceKind.SEPARATOR, s0, s1, "", i))
        name, grammar = _classify_section(text, start, end, i, grammars)
        items = _parse_items(text, start, end, grammar) if grammar else None
        if items is None:
            sections.append(Section(i, start, end, name, False))
            pieces.append(Piece(PieceKind.PROTECTED, start, end, name, i))
            continue
        sections.append(Section(i, start, end, name, True))
        header_end = items[0][0]
        pieces.append(Piece(PieceKind.HEADER, start, header_end, name, i))
        pieces.extend(Piece(PieceKind.CANDIDATE, a, b, name, i) for a, b in items)
    return Segmentation(text, tuple(sections), tuple(pieces))


def _classify_section(
    text: str, start: int, end: int, index: int, grammars: dict[str, Grammar]
) -> tuple[str, Grammar | None]:
    m = _HEADER.match(text, start, end)
    if m is None:
        # Only the first section can lack a header (later ones start at "[").
        return (PREAMBLE if index == 0 else UNKNOWN), None
    name = m.group(1).strip().lower()
    if name in grammars:
        return name, grammars[name]
    if name == FACTS:
        return FACTS, None
    return UNKNOWN, None


def _parse_items(text: str, start: int, end: int, grammar: Grammar) -> list[tuple[int, int]] | None:
    """Item slices of a recognised section, or None when the grammar fails."""
    header_end = text.find("\n", start, end)
    if header_end < 0:
        return None  # header only: nothing to classify, keep it protected
    starts: list[int] = []
    pos = header_end
    while pos < end:
        nxt = text.find("\n", pos + 1, end)
        line_end = end if nxt < 0 else nxt
        line = text[pos + 1 : line_end]
        if _is_item_start(line, grammar):
            starts.append(pos)
        elif not starts or not _is_continuation(line, grammar):
            return None
        pos = line_end
    if not starts:
        return None
    return [(a, starts[k + 1] if k + 1 < len(starts) else end) for k, a in enumerate(starts)]


def _is_item_start(line: str, grammar: Grammar) -> bool:
    if grammar == "block":
        return _BLOCK_ITEM.match(line) is not None
    return _LINE_ITEM.match(line) is not None


def _is_continuation(line: str, grammar: Grammar) -> bool:
    if grammar == "block":
        return True  # anything up to the next "  ### " belongs to the item
    return _LINE_CONTINUATION.fullmatch(line) is not None


# ---------------------------------------------------------------------------
# Bounded candidate selection


class SelectionLimits(BaseModel):
    """Bounds on what is sent to the classifier. Defaults are documented in docs/icarus.md."""

    model_config = ConfigDict(frozen=True)

    max_candidates: int = Field(24, ge=1)
    max_candidate_chars: int = Field(1200, ge=16)
    max_total_chars: int = Field(12000, ge=16)
    max_prompt_chars: int = Field(2000, ge=1)


#: Marker placed where the middle of an over-long candidate was cut. It exists
#: only inside the classifier request, never in the output text.
TRUNCATION_MARKER = "\n[…]\n"


@dataclass(frozen=True, slots=True)
class SentCandidate:
    """A candidate chosen for classification, with its request-local id."""

    request_id: str  # "c1", "c2", ... (request-local, never audited)
    piece: Piece
    text: str  # possibly middle-truncated copy, for the request only


@dataclass(frozen=True, slots=True)
class Selection:
    sent: tuple[SentCandidate, ...]
    unclassified: tuple[Piece, ...] = field(default_factory=tuple)


def truncate_middle(text: str, limit: int) -> str:
    """``text`` with its middle replaced by a marker so the result has ``limit`` chars."""
    if len(text) <= limit:
        return text
    keep = limit - len(TRUNCATION_MARKER)
    head = (keep + 1) // 2
    tail = keep - head
    return text[:head] + TRUNCATION_MARKER + (text[-tail:] if tail else "")


def truncate_prompt(prompt: str, limits: SelectionLimits) -> str:
    """The head of the prompt, for use inside the request only."""
    return prompt[: limits.max_prompt_chars]


def select_candidates(seg: Segmentation, limits: SelectionLimits | None = None) -> Selection:
    """Choose candidates in text order until a bound is hit; the rest stay unclassified.

    The first candidate that would exceed ``max_total_chars`` stops selection
    (later, smaller ones are not squeezed in: text order is the priority).
    """
    lim = limits or SelectionLimits()
    sent: list[SentCandidate] = []
    rest: list[Piece] = []
    total = 0
    stopped = False
    for piece in seg.candidates:
        body = truncate_middle(piece.slice(seg.text).strip(), lim.max_candidate_chars)
        if stopped or len(sent) >= lim.max_candidates or total + len(body) > lim.max_total_chars:
            stopped = True
            rest.append(piece)
            continue
        total += len(body)
        sent.append(SentCandidate(f"c{len(sent) + 1}", piece, body))
    return Selection(tuple(sent), tuple(rest))
