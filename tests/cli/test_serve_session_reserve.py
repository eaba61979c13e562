"""``castor serve`` keeps a first session for every connection it admits: its connections' second
and later sessions leave as many runtime slots free as ``--max-connections`` (at most half)."""

from __future__ import annotations

from typing import Any

import pytest

from castor.cli.app import main


@pytest.mark.timeout(60)
@pytest.mark.parametrize("limit", ["64", "3"])
def test_serve_keeps_a_session_slot_for_each_connection_it_admits(monkeypatch, tmp_path, limit: str) -> None:
    import castor.endpoint.server as server_module

    seen: dict[str, Any] = {}
    monkeypatch.setattr(server_module, "serve", lambda _dispatcher, **kwargs: seen.update(kwargs))
    main(["serve", "--socket", str(tmp_path / "s.sock"), "--max-connections", limit])
    assert seen["max_connections"] == int(limit)
    assert seen["settings"].sessions_kept_for_first == int(limit)
