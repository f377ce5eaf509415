"""The capture gate's member-by-member pass (AEP-0003 §9.1-§9.5, AEP-0006):
:class:`_Gate` walks one payload against its table node
(:mod:`bridges.core.captable`) with every hint (``levels``, ``structural``,
``form_fields``), synthesizes the ``[metadata*]`` fields, derives digests and
redacted twins; :func:`gate_form_values` gates an AEP-0006 ``answer.values``;
:func:`declares` and the plain-member shortcut serve unregistered types. It is
the reference the compiled plans of :mod:`bridges.core.capture` are tested
equal to, and the path a hinted payload and a relay hop's down-level take.
Split from :mod:`bridges.core.capture` (issue 26), which re-exports the
public names. Pure: no I/O, no clocks.
"""
from __future__ import annotations

from typing import Any, Collection, Iterable, Mapping

from . import captable as _ct
from .aep import CAPTURE_RANK as _RANK
from .aep import capture_rank as rank
from .cappolicy import _DEFAULT_POLICY, CapturePolicy, _max, digest, redact_value

_SCALARS = frozenset({str, int, float, bool, type(None)})  # exact classes: kept as they are


def _copy(v: Any) -> Any:
    """A copy of a JSON value: objects and arrays (tuples too, as lists)
    rebuilt, leaves shared (scalars without a call)."""
    cls = v.__class__
    if cls in _SCALARS:
        return v
    if cls is dict:
        out = v.copy()
        for k, x in out.items():
            if x.__class__ not in _SCALARS:
                out[k] = _copy(x)  # an existing key: the order stays
        return out
    if cls is list:
        out_list = v.copy()
        for i, x in enumerate(out_list):
            if x.__class__ not in _SCALARS:
                out_list[i] = _copy(x)
        return out_list
    if isinstance(v, dict):
        return {k: _copy(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_copy(x) for x in v]
    return v


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def synthesize_prompt(agent: object, kind: object, subject: object) -> str:
    """The ``metadata`` form of ``attention.requested.prompt`` (AEP-0003
    §9.2): ``"{agent} requests {kind}: {subject}"``, built only from the
    envelope's ``agent`` and ``subject`` and the payload's ``kind``.
    Without a subject the ``: {subject}`` tail is left off."""
    a = agent if isinstance(agent, str) and agent else "agent"
    k = kind if isinstance(kind, str) and kind else "attention"
    if isinstance(subject, str) and subject:
        return f"{a} requests {k}: {subject}"
    return f"{a} requests {k}"


def _placeholder(item: Any, index: int) -> str:
    """A label's structural placeholder: the item's own ``id`` (metadata-
    gated, so structural by definition; downlevel DL3/DL4 and
    mappings/claude-code.json), else its 1-based index."""
    if isinstance(item, dict):
        ident = item.get("id")
        if isinstance(ident, str) and ident:
            return ident
    return str(index + 1)


def _field_kinds(fields: Any) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if isinstance(fields, (list, tuple)):
        for f in fields:
            if isinstance(f, dict) and isinstance(f.get("id"), str):
                out.setdefault(f["id"], f)
    return out


def _structural_value(spec: dict[str, Any] | None, v: Any) -> bool:
    """True when a ``values`` entry is structural (``[metadata]``) per its
    ``field_spec`` (AEP-0006): a number for ``number``, a boolean for
    ``boolean``, a ``choices[].id`` (or an array of them) for ``select``.
    Without a spec (a hop, or an emitter that lost the request) only
    numbers and booleans count: a string may be free text."""
    if spec is None:
        return isinstance(v, bool) or _is_number(v)
    t = spec.get("type")
    if t == "number":
        return _is_number(v)
    if t == "boolean":
        return isinstance(v, bool)
    if t == "select":
        choices = spec.get("choices")
        ids = {c["id"] for c in choices if isinstance(c, dict) and isinstance(c.get("id"), str)} \
            if isinstance(choices, list) else set()
        if isinstance(v, str):
            return v in ids
        if isinstance(v, list) and v:
            return all(isinstance(x, str) and x in ids for x in v)
        return False
    return False  # "string" and anything unknown: free text


_DROP = object()  # a member the gate leaves out

_MADE: dict[int, tuple[tuple[str, _ct.Node], ...]] = {}  # id(node) -> its made members


def _made_members(node: _ct.Node) -> tuple[tuple[str, _ct.Node], ...]:
    """The members of ``node`` the gate may make (``[metadata*]`` stars,
    ``*_digest`` / twin derivations), worked out once per table node (the
    table's nodes live as long as the module): the gate's per-type plan,
    so an event walks only the members that can be made, not every
    annotated one."""
    made = _MADE.get(id(node))
    if made is None:
        made = _MADE[id(node)] = tuple(
            (k, c) for k, c in (node.props or {}).items()
            if c.star in ("prompt", "label") or c.digest_of or c.twin_of)
    return made


class _Gate:
    """One gating pass; accumulates the level honored."""

    def __init__(self, ceiling: str, policy: CapturePolicy, *, agent: Any, subject: Any,
                 form_fields: Any, levels: Mapping[str, str] | None,
                 structural: Collection[str], derive: bool) -> None:
        self.ceiling = ceiling
        self.policy = policy
        self.agent = agent
        self.subject = subject
        self.specs = _field_kinds(form_fields) if form_fields is not None else None
        self.levels = levels or {}
        self.structural = structural
        self.derive = derive
        self.honored = "metadata"
        # member paths matter only to ``levels`` and ``structural``: without
        # either (the common case) none is built
        self.paths = bool(self.levels) or bool(structural)

    def allowed(self, level: str) -> bool:
        return _RANK[level] <= _RANK[self.ceiling]

    def content(self, v: Any) -> Any:
        """A kept redacted/full-level value: the pipeline at ``redacted``,
        verbatim at ``full``."""
        if self.ceiling == "redacted":
            self.honored = _max(self.honored, "redacted")
            return redact_value(v, self.policy)
        self.honored = _max(self.honored, "full")
        return _copy(v)

    def text(self, v: Any) -> Any:
        """A kept ``[metadata*]`` content string at ``redacted``+."""
        return self.content(v)

    def declared(self, path: str) -> str | None:
        lvl = self.levels.get(path)
        return lvl if lvl in _RANK and lvl != "none" else None

    def obj(self, node: _ct.Node | None, value: dict[str, Any], path: str,
            index: int = 0) -> dict[str, Any]:
        """``value`` (an object at ``path``, described by ``node`` or
        unregistered) gated member by member, then the members ``node``
        makes up (``[metadata*]`` synthesis, derived digests and twins)."""
        props = node.props if node is not None and node.props is not None else {}
        out: dict[str, Any] = {}
        paths = self.paths
        for key, v in value.items():
            child = props.get(key) if isinstance(key, str) else None
            kept = self._member(child, v, (f"{path}.{key}" if path else str(key)) if paths else "")
            if kept is not _DROP:
                out[key] = kept
        if node is not None:
            for key, child in _made_members(node):
                made = self._made(child, key, value, path, index)
                if made is not _DROP:
                    out[key] = made
        return out

    def _member(self, child: _ct.Node | None, v: Any, cpath: str) -> Any:
        """One present member, kept (possibly transformed) or :data:`_DROP`."""
        star = child.star if child is not None else None
        if star in ("prompt", "label"):
            return _DROP  # made by _made: needs the whole object
        if star == "values":
            kept = self.values(v)
            return _DROP if kept is None else kept
        level = child.level if child is not None else "metadata"
        if self.levels:
            decl = self.declared(cpath)
            if decl is not None:
                level = _max(level, decl)
        if not self.allowed(level):
            return _DROP
        if level != "metadata":
            return self.content(v)
        return self._structural(child, v, cpath)

    def _structural(self, child: _ct.Node | None, v: Any, cpath: str) -> Any:
        """A kept ``metadata`` member: nested objects and arrays gated in
        turn (a shape other than the one the table expects is dropped)."""
        if child is not None and child.props is not None:
            return self.obj(child, v, cpath) if isinstance(v, dict) else _DROP
        if child is not None and child.items is not None:
            return self.arr(child.items, v, cpath + "[]") if isinstance(v, list) else _DROP
        if self.levels and isinstance(v, dict) and any(k.startswith(cpath + ".")
                                                       for k in self.levels):
            return self.obj(None, v, cpath)
        return _copy(v)

    def _made(self, child: _ct.Node, key: str, value: dict[str, Any], path: str,
              index: int) -> Any:
        """A member the table makes: ``[metadata*]`` prompt/label synthesis,
        a ``*_digest`` or redacted twin derived from its source member; else
        :data:`_DROP`."""
        kpath = f"{path}.{key}" if path else key
        if child.star == "prompt":
            return self.prompt(value.get(key), value.get("kind"), kpath)
        if child.star == "label":
            return self.label(value, value.get(key), index, kpath)
        if not self.derive or key in value:
            return _DROP
        if child.digest_of and child.digest_of in value and self.allowed(child.level):
            return digest(value[child.digest_of])
        if child.twin_of and child.twin_of in value and self.ceiling == "redacted":
            return self.content(value[child.twin_of])
        return _DROP

    def arr(self, item: _ct.Node, values: list[Any], path: str) -> list[Any]:
        out: list[Any] = []
        for v in values:
            if item.props is not None:
                if isinstance(v, dict):  # an object item expected: other shapes dropped
                    # numbered by its place in the output, so a placeholder label
                    # names the item a consumer sees (and re-gating is idempotent)
                    out.append(self.obj(item, v, path, len(out)))
            elif item.level != "metadata":
                if self.allowed(item.level):
                    out.append(self.content(v))
            else:
                out.append(_copy(v))
        return out

    def prompt(self, v: Any, kind: Any, path: str) -> str:
        if isinstance(v, str) and path in self.structural:
            return v
        if self.ceiling == "metadata" or not isinstance(v, str):
            return synthesize_prompt(self.agent, kind, self.subject)
        return self.text(v)

    def label(self, item: dict[str, Any], v: Any, index: int, path: str) -> str:
        if isinstance(v, str) and path in self.structural:
            return v
        if self.ceiling == "metadata" or not isinstance(v, str):
            return _placeholder(item, index)
        return self.text(v)

    def values(self, v: Any) -> dict[str, Any] | None:
        if not isinstance(v, dict):
            return None
        out, lvl = _gate_values(self.specs, v, self.ceiling, self.policy)
        self.honored = _max(self.honored, lvl)
        return out


def _gate_values(specs: dict[str, dict[str, Any]] | None, values: dict[str, Any], ceiling: str,
                 policy: CapturePolicy) -> tuple[dict[str, Any], str]:
    honored = "metadata"
    out: dict[str, Any] = {}
    for k, v in values.items():
        if specs is not None and k not in specs:
            continue  # not in the request's contract: dropped (capture-gating case 6)
        spec = specs.get(k) if specs is not None else None
        if _structural_value(spec, v):
            out[k] = _copy(v)
        elif ceiling == "redacted":
            out[k] = redact_value(v, policy)
            honored = _max(honored, "redacted")
        elif ceiling == "full":
            out[k] = _copy(v)
            honored = "full"
        # metadata / none: free text is dropped
    return out, honored


def gate_form_values(fields: Any, values: Any, ceiling: str,
                     policy: CapturePolicy | None = None) -> dict[str, Any]:
    """AEP-0006 type-dependent gating of ``answer.values`` (fixture
    ``capture-gating/cases.json``): ``fields`` is the request's
    ``field_spec`` list. Keys without a matching spec are dropped;
    number/boolean/closed-select values are structural and always kept;
    string-typed and ``other`` free-text values are dropped below
    ``redacted``, pass the §9.4 pipeline at ``redacted`` and stay verbatim
    at ``full``. At ``none`` this function still keeps structural values:
    the envelope-level drop of ``data`` is the caller's job. Returns a new
    dict (``{}`` for a non-object ``values``)."""
    rank(ceiling)
    if not isinstance(values, dict):
        return {}
    out, _ = _gate_values(_field_kinds(fields), values, ceiling, policy or _DEFAULT_POLICY)
    return out


_LEVEL_KEYS: dict[int, tuple[Mapping[str, str], frozenset[str]]] = {}


def _level_keys(levels: Mapping[str, str]) -> frozenset[str]:
    """Every key of ``levels`` and every dotted prefix of one (``error``
    for ``error.message``), worked out once per ``levels`` mapping (the
    gate's plan for a vendor type: the mappers pass the same module-level
    mapping for every event of a type)."""
    hit = _LEVEL_KEYS.get(id(levels))
    if hit is not None and hit[0] is levels:
        return hit[1]
    keys = set()
    for k in levels:
        keys.add(k)
        keys.update(k[:i] for i, ch in enumerate(k) if ch == ".")
    if len(_LEVEL_KEYS) >= 512:  # a caller building a fresh mapping per event
        _LEVEL_KEYS.clear()
    _LEVEL_KEYS[id(levels)] = (levels, frozenset(keys))
    return frozenset(keys)


def declares(levels: Mapping[str, str], keys: Iterable[str]) -> bool:
    """Whether ``levels`` (a gate's ``levels`` hint) declares any of
    ``keys``, itself or as a dotted prefix of one of its keys: a payload
    naming such a key is not plain (what the ``plain`` hint of
    :class:`bridges.core.bridge.Gating` may claim)."""
    return not _level_keys(levels).isdisjoint(keys)


def _plain_members(data: dict[str, Any], levels: Mapping[str, str]) -> dict[str, Any] | None:
    """The gate of an unregistered type whose payload names no key of
    ``levels`` (nor a prefix of one): every member is ``metadata`` and kept,
    copied, so the result is :func:`gate`'s without a gating pass. ``None``
    when some member is declared (or may hold declared members): the full
    pass decides then."""
    return _plain(data, _level_keys(levels) if levels else frozenset())


def _plain(data: dict[str, Any], declared: frozenset[str]) -> dict[str, Any] | None:
    """:func:`_plain_members` with ``levels``' keys and prefixes worked out
    (``declared``, :func:`_level_keys`)."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        if k.__class__ is not str or k in declared:
            return None
        out[k] = v if v.__class__ in _SCALARS else _copy(v)
    return out
