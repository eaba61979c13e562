"""An error about a top-level value, or a field of ``budget``/``limits``/``compaction``, names the
layer file that wrote it (as an error in a materia or a loadout already did): it named the whole
chain ``castor:bundled-default < <profile> < <project>``, though one file set the value."""

from __future__ import annotations

import pytest

from castor.domain.materia.config import ConfigError
from castor.domain.materia.resolve import load_config, resolve_config

DEFAULT = ("castor:bundled-default", {"activeLoadout": "hello", "budget": {"maxTokens": 10, "warnAtPercent": 75},
                                      "materia": {"M": {"prompt": "p", "tools": "none"}},
                                      "loadouts": {"hello": {"sockets": {"Socket-1": {"type": "agent",
                                                                                      "materia": "M"}}}}})


def _sources(*layers: tuple[str, dict[str, object]]) -> list[tuple[str, str | None]]:
    return [(i.path, i.source) for i in load_config([DEFAULT, *layers]).issues]


@pytest.mark.timeout(10)
def test_a_bad_field_of_a_merged_object_names_the_layer_that_set_that_field() -> None:
    assert _sources(("profile.json", {"budget": {"maxTokens": "lots"}}),
                    ("project.json", {"budget": {"warnAtPercent": 50}})) == [("/budget/maxTokens", "profile.json")]
    tiers = [{"maxContextWindow": 100, "thresholdPercent": 50}, {"minContextWindow": 200, "thresholdPercent": 40}]
    assert _sources(("profile.json", {"compaction": {"proactiveThresholdTiers": tiers}}),
                    ("project.json", {"limits": {"maxSocketVisits": 3}})) == [
        ("/compaction/proactiveThresholdTiers/1/minContextWindow", "profile.json")]


@pytest.mark.timeout(10)
def test_a_top_level_value_of_the_wrong_shape_names_its_layer() -> None:
    assert _sources(("profile.json", {"limits": []}), ("project.json", {"activeLoadout": "hello"})) == [
        ("/limits", "profile.json")]
    assert _sources(("profile.json", {"materia": "x"})) == [("/materia", "profile.json")]
    assert _sources(("profile.json", {"loadouts": "x"}), ("project.json", {})) == [("/loadouts", "profile.json")]


@pytest.mark.timeout(10)
def test_an_unknown_active_loadout_names_the_layer_that_chose_it() -> None:
    loaded = load_config([DEFAULT, ("profile.json", {"activeLoadout": "Nope"}), ("project.json", {"limits": {}})])
    with pytest.raises(ConfigError) as err:
        resolve_config(loaded)
    assert [(i.path, i.source) for i in err.value.issues] == [("/activeLoadout", "profile.json")]


@pytest.mark.timeout(10)
def test_a_field_no_single_layer_set_still_names_the_chain() -> None:
    """A field that is missing (a materia without a prompt) was written by no file."""
    [(path, source)] = _sources(("profile.json", {"materia": {"N": {"tools": "none"}}}), ("project.json", {}))
    assert path == "/materia/N/prompt" and source == "castor:bundled-default < profile.json < project.json"
