"""Icarus bridge settings: the ``piIcarusHook`` section of Pi's ``settings.json``.

Pure rules only: the caller (``castor.adapters.icarus.settings_store``) reads the
files and hands each in as a :class:`SettingsLayer`; nothing here touches the
filesystem (an ``exists`` predicate is injected for the one rule that needs it).

Resolution
----------
=====================  ==========================================================
layer order            trusted project ``<cwd>/.pi/settings.json`` -> global
                       ``${PI_CODING_AGENT_DIR:-~/.pi/agent}/settings.json`` ->
                       built-in defaults. An untrusted project layer is ignored
                       entirely (it may name an executable or a package).
section key            first of ``piIcarusHook``, ``pi-icarus-hook``,
                       ``icarusHook`` holding an object; never merged.
per key                first layer whose section defines the key (canonical
                       name before its aliases) wins.
strings                need a non-empty trimmed string, else fall through.
bools / ints           the first *defined* value wins; an invalid one gives the
                       built-in default plus a warning (a pi-icarus-hook quirk, kept).
backend paths/identity environment overrides settings; see ``BACKEND_ENV``.
=====================  ==========================================================

Loading is tolerant: a missing, unreadable or malformed file is a layer with
``doc=None`` (its error becomes a warning); bad values become defaults plus a
warning. Resolution never raises for bad input.
"""

from __future__ import annotations

import math
import posixpath
import re
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

PACKAGE_NAME = "pi-icarus-hook"
SECTION_KEYS: tuple[str, ...] = ("piIcarusHook", "pi-icarus-hook", "icarusHook")
CANONICAL_SECTION = SECTION_KEYS[0]
DEFAULT_FOOTER = "\U0001fabd Icarus"
PROJECT_SETTINGS_RELPATH = ".pi/settings.json"
GLOBAL_SETTINGS_LOCATION = "${PI_CODING_AGENT_DIR:-~/.pi/agent}/settings.json"

_FALSE_WORDS = frozenset({"false", "0", "no", "off", "disabled"})


class Source(StrEnum):
    PROJECT = "project"
    GLOBAL = "global"
    BUILTIN = "built-in"
    ENV = "env"


class SettingsLayer(BaseModel):
    """One settings file as read by the adapter. ``doc`` is None when unusable."""

    model_config = ConfigDict(frozen=True)

    scope: Literal["project", "global"]
    path: str  # absolute path of the settings.json file
    doc: dict[str, Any] | None = None
    error: str | None = None  # why the file was unusable (missing files have none)
    #: The storage refused the read for a reason of the file's own that may pass (``EACCES``,
    #: ``EIO``): read it again once it changes.
    refused: bool = False
    #: When ``refused``: what told this version of the file apart (the adapter's stat signature;
    #: None when even a stat failed).
    signature: tuple[int, ...] | None = None

    @property
    def directory(self) -> str:
        return posixpath.dirname(self.path)

    def section(self) -> tuple[str | None, dict[str, Any] | None]:
        """(section key, section) of the first alias holding an object."""
        if not isinstance(self.doc, dict):
            return None, None
        for key in SECTION_KEYS:
            value = self.doc.get(key)
            if isinstance(value, dict):
                return key, value
        return None, None


# --------------------------------------------------------------------------- key table

Kind = Literal["bool", "posint", "string", "classifier"]


class KeySpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    key: str
    field: str
    kind: Kind
    default: Any
    aliases: tuple[str, ...] = ()
    description: str


EXTENSION_KEYS: tuple[KeySpec, ...] = (
    KeySpec(key="platform", field="platform", kind="string", default="pi",
            description="Platform label passed to Icarus hooks."),
    KeySpec(key="hooks", field="hooks", kind="bool", default=True, aliases=("bindHooks",),
            description="Register the automatic lifecycle hooks (retrieve before prompts, capture settled exchanges)."),
    KeySpec(key="tools", field="tools", kind="bool", default=True, aliases=("registerTools",),
            description="Register the normal Fabric tools and icarus_hook_config."),
    KeySpec(key="adminTools", field="admin_tools", kind="bool", default=False, aliases=("registerAdminTools",),
            description="Also register admin tools (only when tools is true)."),
    KeySpec(key="timeoutMs", field="timeout_ms", kind="posint", default=30000, aliases=("callTimeoutMs",),
            description="Per worker-call timeout in milliseconds; a timeout retires the worker."),
    KeySpec(key="classifier", field="classifier", kind="classifier", default="default",
            description="Relevance classifier: default (automatic), none, or an exact provider/model-id."),
    KeySpec(key="classifierTimeoutMs", field="classifier_timeout_ms", kind="posint", default=5000,
            description="Total model discovery + classification deadline in milliseconds."),
    KeySpec(key="contextDisplay", field="context_display", kind="bool", default=True, aliases=("hiddenDisplay",),
            description="Show injected memory messages (the model receives them either way). "
                        "Legacy alias hiddenDisplay has the same, non-inverted meaning."),
    KeySpec(key="footerStatus", field="footer_status", kind="string", default=DEFAULT_FOOTER, aliases=("statusLabel",),
            description="Footer status text shown under the 'icarus' key while hooks are active."),
)
KEY_BY_NAME: dict[str, KeySpec] = {spec.key: spec for spec in EXTENSION_KEYS}

# Backend path / identity keys: (canonical, aliases, env overrides in order).
BACKEND_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "icarusDir": (("icarus_dir",), ("ICARUS_DIR",)),
    "python": (("icarusPython", "icarus_python"), ("ICARUS_PYTHON",)),
    "hermesHome": (("hermes_home",), ("HERMES_HOME",)),
    "fabricDir": (("fabric_dir",), ("FABRIC_DIR",)),
    "agent": (("agentName", "hermesAgentName"), ("HERMES_AGENT_NAME", "FABRIC_AGENT")),
    "projectId": (("project_id",), ("FABRIC_PROJECT_ID",)),
    "stateDbPath": (("state_db_path",), ("STATE_DB_PATH", "HERMES_STATE_DB")),
}
BACKEND_ENV: dict[str, str] = {
    "ICARUS_DIR": "icarusDir", "ICARUS_PYTHON": "python", "HERMES_HOME": "hermesHome",
    "FABRIC_DIR": "fabricDir", "HERMES_AGENT_NAME": "agent", "FABRIC_PROJECT_ID": "projectId",
    "STATE_DB_PATH": "stateDbPath",
}
# ``CONFIG_SCHEMA.runtimeEnv``: each backend variable as ``{default?, description}`` (the shape
# pi-icarus-hook's schema has). ``default`` says what applies when neither the variable nor the
# setting is given; a variable without one has no fixed fallback (derived, or left to the backend).
RUNTIME_ENV_SCHEMA: dict[str, dict[str, str]] = {
    "ICARUS_DIR": {"default": "~/.hermes/plugins/icarus",
                   "description": "Directory of the Icarus Python package; overrides icarusDir "
                                  "(fallback: plugins/icarus under the Hermes home when that is known)."},
    "ICARUS_PYTHON": {"default": "python3",
                      "description": "Python executable that runs the persistent Icarus worker; overrides python."},
    "HERMES_HOME": {"default": "~/.hermes when present",
                    "description": "Hermes home for Icarus state files; overrides hermesHome."},
    "FABRIC_DIR": {"default": "~/fabric", "description": "Fabric entry directory; overrides fabricDir."},
    "HERMES_AGENT_NAME": {"description": "Agent identity given to Icarus (FABRIC_AGENT is read next); overrides "
                                         "agent. Fallback: the suffix of a .hermes-<agent> home, else pi-agent."},
    "FABRIC_PROJECT_ID": {"default": "current directory name",
                          "description": "Project id given to Icarus writes and retrieval; overrides projectId."},
    "STATE_DB_PATH": {"description": "Hermes session SQLite path (HERMES_STATE_DB is read next); overrides "
                                     "stateDbPath. Unset: the backend decides."},
}
assert set(RUNTIME_ENV_SCHEMA) == set(BACKEND_ENV)
# Settings-file paths resolved against the file's directory.
_SETTINGS_RELATIVE_PATHS = frozenset({"icarusDir", "hermesHome", "fabricDir"})
# Executable-ish paths: a value with a separator is resolved against the directory of the settings
# file that wrote it, like the paths above — never against the session's cwd (an untrusted project:
# a relative global ``python`` must not run the project's ``.venv/bin/python``). A bare name
# (``python3``) stays a name for the launcher's PATH lookup, which skips the project.
_SETTINGS_SPAWN_PATHS = frozenset({"python", "stateDbPath"})
# Extra places a file may hold fabricDir, checked in order after the section.
_FABRIC_TOP_LEVEL: tuple[tuple[str, ...], ...] = (
    ("fabricDir",), ("fabric_dir",), ("fabric", "dir"), ("fabric", "fabricDir"),
    ("piFabric", "dir"), ("piFabric", "fabricDir"), ("pi-fabric", "dir"), ("pi-fabric", "fabricDir"),
)


class IcarusSettings(BaseModel):
    """The effective configuration of one session's bridge."""

    model_config = ConfigDict(frozen=True)

    platform: str = "pi"
    hooks: bool = True
    tools: bool = True
    admin_tools: bool = False
    timeout_ms: int = 30000
    classifier: str = "default"
    classifier_timeout_ms: int = 5000
    context_display: bool = True
    footer_status: str = DEFAULT_FOOTER
    # backend paths and identity
    icarus_dir: str
    python: str = "python3"
    hermes_home: str | None = None
    fabric_dir: str
    agent: str = "pi-agent"
    project_id: str = "unknown"
    state_db_path: str | None = None
    # provenance
    trusted: bool = False
    sources: dict[str, Source] = Field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    #: The files that count but whose read the storage refused (``SettingsLayer.refused``), each
    #: with what told it apart then: the session reads its settings again once one changes.
    refused_files: tuple[tuple[str, tuple[int, ...] | None], ...] = ()

    @property
    def admin_tools_enabled(self) -> bool:
        return self.tools and self.admin_tools


# --------------------------------------------------------------------------- value parsing

def parse_bool(value: Any) -> bool | None:
    """Pi boolean words; None means invalid (caller uses the default)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, str):
        return value.strip().lower() not in _FALSE_WORDS
    return None


_LEADING_INT = re.compile(r"\s*([+-]?\d+)")


MAX_POSITIVE_INT = 86_400_000
"""The posint keys are timeouts in ms: more than a day is a mistake (and overflows deadlines)."""


def parse_positive_int(value: Any) -> int | None:
    """Finite number in (0, MAX_POSITIVE_INT] (truncated) or a decimal-prefix string (``"1234ms"``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        number = int(value)
        return number if 0 < number <= MAX_POSITIVE_INT else None
    if isinstance(value, str):
        match = _LEADING_INT.match(value[:32])
        if match:
            number = int(match.group(1))
            return number if 0 < number <= MAX_POSITIVE_INT else None
    return None


def parse_string(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def parse_classifier(value: str) -> str | None:
    """``default`` / ``none`` (any case, trimmed: written back lower-case) or ``provider/model``;
    None for anything else (which then behaves like ``none``: see :func:`_resolve_key`)."""
    keyword = value.strip().lower()
    if keyword in ("default", "none"):
        return keyword
    provider, sep, model = value.partition("/")
    if sep and provider.strip() and model.strip():
        return value
    return None


# --------------------------------------------------------------------------- paths

def expand_home(value: str, home: str) -> str:
    """Expand a leading ``~/`` only (a bare ``~`` is kept, as Pi does)."""
    if value.startswith("~/"):
        return posixpath.join(home, value[2:])
    return value


def resolve_path(value: str, base_dir: str, home: str) -> str:
    """``~/``-expand, then resolve a relative path against ``base_dir``."""
    expanded = expand_home(value, home)
    if not posixpath.isabs(expanded):
        expanded = posixpath.join(base_dir, expanded)
    return posixpath.normpath(expanded)


def resolve_spawn_path(value: str, cwd: str, home: str) -> str:
    """``python``/``stateDbPath``: a value with a separator is a path against ``cwd`` (for a
    value from a settings file: that file's directory, see ``_SETTINGS_SPAWN_PATHS``; only an
    environment variable the user set is taken against the session's cwd); a bare name
    (``python3``) is returned unchanged for a PATH lookup."""
    expanded = expand_home(value, home)
    if "/" not in expanded:
        return expanded
    return resolve_path(expanded, cwd, home)


def settings_paths(cwd: str, env: Mapping[str, str], home: str) -> tuple[str, str]:
    """(project settings path, global settings path)."""
    project = posixpath.join(cwd, PROJECT_SETTINGS_RELPATH)
    agent_dir = env.get("PI_CODING_AGENT_DIR") or "~/.pi/agent"
    global_dir = resolve_path(agent_dir, cwd, home)
    return project, posixpath.join(global_dir, "settings.json")


# --------------------------------------------------------------------------- resolution

def _active_layers(project: SettingsLayer | None, global_: SettingsLayer | None,
                   trusted: bool) -> list[SettingsLayer]:
    layers = []
    if trusted and project is not None:
        layers.append(project)
    if global_ is not None:
        layers.append(global_)
    return layers


def _lookup(section: dict[str, Any], names: tuple[str, ...]) -> tuple[bool, Any]:
    for name in names:
        if name in section:
            return True, section[name]
    return False, None


def _resolve_extension_key(spec: KeySpec, layers: list[SettingsLayer],
                           warnings: list[str]) -> tuple[Any, Source]:
    names = (spec.key, *spec.aliases)
    for layer in layers:
        _, section = layer.section()
        if section is None:
            continue
        found, raw = _lookup(section, names)
        if not found:
            continue
        source = Source(layer.scope)
        if spec.kind in ("string", "classifier"):
            text = parse_string(raw)
            if text is None:
                continue  # strings fall through to the next layer
            if spec.kind == "classifier":
                parsed = parse_classifier(text)
                if parsed is None:
                    # Kept as written: the classifier reads it as invalid and behaves like "none" (no
                    # model is asked, the text goes through as it is, the choice is audited). The
                    # built-in "default" here sent the user's prompt to whatever model was
                    # available -- a remote one included -- for a value like "None" or "off".
                    warnings.append(f"{layer.scope} settings: invalid classifier {text!r}; filtering is off "
                                    "(as with 'none')")
                    return text, source
                return parsed, source
            return text, source
        value = parse_bool(raw) if spec.kind == "bool" else parse_positive_int(raw)
        if value is None:
            warnings.append(f"{layer.scope} settings: invalid {spec.key} value; using default {spec.default!r}")
            return spec.default, Source.BUILTIN
        return value, source
    return spec.default, Source.BUILTIN


def _dig(doc: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = doc
    for part in path:
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _backend_from_layers(key: str, layers: list[SettingsLayer], home: str) -> tuple[str | None, Source]:
    aliases, _ = BACKEND_KEYS[key]
    for layer in layers:
        _, section = layer.section()
        candidates: list[Any] = []
        if section is not None:
            candidates.extend(section.get(name) for name in (key, *aliases))
        if key == "fabricDir" and isinstance(layer.doc, dict):
            candidates.extend(_dig(layer.doc, path) for path in _FABRIC_TOP_LEVEL)
        for raw in candidates:
            text = parse_string(raw)
            if text is None:
                continue
            if key in _SETTINGS_RELATIVE_PATHS:
                text = resolve_path(text, layer.directory, home)
            elif key in _SETTINGS_SPAWN_PATHS:
                text = resolve_spawn_path(text, layer.directory, home)
            return text, Source(layer.scope)
    return None, Source.BUILTIN


def _backend_from_env(key: str, env: Mapping[str, str], cwd: str, home: str) -> str | None:
    _, env_names = BACKEND_KEYS[key]
    for name in env_names:
        text = parse_string(env.get(name))
        if text is None:
            continue
        if key in _SETTINGS_RELATIVE_PATHS:
            return resolve_path(text, cwd, home)
        return text
    return None


def _agent_from_home(hermes_home: str | None) -> str | None:
    if not hermes_home:
        return None
    base = posixpath.basename(posixpath.normpath(hermes_home))
    if base.startswith(".hermes-") and len(base) > len(".hermes-"):
        return base[len(".hermes-"):]
    return None


def _resolve_backend(layers: list[SettingsLayer], env: Mapping[str, str], cwd: str, home: str,
                     exists: Callable[[str], bool]) -> tuple[dict[str, Any], dict[str, Source]]:
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    for key in BACKEND_KEYS:
        env_value = _backend_from_env(key, env, cwd, home)
        if env_value is not None:
            values[key], sources[key] = env_value, Source.ENV
        else:
            values[key], sources[key] = _backend_from_layers(key, layers, home)

    if values["hermesHome"] is None:
        candidate = posixpath.join(home, ".hermes")
        values["hermesHome"] = candidate if exists(candidate) else None
    if values["icarusDir"] is None:
        base = values["hermesHome"] or posixpath.join(home, ".hermes")
        values["icarusDir"] = posixpath.join(base, "plugins", "icarus")
    if values["python"] is None:
        values["python"] = "python3"
    if values["fabricDir"] is None:
        values["fabricDir"] = posixpath.join(home, "fabric")
    if values["agent"] is None:
        values["agent"] = _agent_from_home(values["hermesHome"]) or "pi-agent"
    if values["projectId"] is None:
        values["projectId"] = posixpath.basename(posixpath.normpath(cwd)) or "unknown"
    return values, sources


def resolve_settings(
    *,
    project: SettingsLayer | None,
    global_: SettingsLayer | None,
    trusted: bool,
    env: Mapping[str, str],
    cwd: str,
    home: str,
    exists: Callable[[str], bool] = lambda _path: False,
) -> IcarusSettings:
    """Effective settings. Never raises for bad input; see the module table."""
    warnings: list[str] = []
    for layer in (project if trusted else None, global_):
        if layer is not None and layer.error:
            warnings.append(f"{layer.scope} settings ignored: {layer.error}")
    layers = _active_layers(project, global_, trusted)
    fields: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    for spec in EXTENSION_KEYS:
        fields[spec.field], sources[spec.key] = _resolve_extension_key(spec, layers, warnings)
    backend, backend_sources = _resolve_backend(layers, env, cwd, home, exists)
    sources.update(backend_sources)
    refused = tuple((layer.path, layer.signature) for layer in (project if trusted else None, global_)
                    if layer is not None and layer.refused)
    return IcarusSettings(
        **fields,
        icarus_dir=backend["icarusDir"],
        python=backend["python"],
        hermes_home=backend["hermesHome"],
        fabric_dir=backend["fabricDir"],
        agent=backend["agent"],
        project_id=backend["projectId"],
        state_db_path=backend["stateDbPath"],
        trusted=trusted,
        sources=sources,
        warnings=tuple(warnings),
        refused_files=refused,
    )


# --------------------------------------------------------------------------- inspection

class BoolInspection(BaseModel):
    """Where a boolean setting's effective value comes from."""

    model_config = ConfigDict(frozen=True)

    key: str
    value: bool
    source: Source
    path: str | None
    package_key: str = CANONICAL_SECTION


def scope_bool(layer: SettingsLayer | None, key: str) -> bool | None:
    """The layer's own value for a bool key (canonical before aliases); None if unset/invalid."""
    if layer is None:
        return None
    _, section = layer.section()
    if section is None:
        return None
    spec = KEY_BY_NAME[key]
    found, raw = _lookup(section, (spec.key, *spec.aliases))
    return parse_bool(raw) if found else None


def inspect_bool(key: str, *, project: SettingsLayer | None, global_: SettingsLayer | None,
                 trusted: bool) -> BoolInspection:
    for layer in _active_layers(project, global_, trusted):
        value = scope_bool(layer, key)
        if value is not None:
            section_key, _ = layer.section()
            return BoolInspection(key=key, value=value, source=Source(layer.scope), path=layer.path,
                                  package_key=section_key or CANONICAL_SECTION)
    return BoolInspection(key=key, value=bool(KEY_BY_NAME[key].default), source=Source.BUILTIN, path=None)


# --------------------------------------------------------------------------- writes (pure half)

class SettingsDocumentError(ValueError):
    """A settings document that must not be overwritten (not an object, bad section)."""


WriteScope = Literal["project", "global"]
DefaultAction = Literal["show", "hide", "toggle"]


class WritePlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    scope: WriteScope
    path: str
    warnings: tuple[str, ...] = ()


def plan_default_write(key: str, *, scope: WriteScope | None, trusted: bool,
                       project: SettingsLayer, global_: SettingsLayer) -> WritePlan | str:
    """Choose the file for ``/icarus context default …`` (the scope rules).

    Returns a plan, or a refusal message (nothing may be written). Without an
    explicit scope: the scope already defining the key (project first, only when
    trusted), else global. Untrusted sessions may only write global.
    """
    if scope == "project" and not trusted:
        return "Project settings are not trusted in this session; nothing was written (use global)."
    if scope is None:
        if trusted and scope_bool(project, key) is not None:
            scope = "project"
        else:
            scope = "global"
    warnings: list[str] = []
    if scope == "global" and trusted and scope_bool(project, key) is not None:
        warnings.append(f"Project settings at {project.path} define {key} and override the global value.")
    path = project.path if scope == "project" else global_.path
    return WritePlan(scope=scope, path=path, warnings=tuple(warnings))


def apply_bool_default(doc: Any, key: str, action: DefaultAction) -> tuple[dict[str, Any], bool]:
    """Set ``key`` in the file's section; return (new document, value written).

    ``toggle`` flips this document's own value (its default when unset). Writes
    go into the first section key holding an object, else a new ``piIcarusHook``;
    the canonical key is written as a JSON boolean, a legacy alias is left as is,
    unrelated keys are preserved. Raises :class:`SettingsDocumentError` for a
    document that is not an object or whose section key holds a non-object.
    """
    if not isinstance(doc, dict):
        raise SettingsDocumentError("settings file top level is not a JSON object")
    layer = SettingsLayer(scope="global", path="/settings.json", doc=doc)
    section_key, section = layer.section()
    if section_key is None:
        clashing = [k for k in SECTION_KEYS if k in doc]
        if clashing:
            raise SettingsDocumentError(f"settings section {clashing[0]!r} is not a JSON object")
        section_key, section = CANONICAL_SECTION, {}
    if action == "toggle":
        current = scope_bool(layer, key)
        value = not (KEY_BY_NAME[key].default if current is None else current)
    else:
        value = action == "show"
    new_doc = dict(doc)
    new_section = dict(section or {})
    new_section[key] = value
    new_doc[section_key] = new_section
    return new_doc, value


# --------------------------------------------------------------------------- schema + inspection

def config_schema() -> dict[str, Any]:
    """``CONFIG_SCHEMA``: read-only description of the supported settings."""
    type_names = {"bool": "boolean", "posint": "integer", "string": "string", "classifier": "string"}
    settings: dict[str, Any] = {}
    for spec in EXTENSION_KEYS:
        entry: dict[str, Any] = {"type": type_names[spec.kind], "default": spec.default,
                                 "description": spec.description}
        if spec.aliases:
            entry["aliases"] = list(spec.aliases)
        settings[spec.key] = entry
    return {
        "key": CANONICAL_SECTION,
        "aliases": list(SECTION_KEYS[1:]),
        "locations": [PROJECT_SETTINGS_RELPATH, GLOBAL_SETTINGS_LOCATION],
        "settings": settings,
        "runtimeEnv": {name: dict(entry) for name, entry in RUNTIME_ENV_SCHEMA.items()},
    }


def config_inspection(settings: IcarusSettings) -> dict[str, Any]:
    """``configInspection``: effective values (nulls for unset), snippet and note."""
    effective = {
        "platform": settings.platform, "hooks": settings.hooks, "tools": settings.tools,
        "adminTools": settings.admin_tools, "timeoutMs": settings.timeout_ms,
        "classifier": settings.classifier, "classifierTimeoutMs": settings.classifier_timeout_ms,
        "contextDisplay": settings.context_display, "footerStatus": settings.footer_status,
        "icarusDir": settings.icarus_dir, "python": settings.python, "hermesHome": settings.hermes_home,
        "fabricDir": settings.fabric_dir, "agent": settings.agent, "projectId": settings.project_id,
        "stateDbPath": settings.state_db_path,
    }
    snippet_keys = ("platform", "hooks", "tools", "adminTools", "timeoutMs", "contextDisplay",
                    "footerStatus", "classifier", "classifierTimeoutMs")
    return {
        "package": PACKAGE_NAME,
        "schema": config_schema(),
        "effective": effective,
        "sources": {k: str(v) for k, v in settings.sources.items()},
        "warnings": list(settings.warnings),
        "settingsSnippet": {CANONICAL_SECTION: {k: effective[k] for k in snippet_keys}},
        "note": "Read-only. Project settings count only in trusted projects; backend paths and "
                "identity may be overridden by environment variables. Reload after editing.",
    }
