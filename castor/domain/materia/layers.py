"""Merging the config layers: default < user < project < explicit.

Rules, applied layer by layer in order:

| key | rule |
|---|---|
| top-level scalars (``artifactDir``...) | replaced when the higher layer defines them; ``null`` deletes |
| ``activeLoadout`` | replaced when the higher layer sets a value; ``null`` keeps the lower layer's (pi-materia's ``??``) |
| ``budget``, ``limits``, ``compaction`` | shallow object merge; a ``null`` field deletes that field; the whole key ``null`` keeps the lower layer's |
| ``materia`` / ``loadouts`` set to ``null`` | the lower layer's are kept |
| ``materia.<name>`` | per-name shallow merge; a ``null`` field deletes it; ``materia.<name>: null`` deletes the materia |
| ``loadouts.<name>: null`` | deletes the loadout, **except** loadouts of the first (bundled default) layer: ignored |
| ``loadouts.<name>: {...}`` | shallow merge (a ``null`` field is set to ``null``: ``entry: null`` then means the first socket); ``sockets`` replaced wholesale (``sockets: null`` keeps the base sockets); ``loops`` from the override if it gives an object, else dropped when the override has a ``sockets`` key, else the base loops |

Pure: inputs are never mutated; the result is a fresh dict. Provenance records which layer
last set each top-level key, each materia field and each loadout.
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel, Field

OBJECT_MERGED = ("budget", "limits", "compaction")
KEEP_ON_NULL = ("activeLoadout", "materia", "loadouts")


class Provenance(BaseModel):
    layers: list[str] = Field(default_factory=list)
    source: str = ""
    keys: dict[str, str] = Field(default_factory=dict)
    loadouts: dict[str, str] = Field(default_factory=dict)
    #: per loadout, the layer that set each of its top-level fields (``sockets``, ``entry``, ``loops``)
    loadout_fields: dict[str, dict[str, str]] = Field(default_factory=dict)
    materia: dict[str, dict[str, str]] = Field(default_factory=dict)
    #: per ``budget``/``limits``/``compaction``, the layer that set each of its fields
    object_fields: dict[str, dict[str, str]] = Field(default_factory=dict)
    #: the top-level keys whose merged value one layer wrote whole (a scalar, or a value of the
    #: wrong shape), by that layer; a merged object is not among them
    whole: dict[str, str] = Field(default_factory=dict)
    protected_loadouts: list[str] = Field(default_factory=list)
    ignored_deletes: list[str] = Field(default_factory=list)


class MergeResult(BaseModel):
    merged: dict[str, Any]
    provenance: Provenance


def _shallow(base: Any, override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base) if isinstance(base, dict) else {}
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = copy.deepcopy(value)
    return out


def merge_loadout(base: dict[str, Any] | None, override: dict[str, Any]) -> dict[str, Any]:
    """One loadout over its base, as pi-materia merges it (see the module table)."""
    if base is None:
        return copy.deepcopy(override)
    out = dict(base)
    for key, value in override.items():
        if key not in ("sockets", "loops"):
            out[key] = copy.deepcopy(value)
    if override.get("sockets") is not None:
        out["sockets"] = copy.deepcopy(override["sockets"])
    if override.get("loops") is not None:
        out["loops"] = copy.deepcopy(override["loops"])
    elif "sockets" in override:
        out.pop("loops", None)
    return out


def merge_layers(layers: list[tuple[str, dict[str, Any]]]) -> MergeResult:
    """Merge ``(label, dict)`` layers, lowest first. The first layer's loadouts are protected."""
    merged: dict[str, Any] = {}
    prov = Provenance(layers=[label for label, _ in layers], source=" < ".join(label for label, _ in layers))
    protected: set[str] = set()
    for index, (label, layer) in enumerate(layers):
        if index == 0 and isinstance(layer.get("loadouts"), dict):
            protected = {k for k, v in layer["loadouts"].items() if v is not None}
            prov.protected_loadouts = sorted(protected)
        for key, value in layer.items():
            if value is None and key in (*KEEP_ON_NULL, *OBJECT_MERGED):
                continue  # pi-materia keeps the lower layer's value here
            if key == "materia":
                _merge_materia(merged, value, label, prov)
            elif key == "loadouts":
                _merge_loadouts(merged, value, label, prov, protected)
            elif key in OBJECT_MERGED and isinstance(value, dict):
                fields = prov.object_fields.get(key, {}) if isinstance(merged.get(key), dict) else {}
                merged[key] = _shallow(merged.get(key), value)
                prov.keys[key] = label
                prov.whole.pop(key, None)
                fields.update({field: label for field, item in value.items() if item is not None})
                prov.object_fields[key] = {field: at for field, at in fields.items() if field in merged[key]}
            elif value is None:
                merged.pop(key, None)
                prov.keys[key] = label
                prov.whole.pop(key, None)
            else:
                merged[key] = copy.deepcopy(value)
                prov.keys[key] = label
                prov.whole[key] = label
                prov.object_fields.pop(key, None)
    return MergeResult(merged=merged, provenance=prov)


def _merge_materia(merged: dict[str, Any], value: Any, label: str, prov: Provenance) -> None:
    if not isinstance(value, dict):
        # Not an object: keep it so validation reports it with its layer.
        merged["materia"] = copy.deepcopy(value)
        prov.keys["materia"] = prov.whole["materia"] = label
        return
    prov.whole.pop("materia", None)
    target = merged.get("materia")
    if not isinstance(target, dict):
        target = {}
    for name, entry in value.items():
        if entry is None:
            target.pop(name, None)
            prov.materia.pop(name, None)
            continue
        if not isinstance(entry, dict):
            target[name] = copy.deepcopy(entry)
            prov.materia[name] = {"*": label}
            continue
        target[name] = _shallow(target.get(name), entry)
        fields = prov.materia.setdefault(name, {})
        for field in entry:
            fields[field] = label
    merged["materia"] = target
    prov.keys["materia"] = label


def _merge_loadouts(
    merged: dict[str, Any], value: Any, label: str, prov: Provenance, protected: set[str]
) -> None:
    if not isinstance(value, dict):
        merged["loadouts"] = copy.deepcopy(value)
        prov.keys["loadouts"] = prov.whole["loadouts"] = label
        return
    prov.whole.pop("loadouts", None)
    target = merged.get("loadouts")
    if not isinstance(target, dict):
        target = {}
    for name, loadout in value.items():
        if loadout is None:
            if name in protected:
                prov.ignored_deletes.append(f"{label}:{name}")
                continue
            target.pop(name, None)
            prov.loadouts.pop(name, None)
            prov.loadout_fields.pop(name, None)
            continue
        if not isinstance(loadout, dict):
            target[name] = copy.deepcopy(loadout)
            prov.loadout_fields[name] = {}
        else:
            base = target.get(name) if isinstance(target.get(name), dict) else None
            target[name] = merge_loadout(base, loadout)
            fields = prov.loadout_fields.setdefault(name, {}) if base is not None else {}
            prov.loadout_fields[name] = fields
            if "sockets" in loadout and loadout.get("loops") is None:
                fields.pop("loops", None)  # dropped with the base's sockets (merge_loadout)
            fields.update({key: label for key, field in loadout.items()
                           if field is not None or key not in ("sockets", "loops")})
        if name not in protected:
            prov.loadouts[name] = label
        else:
            # A shipped loadout reports its source as the default layer even when overridden.
            prov.loadouts.setdefault(name, prov.layers[0] if prov.layers else label)
    merged["loadouts"] = target
    prov.keys["loadouts"] = label
