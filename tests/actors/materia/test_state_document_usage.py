"""The state document splices the usage report's JSON (derived once per report, see
``castor.domain.materia.budget.usage_state_json``) between the fields before and after it: every
transition's document is byte for byte what serialising the whole state writes, and every
``usage.json`` text is what pydantic's indented dump of the report writes."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from castor.actors.materia import cast_actor
from castor.actors.materia.cast_actor import _OUTBOX_OPEN, FILE_EFFECTS, CastActor, _outbox_json
from castor.domain.materia import budget, engine
from castor.domain.materia.budget import UsageReport
from castor.domain.materia.cast_messages import WriteArtifact
from castor.domain.materia.state import CastState
from tests.domain.materia.scripted import Driver, resolved


def whole_document(state: CastState, files: list[Any]) -> bytes:
    """The document as written before the report was spliced in: the state serialised whole."""
    body = CastState.__pydantic_serializer__.to_json(state, exclude={"config"})
    config_json = json.dumps(state.config.model_dump(mode="json"), ensure_ascii=False, allow_nan=False).encode()
    outbox = b",".join([_outbox_json(effect, state.config, {}) for effect in files])
    return body[:-1] + _OUTBOX_OPEN + outbox + b'],"config":' + config_json + b"}"


def test_every_transition_of_a_cast_with_turns_writes_the_whole_state_byte_for_byte(
        monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[tuple[UsageReport, str]] = []  # each usage.json text, with the report it was made of

    def usage_file_text(report: UsageReport) -> str:
        written.append((report, budget.usage_file_text(report)))
        return written[-1][1]

    monkeypatch.setattr(engine, "usage_file_text", usage_file_text)
    d = Driver(resolved(None, "build"), request="fais-le ✓ \"vite\"")
    d.utility({"ok": True, "added": []})
    d.utility({"kind": "git", "root": "/w"})
    d.reply({"workItems": [{"id": "α", "title": "Alpha"}, {"id": "b", "title": "Beta"}]},
            usage={"inputTokens": 10, "outputTokens": 5, "cost": {"total": 0.1}})
    n = 0
    for reply in ["did α", {"satisfied": True}, "did b", {"satisfied": True}, "All done."]:
        n += 1
        d.reply(reply, usage={"input": n, "output": 0.5 * n, "cacheRead": 3, "cost": {"total": 0.2 * n}}
                if n % 2 else {"totalTokens": n})
    assert len(d.state.usage.turns) == 6
    for transition in d.transitions:
        files = [effect for effect in transition.effects if isinstance(effect, FILE_EFFECTS)]
        for state in (transition.state, transition.state.model_copy(update={"budget_warned": True})):
            pieces = CastActor._encode(SimpleNamespace(), state, files)  # type: ignore[arg-type]
            assert b"".join(pieces) == whole_document(state, files)
    assert len(written) >= 6
    for report, text in written:
        assert text == report.model_dump_json(indent=2, exclude_none=True)


@pytest.mark.timeout(60)
def test_each_transitions_usage_json_entry_is_joined_from_pieces_and_is_pydantics(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Each transition encoded right after its step, as the cast does: its usage.json entry is the
    # one joined from the pieces' escapes (not pydantic's escape of the whole text), byte for byte
    # what the effect's serialiser writes, and loaded back (a replay) it is the same text.
    escaped_whole: list[int] = []
    escape = budget._escape
    monkeypatch.setattr(budget, "_escape", lambda text: escaped_whole.append(len(text)) or escape(text))
    joined: list[bytes | None] = []
    monkeypatch.setattr(cast_actor, "usage_file_text_json",
                        lambda text: joined.append(budget.usage_file_text_json(text)) or joined[-1])
    d = Driver(resolved(None, "build"), request="fais-le ✓ \"vite\" \\ \u2028 \x01")
    checked = 0

    def check() -> None:
        nonlocal checked
        transition = d.transitions[-1]
        files = [effect for effect in transition.effects if isinstance(effect, FILE_EFFECTS)]
        writes = [effect for effect in files if getattr(effect, "path", None) == ("usage.json",)]
        escaped_whole.clear()
        joined.clear()
        pieces = CastActor._encode(SimpleNamespace(), transition.state, files)  # type: ignore[arg-type]
        assert b"".join(pieces) == whole_document(transition.state, files)
        for write in writes:
            entry = WriteArtifact.__pydantic_serializer__.to_json(write)
            assert entry in b"".join(pieces)
            assert WriteArtifact.model_validate_json(entry).content == write.content
            # joined from pieces: nothing escaped as long as the text itself
            assert all(n < len(write.content) for n in escaped_whole), (escaped_whole, len(write.content))
            assert joined and joined[0] is not None and joined[0] in entry  # the encode's (first) call
            checked += 1

    d.utility({"ok": True, "added": []})
    check()
    d.utility({"kind": "git", "root": "/w"})
    check()
    d.reply({"workItems": [{"id": "α", "title": "Alpha"}, {"id": "b", "title": "Beta"}]},
            usage={"inputTokens": 10, "outputTokens": 5, "cost": {"total": 0.1}})
    check()
    for n, reply in enumerate(["did α", {"satisfied": True}, "did b", {"satisfied": True}, "All done."], 1):
        d.reply(reply, usage={"input": n, "cost": {"total": 0.2 * n}} if n % 2 else None)
        check()
    assert checked >= 6
