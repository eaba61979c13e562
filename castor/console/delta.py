"""The main page's stream as changes: what one push changed since an earlier one, keyed by id.

A push of the whole tree is about 2.5 MB at 1,000 casts, and nearly every byte of it changes
every second only because it holds times relative to when it was taken (an actor's uptime, how
long its activity has run, its oldest message's age, a deadline's time left). So a document is
*anchored* first (:func:`anchor`): each such figure becomes the clock time it stands for (when
the age began, when the deadline passes), which stays still while nothing happens, and is kept
as the previous push had it while it moved less than :data:`ANCHOR_SLACK_S` (a snapshot's own
clock readings jitter). The page turns them back into ages against the push's ``at``
(``at - since``, ``until - at``), so it shows what the whole document said, each figure within
:data:`ANCHOR_SLACK_S`.

Two anchored documents differ by a *patch* (:func:`patch`): for a mapping, the keys set anew, the
keys patched in place and the keys gone; for a list of mappings that each carry one id (an
actor's ``path``, a session's ``session_id``, a cast's ``cast_id``), the items set anew, patched
or gone by id, and where new ones stand (after which id) -- or the whole order when kept items
moved; any other value that changed is sent whole. The page applies it to the document it holds
(the same function in JavaScript, :data:`APPLY_JS`); a push it cannot apply (it missed one)
makes it reconnect, and a new stream starts with the whole anchored document.

Both of the console's streams are :class:`Versions` of their document: the main page's (one
shared by every open page) and each cast page's (one a stream).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

#: Figures that are the seconds since something began, as of the document's ``at``.
AGES = frozenset({"uptime_s", "age_s", "oldest_age_s", "since_s", "waiting_s", "cast_age_s"})
#: Figures that are the seconds until something happens, as of the document's ``at``.
COUNTDOWNS = frozenset({"deadline_in_s", "retry_in_s"})
_TIMED = AGES | COUNTDOWNS
#: An anchored time that moved less than this since the previous push keeps its previous value
#: (the page's figures are shown to a tenth of a second).
ANCHOR_SLACK_S = 0.05
#: The keys that identify an item of a list, in the order they are tried (a cast's feed event by
#: ``event_id``, where its line starts in the cast's events file).
ID_KEYS = ("path", "session_id", "cast_id", "event_id")

JSON = Any
"""A JSON value: a mapping, a list, a string, a number, a boolean or None."""


def anchor(value: JSON, at: float, previous: JSON = None, moments: dict[int, float] | None = None) -> JSON:
    """``value`` with every figure of :data:`AGES` and :data:`COUNTDOWNS` as the clock time it
    stands for (``at - age``, ``at + left``, to the millisecond), the value ``previous`` (the same
    place in the previous anchored document) has there kept while it is within
    :data:`ANCHOR_SLACK_S`. A mapping ``moments`` has a time for (by its ``id()``) counts its
    figures, and its contents', from that moment instead of ``at``: an actor's figures are read at
    their own moment, up to a paced snapshot's length before the document's ``at``. Everything else
    is as it was (new containers, the same scalars)."""
    if isinstance(value, dict):
        before = previous if isinstance(previous, dict) else {}
        if moments and id(value) in moments:
            at = moments[id(value)]
        out = {}
        for key, item in value.items():
            if key in _TIMED:
                if isinstance(item, (int, float)) and not isinstance(item, bool):
                    moment = round(at - item if key in AGES else at + item, 3)
                    kept = before.get(key)
                    if isinstance(kept, float) and abs(kept - moment) < ANCHOR_SLACK_S:
                        moment = kept
                    out[key] = moment
                else:
                    out[key] = item
            elif isinstance(item, (dict, list)):
                out[key] = anchor(item, at, before.get(key), moments)
            else:  # a scalar, as it is (most of a document: inline, one call fewer each)
                out[key] = item
        return out
    if isinstance(value, list):
        key = _id_key(value)
        if key is not None and isinstance(previous, list) and _id_key(previous) == key:
            earlier = {item[key]: item for item in previous}
            return [anchor(item, at, earlier.get(item[key]), moments) for item in value]
        same = isinstance(previous, list) and len(previous) == len(value)
        return [anchor(item, at, previous[n] if same else None, moments) for n, item in enumerate(value)]
    return value


def _id_key(items: list[JSON]) -> str | None:
    """The key every item of ``items`` is a mapping with, with a string value, no two the same:
    the list is then patched by id. None for an empty list or any other."""
    if not items or not all(isinstance(item, dict) for item in items):
        return None
    for key in ID_KEYS:
        ids = [item.get(key) for item in items]
        if all(isinstance(i, str) for i in ids) and len(set(ids)) == len(ids):
            return key
    return None


def patch(old: JSON, new: JSON) -> dict[str, JSON] | None:
    """What turns ``old`` into ``new`` (both anchored), or None when they are equal:
    ``{"=": value}`` (sent whole), a mapping's ``{"set": {...}, "patch": {...}, "del": [...]}``, or
    a list's by id, ``{"id": KEY, "set": {...}, "patch": {...}, "del": [...], "add": [[ID, AFTER],
    ...]}`` or with ``"order": [ID, ...]`` instead of ``add`` when kept items moved."""
    if old == new:
        return None
    if isinstance(old, dict) and isinstance(new, dict):
        return _mapping_patch(old, new)
    if isinstance(old, list) and isinstance(new, list):
        key = _id_key(new)
        if key is not None and (not old or _id_key(old) == key):
            return _list_patch(key, old, new)
    return {"=": new}


def _mapping_patch(old: dict[str, JSON], new: dict[str, JSON]) -> dict[str, JSON]:
    out = _sets_and_patches(old, new.items())
    gone = [key for key in old if key not in new]
    if gone:
        out["del"] = gone
    return out


def _list_patch(key: str, old: list[JSON], new: list[JSON]) -> dict[str, JSON]:
    before = {item[key]: item for item in old}
    after_ids = [item[key] for item in new]
    present = set(after_ids)
    out: dict[str, JSON] = {"id": key, **_sets_and_patches(before, ((item[key], item) for item in new))}
    gone = [ident for ident in before if ident not in present]
    if gone:
        out["del"] = gone
    kept_then = [ident for ident in before if ident in present]
    kept_now = [ident for ident in after_ids if ident in before]
    if kept_then != kept_now:
        out["order"] = after_ids
    else:
        added = [[ident, after_ids[n - 1] if n else None] for n, ident in enumerate(after_ids) if ident not in before]
        if added:
            out["add"] = added
    return out


def _sets_and_patches(before: dict[str, JSON], now: Iterable[tuple[str, JSON]]) -> dict[str, JSON]:
    """The ``set`` (new, or changed so that it is sent whole) and ``patch`` (changed in place)
    parts of a patch from ``before`` (by key or id) to the ``(key, value)`` pairs of ``now``;
    each part left out when empty."""
    sets: dict[str, JSON] = {}
    patches: dict[str, JSON] = {}
    for ident, value in now:
        if ident not in before:
            sets[ident] = value
            continue
        change = patch(before[ident], value)
        if change is None:
            continue
        if "=" in change:
            sets[ident] = value
        else:
            patches[ident] = change
    out: dict[str, JSON] = {}
    if sets:
        out["set"] = sets
    if patches:
        out["patch"] = patches
    return out


def apply(old: JSON, change: dict[str, JSON] | None) -> JSON:
    """``old`` with ``change`` (a :func:`patch`) applied: the new value (what the page's
    :data:`APPLY_JS` does, in Python; ``old`` is left as it was)."""
    if change is None:
        return old
    if "=" in change:
        return change["="]
    if "id" in change:
        key = change["id"]
        items = {item[key]: item for item in old}
        for ident in change.get("del", []):
            items.pop(ident, None)
        for ident, item in change.get("set", {}).items():
            items[ident] = item
        for ident, sub in change.get("patch", {}).items():
            items[ident] = apply(items[ident], sub)
        if "order" in change:
            order = change["order"]
        else:
            following: dict[str | None, list[str]] = {}
            for ident, after in change.get("add", []):
                following.setdefault(after, []).append(ident)
            gone = set(change.get("del", []))
            order = []

            def place(ident: str) -> None:
                order.append(ident)
                for nxt in following.get(ident, []):
                    place(nxt)

            for nxt in following.get(None, []):
                place(nxt)
            for item in old:
                if item[key] not in gone:
                    place(item[key])
        return [items[ident] for ident in order]
    out = dict(old)
    for key in change.get("del", []):
        out.pop(key, None)
    out.update(change.get("set", {}))
    for key, sub in change.get("patch", {}).items():
        out[key] = apply(out[key], sub)
    return out


class Versions:
    """The newest ``kept`` versions of one document, anchored (:func:`anchor`), and the events of a
    stream: ``{"v": N, "full": DOC}`` the whole newest version, or ``{"v": N, "base": B, "patch":
    ...}`` what changed since version ``B`` -- while ``B`` is one of those kept, so a reader held
    back a version or two still gets a patch. Each event's text is made once per version and base,
    however many streams send it. Not thread-safe: its owner serialises the calls."""

    def __init__(self, kept: int) -> None:
        self.kept = kept
        self.newest = 0
        self._versions: dict[int, dict[str, JSON]] = {}
        self._texts: dict[int | None, str] = {}  # base version (None: whole) -> the newest version's event

    def add(self, doc: dict[str, JSON], moments: dict[int, float] | None = None) -> int:
        """Make ``doc`` (its figures as of its ``at``; ``moments`` as :func:`anchor` takes them) the
        newest version; its number."""
        anchored = anchor(doc, doc["at"], self._versions.get(self.newest), moments)
        self.newest += 1
        self._versions[self.newest] = anchored
        self._versions.pop(self.newest - self.kept, None)
        self._texts = {}
        return self.newest

    def event(self, since: int | None) -> tuple[int, str]:
        """The event that brings a stream that last sent version ``since`` (None: none yet) to the
        newest, as JSON text, and that version (there must be one: :meth:`add`)."""
        base = since if since in self._versions else None
        text = self._texts.get(base)
        if text is None:
            current = self._versions[self.newest]
            event = ({"v": self.newest, "full": current} if base is None else
                     {"v": self.newest, "base": base, "patch": patch(self._versions[base], current)})
            text = self._texts[base] = json.dumps(event)
        return self.newest, text


def unanchor(value: JSON, at: float) -> JSON:
    """An anchored document as figures relative to ``at`` again (what the page shows)."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if (key in AGES or key in COUNTDOWNS) and isinstance(item, (int, float)) and not isinstance(item, bool):
                out[key] = at - item if key in AGES else item - at
            else:
                out[key] = unanchor(item, at)
        return out
    if isinstance(value, list):
        return [unanchor(item, at) for item in value]
    return value


#: The page's side: ``applyPatch(old, change)`` (:func:`apply`) and ``unanchor(value, at)``
#: (:func:`unanchor`), given the anchored keys as ``AGES`` and ``COUNTDOWNS`` (sets).
APPLY_JS = r"""
// A key is always defined as the object's own (a key named __proto__ never sets its prototype).
const put = (obj, key, value) => Object.defineProperty(obj, key, {value, enumerable: true, writable: true,
                                                                  configurable: true});
function applyPatch(old, change) {
  if (!change) return old;
  if ('=' in change) return change['='];
  if ('id' in change) {
    const key = change.id, items = new Map(old.map(item => [item[key], item]));
    for (const id of change.del || []) items.delete(id);
    for (const [id, item] of Object.entries(change.set || {})) items.set(id, item);
    for (const [id, sub] of Object.entries(change.patch || {})) {
      if (!items.has(id)) throw new Error('patch of a missing item ' + id);
      items.set(id, applyPatch(items.get(id), sub));
    }
    let order;
    if (change.order) order = change.order;
    else {
      const following = new Map(), gone = new Set(change.del || []);
      for (const [id, after] of change.add || []) {
        if (!following.has(after)) following.set(after, []);
        following.get(after).push(id);
      }
      order = [];
      const place = id => { order.push(id); for (const next of following.get(id) || []) place(next); };
      for (const next of following.get(null) || []) place(next);
      for (const item of old) if (!gone.has(item[key])) place(item[key]);
    }
    return order.map(id => { if (!items.has(id)) throw new Error('no item ' + id); return items.get(id); });
  }
  const out = {...old};
  for (const key of change.del || []) delete out[key];
  for (const [key, value] of Object.entries(change.set || {})) put(out, key, value);
  for (const [key, sub] of Object.entries(change.patch || {})) put(out, key, applyPatch(out[key], sub));
  return out;
}
function unanchor(value, at) {
  if (Array.isArray(value)) return value.map(item => unanchor(item, at));
  if (value === null || typeof value !== 'object') return value;
  const out = {};
  for (const [key, item] of Object.entries(value))
    put(out, key, typeof item === 'number' && AGES.has(key) ? at - item
                : typeof item === 'number' && COUNTDOWNS.has(key) ? item - at : unanchor(item, at));
  return out;
}
"""
