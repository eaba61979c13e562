"""``configHash``: pi-materia's Java-style 31-multiplier hash of ``JSON.stringify(config)``.

JavaScript hashes the string's UTF-16 code units (``charCodeAt``), and ``JSON.stringify`` writes
``1e-7`` (Python: ``1e-07``): a config with an emoji or a small number hashed otherwise in castor.
"""

from __future__ import annotations

import struct

import pytest

from castor.domain.materia.state import config_hash


def _java_hash_of(text: str) -> str:
    h = 0
    units = struct.unpack(f"<{len(text.encode('utf-16-le')) // 2}H", text.encode("utf-16-le"))
    for unit in units:
        h = (31 * h + unit) & 0xFFFFFFFF
    return format(h, "x")


@pytest.mark.timeout(10)
def test_an_ascii_config_hashes_its_compact_json() -> None:
    assert config_hash({"activeLoadout": "hello", "limits": {"maxSocketVisits": 5}}) == _java_hash_of(
        '{"activeLoadout":"hello","limits":{"maxSocketVisits":5}}')
    assert config_hash({}) == _java_hash_of("{}")


@pytest.mark.timeout(10)
def test_text_beyond_the_basic_plane_is_hashed_by_utf16_code_units() -> None:
    config = {"materia": {"Greeter": {"prompt": "Say hi 👋 — café", "tools": "none"}}}
    assert config_hash(config) == _java_hash_of('{"materia":{"Greeter":{"prompt":"Say hi 👋 — café","tools":"none"}}}')


@pytest.mark.timeout(10)
def test_numbers_are_written_as_javascript_writes_them() -> None:
    assert config_hash({"budget": {"maxCostUsd": 1e-7}}) == _java_hash_of('{"budget":{"maxCostUsd":1e-7}}')
