"""The CLI's session log (``<artifactRoot>/.castor-cli-session.jsonl``) as a link planted in
advance, or on storage that refuses it: the cast goes on, nothing is written through the link,
and stderr says so once -- it used to print a warning for every entry of every transition (a
long cast's stderr filled with the same line)."""

from __future__ import annotations

import json

from tests.cli.interrupted_cast import ONE_SOCKET, castor_cli


def test_a_planted_session_log_link_is_never_written_through_and_said_once(tmp_path):
    root = tmp_path / "project"
    (root / ".pi" / "pi-materia").mkdir(parents=True)
    (root / ".pi" / "pi-materia.json").write_text(json.dumps(ONE_SOCKET))
    (root / "answers.json").write_text(json.dumps(["hi"]))
    outside = tmp_path / "outside.jsonl"
    outside.write_text("")
    (root / ".pi" / "pi-materia" / ".castor-cli-session.jsonl").symlink_to(outside)
    done = castor_cli(tmp_path, "cast", "x", "--agent", "script:answers.json", "--quiet", cwd=root)
    assert done.returncode == 0, done.stderr
    assert outside.read_text() == ""
    said = [line for line in done.stderr.splitlines() if "not recorded" in line]
    assert len(said) == 1, done.stderr
    assert "symlink" in said[0], said


def test_a_spell_of_refused_entries_is_one_warning_and_its_end_is_said():
    import threading

    from loguru import logger

    from castor.actors.materia.session_mirror import SessionMirror

    class Refusing:
        """A session log that refuses its first three entries (a full disk), then takes them."""

        def __init__(self) -> None:
            self.calls = 0
            self.recorded = threading.Event()

        def append_entry(self, custom_type: str, data: dict[str, object], deadline: float) -> None:
            self.calls += 1
            if self.calls <= 3:
                raise OSError(28, "No space left on device")
            self.recorded.set()

    seen: list[tuple[str, str]] = []
    sink = logger.add(lambda m: seen.append((m.record["level"].name, m.record["message"])), level="DEBUG",
                      filter=lambda r: "session entr" in r["message"])
    log = Refusing()
    mirror = SessionMirror(log, name="t")
    try:
        for n in range(4):
            mirror.submit("pi-materia-cast-state", {"n": n})
        assert log.recorded.wait(10)
    finally:
        mirror.close()
        logger.remove(sink)
    assert [level for level, _m in seen] == ["WARNING", "DEBUG", "DEBUG", "INFO"], seen
    assert "(3 were not)" in seen[-1][1] and mirror.appended == 1 and mirror.failing == 0
