"""Finding, reading and merging the four materia config layers, from disk.

| scope | where | when |
|---|---|---|
| default | castor's bundled config (:mod:`castor.domain.materia.defaults`) | always |
| user | ``$PI_MATERIA_PROFILE_DIR/materia.json`` (trimmed), else ``~/.config/pi/pi-materia/materia.json`` | if the file exists |
| project | ``<cwd>/.pi/pi-materia.json`` | if the file exists |
| explicit | ``--config PATH``, else ``$MATERIA_CONFIG`` (trimmed; blank = unset); relative to cwd | missing file is an error |

Guarantees: every problem is reported as a :class:`ConfigIssue` with a stable code and the file
it came from — unreadable files, malformed JSON (with line and column) and non-object files
included; nothing here lets a traceback escape for bad input. :func:`load_resolved` raises
:class:`ConfigError` holding **every** issue. Reading never executes anything from the project.
Only a regular file of at most :data:`MAX_CONFIG_BYTES` is read (a path to ``/dev/zero`` or a
FIFO is a ``read-error``, not a hang); a lone surrogate escaped in its JSON becomes U+FFFD. A key
repeated in one object keeps its last value, as ``JSON.parse`` does, and is a ``duplicate-key``
*warning* at that member (the earlier values are never silently lost): it reaches ``castor
validate`` and the resolved config's warnings, so a cast reports it.
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

import functools
import json
import os
import threading
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from castor.adapters.fs import (
    NO_DESCRIPTOR_ERRNOS,
    UnsafeFile,
    atomic_write_bytes,
    file_signature,
    foreign_owner,
    is_storage_fault,
    make_dirs,
    project_artifact_root,
    read_regular_file,
    storage_unavailable,
)
from castor.domain.jsontext import js_float, js_int, json_kind, json_problem, nested_deeper_than, well_formed
from castor.domain.materia.config import ConfigError, ConfigIssue, LayerInfo, ResolvedConfig, pointer, warning
from castor.domain.materia.config_edit import EditRefused, set_top_level_string
from castor.domain.materia.defaults import DEFAULT_LABEL, default_config
from castor.domain.materia.resolve import LoadedConfig, load_config, resolve_config
from castor.domain.paths import inside
from castor.messages.errors import Forbidden

PROJECT_CONFIG = Path(".pi") / "pi-materia.json"
PROFILE_FILE = "materia.json"
MAX_CONFIG_BYTES = 4 * 1024 * 1024
#: A layer nested deeper than this is ``invalid-json``: the resolved config is saved in every cast's
#: state, whose serialiser stops at ~250 levels, so a deeper layer validated and then crash-looped
#: every start (``internal``). The same bound as a model's JSON output (handoff.MAX_DEPTH).
MAX_CONFIG_DEPTH = 200
"""A config layer larger than this is refused (``read-error``): configs are hand-written."""


def profile_dir(env: Mapping[str, str] | None = None, home: Path | None = None) -> Path:
    env = os.environ if env is None else env
    configured = (env.get("PI_MATERIA_PROFILE_DIR") or "").strip()
    if configured:
        return Path(configured).expanduser()
    return (home or Path.home()) / ".config" / "pi" / "pi-materia"


def explicit_path(cwd: Path, flag: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None) -> Path | None:
    """``--config`` wins over ``MATERIA_CONFIG``; they are never both layered."""
    env = os.environ if env is None else env
    chosen = str(flag).strip() if flag is not None and str(flag).strip() else (env.get("MATERIA_CONFIG") or "").strip()
    if not chosen:
        return None
    path = Path(chosen).expanduser()
    return path if path.is_absolute() else Path(cwd) / path


class _NotJson(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity``: Python's reader takes them, ``JSON.parse`` does not."""


def _not_json(name: str) -> Any:
    raise _NotJson(name)


_reading = threading.local()  # the repeated keys of the read under way in this thread


def _pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(items)
    if len(obj) != len(items):
        counts = Counter(key for key, _ in items)
        _reading.repeated.append((obj, [(key, n) for key, n in counts.items() if n > 1]))
    return obj


# One decoder for every read (a decoder made per read is a reference cycle: garbage until the
# collector runs). It reads as pi-materia's JSON.parse reads: no NaN/Infinity, numbers as
# JavaScript holds them (``maxSocketVisits: 5.0`` is the integer 5 there, and here), the last value
# of a repeated key.
_DECODER = json.JSONDecoder(parse_constant=_not_json, parse_float=js_float, parse_int=js_int,
                            object_pairs_hook=_pairs)


def _trailing_comma(text: str, pos: int) -> str:
    """The hint for a parse error at a closing bracket right after a comma (JSONC's and
    JavaScript's habit, which ``JSON.parse`` refuses as Python's parser does): where the comma is.
    Empty when the error is something else."""
    if not text.startswith(("}", "]"), pos):
        return ""
    before = text[:pos].rstrip(" \t\r\n")
    if not before.endswith(","):
        return ""
    at = len(before) - 1
    line = text.count("\n", 0, at) + 1
    column = at - (text.rfind("\n", 0, at) + 1) + 1
    return f"; JSON has no trailing commas (remove the comma at line {line} column {column})"


def _decode(text: str) -> tuple[Any, list[tuple[str, str, int]]]:
    """``text`` decoded by :data:`_DECODER`, with every key repeated within one object as
    ``(pointer of the member, key, times written)``, in document order."""
    repeated: list[tuple[dict[str, Any], list[tuple[str, int]]]] = []
    _reading.repeated = repeated
    try:
        data = _DECODER.decode(text)
    finally:
        _reading.repeated = None
    if not repeated:
        return data, []
    found = {id(obj): keys for obj, keys in repeated}
    out: list[tuple[str, str, int]] = []
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    while stack:  # iterative: a config nested as deeply as the decoder allows is walked too
        value, where = stack.pop()
        if isinstance(value, dict):
            out += [(pointer(*where, key), key, n) for key, n in found.get(id(value), ())]
            stack += [(item, (*where, key)) for key, item in reversed(value.items())]
        elif isinstance(value, list):
            stack += [(item, (*where, i)) for i, item in reversed(list(enumerate(value)))]
    return data, out


def read_layer(path: Path, *, owned: bool = False) -> tuple[dict[str, Any] | None, list[ConfigIssue]]:
    """Read one layer file. Returns ``(dict, [warning, ...])`` (``duplicate-key`` warnings only;
    usually none) or ``(None, [issue])``. ``owned``: a file of another user, or one every user may
    write, is not read (``unsafe-permissions``; for the user layer, found through the environment).
    A file castor had no descriptor to open is no bad file: ``storage_unavailable`` (``data.errno``)."""
    source = str(path)
    raw_bytes = b""
    try:
        raw_bytes = read_regular_file(path, MAX_CONFIG_BYTES, owned=owned)
        text = raw_bytes.decode("utf-8")
    except UnsafeFile as exc:
        return None, [ConfigIssue(code="unsafe-permissions", source=source,
                                  message=f"config file {source} is not read: {exc}")]
    except FileNotFoundError:
        return None, [ConfigIssue(code="file-not-found", message=f"config file not found: {source}{_dangling(path)}",
                                  source=source)]
    except UnicodeDecodeError as exc:
        utf16 = " (it is UTF-16 text: it starts with a UTF-16 byte order mark)" \
            if raw_bytes.startswith((b"\xff\xfe", b"\xfe\xff")) else ""
        return None, [ConfigIssue(code="read-error", source=source, message=f"cannot read config file {source}: "
                                  f"not UTF-8 text (byte {exc.start}){utf16}; save it as UTF-8")]
    except OSError as exc:
        if exc.errno in NO_DESCRIPTOR_ERRNOS:  # the process's shortage: the file may be fine
            raise storage_unavailable(exc, path=path, action="read the config") from None
        return None, [ConfigIssue(code="read-error", source=source,
                                  message=f"cannot read config file {source}: {exc.strerror or exc}")]
    except ValueError as exc:
        return None, [ConfigIssue(code="read-error", message=f"cannot read config file {source}: {exc}", source=source)]
    try:
        raw, repeated = _decode(text)
        data = well_formed(raw)
    except _NotJson as exc:
        return None, [ConfigIssue(code="invalid-json", source=source,
                                  message=f"malformed JSON in {source}: {exc} (JSON has no such value)")]
    except json.JSONDecodeError as exc:
        if text.startswith("\ufeff"):
            return None, [ConfigIssue(code="invalid-json", source=source,
                                      message=f"malformed JSON in {source}: the file starts with a byte order mark "
                                              "(U+FEFF), which JSON does not allow; save it as UTF-8 without a BOM")]
        # a comment is the common mistake (JSONC habits): JSON.parse refuses it too; say so
        comment = "; JSON has no comments (remove it)" if text.startswith(("//", "/*"), exc.pos) else ""
        comment = comment or _trailing_comma(text, exc.pos)
        if not comment and exc.msg == "Extra data":  # the object ended: what follows is no part of it
            comment = ("; the config's JSON object ends before it (a file holds one object: remove what follows, "
                       "or merge it into the object)")
        return None, [
            ConfigIssue(
                code="invalid-json",
                source=source,
                message=f"malformed JSON in {source} at line {exc.lineno} column {exc.colno}: {exc.msg}{comment}",
            )
        ]
    except RecursionError:
        return None, [ConfigIssue(code="invalid-json", source=source, message=f"JSON in {source} is nested too deeply")]
    except ValueError as exc:  # Python's own limit, e.g. an integer of more than 4300 digits: never a raw message
        return None, [ConfigIssue(code="invalid-json", source=source,
                                  message=f"malformed JSON in {source}: {json_problem(exc)}")]
    if nested_deeper_than(data, MAX_CONFIG_DEPTH):
        too_deep = f"JSON in {source} is nested too deeply (more than {MAX_CONFIG_DEPTH} levels)"
        return None, [ConfigIssue(code="invalid-json", source=source, message=too_deep)]
    if not isinstance(data, dict):
        return None, [
            ConfigIssue(
                code="not-an-object",
                source=source,
                message=f"config file {source} must contain a JSON object, not {json_kind(data)}",
            )
        ]
    return data, [warning("duplicate-key", well_formed(where), source=source,
                          message=f"key \"{well_formed(key)}\" is written {n} times in one object of {source}; "
                                  "the last value is used (as pi-materia's JSON.parse uses it) and the earlier "
                                  "ones are ignored")
                  for where, key, n in repeated]


def _link_target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "a path that cannot be read"


def _dangling(path: Path) -> str:
    """`` (a link to TARGET, which does not exist)`` when ``path`` is a symbolic link that leads
    nowhere ("not found" of a name that is there in ``ls`` puzzles), else empty."""
    return f" (a link to {_link_target(path)}, which does not exist)" if path.is_symlink() else ""


def gather_layers(
    cwd: str | os.PathLike[str],
    *,
    config_path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> tuple[list[tuple[str, dict[str, Any]]], list[LayerInfo], list[ConfigIssue]]:
    """The layers that exist, lowest first, with their LayerInfo and any read issues."""
    cwd = Path(cwd)
    layers: list[tuple[str, dict[str, Any]]] = [(DEFAULT_LABEL, default_config())]
    infos = [LayerInfo(scope="default", path=DEFAULT_LABEL, loaded=True)]
    issues: list[ConfigIssue] = []
    candidates: list[tuple[Literal["default", "user", "project", "explicit"], Path, bool]] = [
        ("user", profile_dir(env, home) / PROFILE_FILE, False),
        ("project", cwd / PROJECT_CONFIG, False),
    ]
    explicit = explicit_path(cwd, config_path, env)
    if explicit is not None:
        candidates.append(("explicit", explicit, True))
    for scope, path, required in candidates:
        if not required and not path.exists():
            if path.is_symlink():  # a layer linked to nothing: skipped, as pi-materia skips it, but said
                issues.append(warning("dangling-config-link", "", source=str(path),
                                      message=f"the {scope} config {path} is a link to {_link_target(path)}, which "
                                              "does not exist: the layer is skipped and the cast runs without it"))
            infos.append(LayerInfo(scope=scope, path=str(path), loaded=False))
            continue
        if scope == "project" and not _inside_project(path, cwd):
            # A project's layer linked to a file elsewhere: the project would choose what castor
            # reads (and, through loadout.set, copies into the project). Not read.
            issues.append(_escapes_project(path))
            infos.append(LayerInfo(scope=scope, path=str(path), loaded=False))
            continue
        data, read_issues = read_layer(path, owned=scope == "user")
        issues.extend(read_issues)
        infos.append(LayerInfo(scope=scope, path=str(path), loaded=data is not None,
                               foreign=foreign_owner(path) if scope == "project" and data is not None else None))
        if data is not None:
            layers.append((str(path), data))
    return layers, infos, issues


def _inside_project(path: Path, cwd: Path) -> bool:
    return inside(os.path.realpath(cwd), os.path.realpath(path))


def _escapes_project(path: Path, located: Path | None = None) -> ConfigIssue:
    """``path`` (as the user named it) leads out of the project; ``located`` is where it is (a
    relative ``path`` is the project's, not this process's working directory's)."""
    return ConfigIssue(code="path-escapes-project", source=str(path),
                       message=f"{path} leads outside the project ({os.path.realpath(located or path)}); "
                               "castor does not read a project's config through such a link")


def load(
    cwd: str | os.PathLike[str],
    *,
    config_path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> LoadedConfig:
    """Read, merge and validate all layers. Raises ConfigError with every issue."""
    layers, infos, issues = gather_layers(cwd, config_path=config_path, env=env, home=home)
    loaded = load_config(layers, layer_info=[i for i in infos if i.loaded])
    all_issues = [i for i in issues if not i.is_warning] + loaded.issues
    if all_issues:
        raise ConfigError(all_issues)
    loaded.layer_warnings = [i for i in issues if i.is_warning]
    return loaded


def load_resolved(
    cwd: str | os.PathLike[str],
    *,
    loadout: str | None = None,
    config_path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> ResolvedConfig:
    """The resolved loadout (default: ``activeLoadout``) a cast or ``castor grid`` runs on."""
    return resolve_config(load(cwd, config_path=config_path, env=env, home=home), loadout)


@functools.lru_cache(maxsize=256)
def _layer_paths(cwd: str, config_path: str | None, profile_env: str | None, config_env: str | None,
                 home_env: str | None, home: str | None) -> tuple[str | None, str, str | None]:
    """The user, project and explicit layer files (as :func:`gather_layers` finds them), by the
    environment values that choose them (so a changed variable is a different key)."""
    env = {name: value for name, value in (("PI_MATERIA_PROFILE_DIR", profile_env), ("MATERIA_CONFIG", config_env))
           if value is not None}
    explicit = explicit_path(Path(cwd), config_path, env)
    return (str(profile_dir(env, None if home is None else Path(home)) / PROFILE_FILE), str(Path(cwd) / PROJECT_CONFIG),
            None if explicit is None else str(explicit))


class ResolvedConfigCache:
    """:func:`load_resolved`, skipping the reading, merging and validation when no layer changed.

    An entry is reused only while every candidate layer file (user profile, project, explicit)
    is in the same state — missing, or the same inode, mtime, ctime and size — and the
    environment names the same files; so editing, replacing, creating or deleting a layer file
    is seen by the next call. The same :class:`ResolvedConfig` object is handed out again:
    callers treat it as immutable (the cast engine already does). Failures are never cached.
    Thread-safe (a lock around the small dict); bounded to ``size`` entries.
    """

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self._entries: dict[tuple[Any, ...], tuple[tuple[Any, ...], ResolvedConfig]] = {}
        self._lock = threading.Lock()

    def load_resolved(
        self,
        cwd: str | os.PathLike[str],
        *,
        loadout: str | None = None,
        config_path: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        home: Path | None = None,
    ) -> ResolvedConfig:
        key = (str(cwd), loadout, None if config_path is None else str(config_path))
        environ = os.environ if env is None else env
        paths = _layer_paths(key[0], key[2], environ.get("PI_MATERIA_PROFILE_DIR"), environ.get("MATERIA_CONFIG"),
                             os.environ.get("HOME"), None if home is None else str(home))  # Path.home() reads it
        signature = tuple((p, file_signature(p)) if p is not None else None for p in paths)
        with self._lock:
            hit = self._entries.get(key)
        if hit is not None and hit[0] == signature:
            return hit[1]
        resolved = load_resolved(cwd, loadout=loadout, config_path=config_path, env=env, home=home)
        with self._lock:
            if len(self._entries) >= self.size:
                self._entries.clear()
            self._entries[key] = (signature, resolved)
        return resolved


def validate_file(path: str | os.PathLike[str], *,
                  project: str | os.PathLike[str] | None = None,
                  config_path: str | os.PathLike[str] | None = None,
                  env: Mapping[str, str] | None = None,
                  home: Path | None = None) -> list[ConfigIssue]:
    """Issues of the config a cast in ``project`` would run with ``path`` (``castor validate``).

    With ``project`` (the directory a cast would run in) the layers are the ones that cast reads:
    the bundled default, the profile's ``materia.json`` (``env``/``home`` choose it, as for
    :func:`load`), the project's ``.pi/pi-materia.json`` and ``$MATERIA_CONFIG``, with ``path``
    in its own place when it is one of those the cast reads anyway (the profile's or the project's
    file), else as the explicit layer above the project's (``--config path``, which beats
    ``$MATERIA_CONFIG``); a relative ``path`` is read from ``project``, as ``--config`` is.
    ``config_path``: the explicit layer the cast would have besides (a session's
    ``--materia-config``; beats ``$MATERIA_CONFIG``), above ``path`` in its own place.
    A problem of another layer names that layer's file. Without ``project``: ``path`` over the
    bundled default only.

    Also resolves the active loadout so resolve-time problems (unknown materia, obsolete
    socket ``multiTurn``...) are reported, and every other loadout for its warnings. With
    ``project``, what a cast there would refuse is an error too: an ``artifactDir`` leading out
    of the project (``artifact-dir-outside-project``, with the cast's own message), and the
    project's own ``.pi/pi-materia.json`` linked to a file outside it (``path-escapes-project``;
    that file is then not read). Warnings (``severity == "warning"``) come after the errors; no
    error = valid.
    """
    path = Path(path)
    if project is None:
        data, issues = read_layer(path)
        if data is None:
            return issues
        layers = [(DEFAULT_LABEL, default_config()), (str(path), data)]
    else:
        # the project's own layer, as a cast there finds it (lexically), and the profile's
        layer = Path(os.path.abspath(Path(project) / PROJECT_CONFIG))
        profile = Path(os.path.abspath(profile_dir(env, home) / PROFILE_FILE))
        asked = Path(os.path.abspath(Path(project) / path))  # a relative path: from the project, as --config
        own = asked == layer
        if own and not _inside_project(layer, Path(project)):  # linked out of the project
            return [_escapes_project(path, layer)]
        placed = own or asked == profile  # a layer a cast reads anyway: checked in its own place
        if placed and not os.path.exists(asked):  # a cast would skip it; asked about, it is missing (or leads nowhere)
            return [ConfigIssue(code="file-not-found", message=f"config file not found: {path}{_dangling(asked)}",
                                source=str(path))]
        layers, infos, issues = gather_layers(project, config_path=config_path if placed else path, env=env,
                                              home=home)
        # FILE named as asked (a relative path stays relative in every message), not by the label
        # gather_layers gives its layer
        found = str(Path(project) / PROJECT_CONFIG) if own else str(profile_dir(env, home) / PROFILE_FILE) \
            if placed else str(explicit_path(Path(project), path, {}))
        layers = [(str(path) if label == found else label, data) for label, data in layers]
        issues = [i.model_copy(update={"source": str(path), "message": i.message.replace(found, str(path))})
                  if i.source == found else i for i in issues]
        errors = [i for i in issues if not i.is_warning]
        if errors:
            return errors + [i for i in issues if i.is_warning]
    loaded = load_config(layers)
    loaded.layer_warnings = issues
    setter = next((label for label, data in reversed(layers) if "artifactDir" in data), str(path))
    outside = _artifact_dir_refusal(loaded.merged.get("artifactDir"), project, setter)
    if loaded.issues or outside:
        return loaded.issues + outside + issues + loaded.warnings
    try:
        active = resolve_config(loaded)
    except ConfigError as exc:
        return [i if i.source else i.model_copy(update={"source": str(path)}) for i in exc.issues]
    # Warnings of every loadout (a problem in one that is not active yet is still worth saying).
    warnings = list(active.warnings)
    for name in loaded.merged.get("loadouts") or {}:
        if name != active.pipeline.loadout_name:
            try:
                warnings.extend(resolve_config(loaded, name).warnings)
            except ConfigError:
                pass  # refused only when it becomes the active loadout, as in pi-materia
    seen: set[tuple[str, str]] = set()
    unique = []
    for w in warnings:
        if (w.code, w.path) not in seen:
            seen.add((w.code, w.path))
            unique.append(w)
    return [w if w.source else w.model_copy(update={"source": str(path)}) for w in unique]


def _artifact_dir_refusal(configured: Any, project: str | os.PathLike[str] | None, source: str) -> list[ConfigIssue]:
    """The cast's refusal of ``configured`` as a project's artifact directory, as an issue (none
    without a project, or for a value that is not a string: that one is ``invalid-field``)."""
    if project is None or not isinstance(configured, str):
        return []
    try:
        project_artifact_root(str(project), configured)
    except Forbidden as exc:
        return [ConfigIssue(code="artifact-dir-outside-project", path="/artifactDir", source=source,
                            message=exc.message)]
    return []


def save_active_loadout(
    cwd: str | os.PathLike[str],
    name: str,
    *,
    config_path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> Path:
    """Persist ``activeLoadout`` only, to the explicit config if one is configured, else
    ``<cwd>/.pi/pi-materia.json``. The name must exist in the merged config (ConfigError
    ``unknown-loadout`` otherwise, and nothing is written). Only the ``activeLoadout`` value's
    text changes: every other byte of the file (formatting, key order, literal unicode) stays
    (:mod:`castor.domain.materia.config_edit`; an absent key is appended as the last member).
    A missing file is created as ``{"activeLoadout": NAME}``. The write is atomic (temp file +
    fsync + rename)."""
    loaded = load(cwd, config_path=config_path, env=env, home=home)
    loadouts = loaded.merged.get("loadouts") or {}
    target = explicit_path(Path(cwd), config_path, env) or Path(cwd) / PROJECT_CONFIG
    if name not in loadouts:  # named by the file whose activeLoadout it would set
        raise ConfigError([ConfigIssue(code="unknown-loadout", path="/activeLoadout", source=str(target),
                                       message=f"Unknown Materia loadout \"{name}\". Available loadouts: "
                                               f"{', '.join(loadouts)}")])
    try:
        if not target.exists():
            _atomic_write_json(target, {"activeLoadout": name})
            return target
        data, issues = read_layer(target)
        if data is None:
            raise ConfigError(issues)
        text = read_regular_file(target, MAX_CONFIG_BYTES).decode("utf-8")
        try:
            edited = set_top_level_string(text, "activeLoadout", name)
        except EditRefused:
            # Not editable in place (it parsed, so this is a JSON oddity such as a NaN literal): the
            # whole object is written back, literal unicode kept.
            data["activeLoadout"] = name
            _atomic_write_json(target, data)
            return target
        atomic_write_bytes(target, edited.encode("utf-8"), keep_mode=True)
    except OSError as exc:
        if not is_storage_fault(exc):
            raise
        # Read-only, full, failing: the environment's -- named by the file, relative to the project.
        raise storage_unavailable(exc, path=target, base=Path(cwd).resolve(),
                                  action="save the active loadout") from None
    return target


def _atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` atomically and durably, keeping an existing file's mode (a new one
    gets 0644 less the umask, like any file the user creates)."""
    make_dirs(path.parent)
    atomic_write_bytes(path, (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8"), keep_mode=True)
