"""Capture posture and the payload gate (AEP-0001 §8.2, AEP-0002 §5.1,
AEP-0003 §9, AEP-0006).

Four public operations:

- :func:`gate`: the emitter-side gate every payload passes in
  :meth:`bridges.core.envelope.Stamper.stamp`: prune to the ceiling by the
  field table (:mod:`bridges.core.captable`), synthesize the ``[metadata*]``
  fields, compute missing digests from the original content, run the §9.4
  pipeline over ``redacted``-gated text, and report the level honored.
- :func:`downlevel`: a relay hop's mechanical down-level of a whole envelope
  (AEP-0001 §8.2(b)(e); fixture ``downlevel/cases.json``).
- :func:`redact_text` / :func:`redact_value`: the §9.4 pipeline under a
  policy (:mod:`bridges.core.redaction`; fixture ``redaction/cases.json``).
- :func:`digest`: ``*_digest`` values (AEP-0003 §9.3).

Everything here is pure: no I/O at import or call time, no clocks.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Collection, Iterable, Mapping

from . import captable as _ct
from . import redaction as _red
from .aep import CAPTURE_LEVELS as LEVELS
from .aep import CAPTURE_RANK as _RANK
from .aep import capture_rank as rank
from .settings import FALSE, FLAG_EXPECTED, TRUE

#: Credentials of the daemon itself (shared/DESIGN.md operator interface):
#: their values are always treated as configured secrets (§9.4 b).
BUILTIN_SECRET_NAMES = (
    "AEP_TOKEN",
    "AEP_OPENHANDS_SESSION_API_KEY",
    "AEP_OPENCODE_PASSWORD",
    "AEP_KILOCODE_PASSWORD",
    "AEP_KIMI_WEB_TOKEN",
    "AEP_NATS_URL",  # may hold user:password@ (issue 14)
)

_FALSE = set(FALSE) - {""}
_TRUE = {*TRUE, ""}  # unset: redact PII (the default)


def _max(a: str, b: str) -> str:
    return a if _RANK[a] >= _RANK[b] else b


class CaptureConfigError(ValueError):
    """Bad capture configuration; ``problems`` holds one line per problem
    (the supervisor prints each and exits 2)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class CapturePolicy:
    """The operator's capture posture (AEP-0003 §9.1, §9.4).

    ``ceiling``: the global ceiling (``AEP_CAPTURE``, default ``metadata``).

    ``attention``: the ceiling for ``attention.*``. ``None`` (the default)
    means the RECOMMENDED per-category override of AEP-0003 §9.1: ``redacted``
    so prompts stay readable, or the global ceiling when that is higher
    (``full`` stays ``full``). An explicit level is used as given, above or
    below the global ceiling (``AEP_CAPTURE_ATTENTION``).

    ``overrides``: per-type or per-category ceilings (``{"tool.completed":
    "full", "progress": "redacted"}``); the longest matching dotted prefix
    wins over ``attention`` and ``ceiling``.

    The rule that binds them all: a global ``none`` is absolute. With
    ``ceiling="none"`` every type's ceiling is ``none`` whatever
    ``attention``/``overrides`` say (:meth:`from_env` refuses such a
    configuration outright rather than silently ignoring it).

    ``secret_values``: literal values redacted by §9.4 rule (b) (normalized:
    deduplicated, longest first, values under 4 characters dropped).
    ``home``: the prefix rule (c) replaces with ``~`` (ignored when empty,
    relative or ``/``). ``pii``: rule (d) (default on).

    Raises ``ValueError`` for an unknown level."""

    ceiling: str = "metadata"
    attention: str | None = None
    secret_values: tuple[str, ...] = ()
    home: str | None = None
    pii: bool = True
    overrides: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        rank(self.ceiling)
        if self.attention is not None:
            rank(self.attention)
        for v in dict(self.overrides).values():
            rank(v)
        object.__setattr__(self, "secret_values",
                           _red.normalize_secret_values(self.secret_values))
        object.__setattr__(self, "home", _red.usable_home(self.home))
        object.__setattr__(self, "overrides", dict(self.overrides))

    def ceiling_for(self, type_: str) -> str:
        """The ceiling that applies to events of ``type_`` (see the class
        docstring for the precedence)."""
        if self.ceiling == "none":
            return "none"
        if self.overrides:
            parts = type_.split(".")
            for n in range(len(parts), 0, -1):
                hit = self.overrides.get(".".join(parts[:n]))
                if hit is not None:
                    return hit
        if type_.startswith("attention."):
            if self.attention is not None:
                return self.attention
            return _max(self.ceiling, "redacted")
        return self.ceiling

    # ------------------------------------------------------------ configuration

    @classmethod
    def config_problems(cls, environ: Mapping[str, str]) -> list[str]:
        """One line per problem in the capture configuration of ``environ``
        (empty when it is usable). See :meth:`from_env`."""
        return cls._parse(environ)[1]

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> "CapturePolicy":
        """The posture from the environment (``os.environ`` or a dict):

        - ``AEP_CAPTURE``: ``none|metadata|redacted|full`` (default
          ``metadata``; case-insensitive).
        - ``AEP_CAPTURE_ATTENTION``: explicit ``attention.*`` ceiling (unset:
          ``redacted`` or the global ceiling when higher; see the class
          docstring). Refused when above a global ``none``.
        - ``AEP_REDACT_NAMES``: comma-separated environment variable names
          whose values are secrets (§9.4 b); the daemon's own credentials
          (:data:`BUILTIN_SECRET_NAMES`) are always included.
        - ``HOME``: the home prefix for rule (c).
        - ``AEP_REDACT_PII``: ``0``/``false``/``no``/``off`` disables rule
          (d); default on.

        Raises :class:`CaptureConfigError` (a ``ValueError``) listing every
        problem."""
        policy, problems = cls._parse(environ)
        if problems:
            raise CaptureConfigError(problems)
        assert policy is not None
        return policy

    @classmethod
    def _parse(cls, environ: Mapping[str, str]) -> tuple["CapturePolicy | None", list[str]]:
        problems: list[str] = []

        def level(name: str, default: str | None) -> str | None:
            raw = environ.get(name)
            if raw is None or raw.strip() == "":
                return default
            val = raw.strip().lower()
            if val not in _RANK:
                problems.append(f"{name}={raw!r} is not a capture level "
                                f"(expected one of {', '.join(LEVELS)})")
                return default
            return val

        ceiling = level("AEP_CAPTURE", "metadata") or "metadata"
        attention = level("AEP_CAPTURE_ATTENTION", None)
        if ceiling == "none" and attention not in (None, "none"):
            problems.append(f"AEP_CAPTURE_ATTENTION={attention} exceeds AEP_CAPTURE=none "
                            "(none is absolute: unset AEP_CAPTURE_ATTENTION or raise AEP_CAPTURE)")
        names = list(BUILTIN_SECRET_NAMES)
        for n in (environ.get("AEP_REDACT_NAMES") or "").split(","):
            n = n.strip()
            if n and n not in names:
                names.append(n)
        values = [environ[n] for n in names if environ.get(n)]
        pii_raw = (environ.get("AEP_REDACT_PII") or "").strip().lower()
        if pii_raw in _FALSE:
            pii = False
        elif pii_raw in _TRUE:
            pii = True
        else:
            problems.append(f"AEP_REDACT_PII={environ.get('AEP_REDACT_PII')!r} is not a boolean "
                            f"({FLAG_EXPECTED})")
            pii = True
        if problems:
            return None, problems
        return cls(ceiling=ceiling, attention=attention, secret_values=tuple(values),
                   home=environ.get("HOME"), pii=pii), []


_DEFAULT_POLICY = CapturePolicy()

# ------------------------------------------------------------------ redaction, digests


def redact_text(text: str, policy: CapturePolicy | None = None) -> str:
    """The AEP-0003 §9.4 pipeline over one string under ``policy`` (secrets,
    configured values, home paths, PII when enabled); see
    :mod:`bridges.core.redaction`. Idempotent; never raises for a ``str``;
    a non-``str`` is returned unchanged."""
    p = policy or _DEFAULT_POLICY
    return _red.redact_text(text, secret_values=p.secret_values, home=p.home, pii=p.pii)


def redact_value(value: Any, policy: CapturePolicy | None = None) -> Any:
    """The pipeline over a JSON value: strings redacted, containers walked,
    credential-named keys' values replaced (see
    :func:`bridges.core.redaction.redact_value`). Returns a new value."""
    p = policy or _DEFAULT_POLICY
    return _red.redact_value(value, secret_values=p.secret_values, home=p.home, pii=p.pii)


def canonical_json(value: Any) -> str:
    """The canonical JSON form digests are computed over
    (``shared/aep/README.md``): keys sorted, no spaces, ``ensure_ascii=False``;
    a string is its JSON string form (quoted)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)


def digest(value: Any) -> str:
    """``*_digest``: SHA-256 over :func:`canonical_json` of the ORIGINAL
    value (before any redaction), hex, first 16 bytes (32 hex characters);
    AEP-0003 §9.3. Never raises for JSON-shaped input (non-JSON leaves are
    stringified; lone surrogates are kept via ``surrogatepass``)."""
    raw = canonical_json(value)
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:32]


# ------------------------------------------------------------------ the gate


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


# ------------------------------------------------------------------ the compiled gate

# what a member of a registered node becomes at one ceiling (the branches of
# ``_Gate._member`` / ``_Gate._structural``, decided once per node and ceiling)
_SKIP, _KEEP, _CONTENT, _OBJ, _ARR, _VALUES = range(6)
# made members (``_Gate._made``): synthesized or derived after the first pass
_M_PROMPT, _M_LABEL, _M_DIGEST, _M_TWIN = range(4)


class _Compiled:
    """One registered table node gated at one ceiling without hints (no
    ``levels``, ``structural`` or ``form_fields``): what :class:`_Gate` does
    member by member, worked out once. ``acts``: member -> (action, the
    child's plan or item plan); ``made``: the members the node makes, as
    ``(key, kind, source member)``; an array item plan is ``(action, plan)``.
    Equal to the :class:`_Gate` pass by a property test
    (``tests/unit/core/test_capture_plan.py``)."""

    __slots__ = ("acts", "made", "ceiling")

    def __init__(self, node: _ct.Node, ceiling: str) -> None:
        self.ceiling = ceiling
        self.acts: dict[str, tuple[int, Any]] = {}
        allowed = _RANK[ceiling]
        for key, child in (node.props or {}).items():
            self.acts[key] = _action(child, ceiling, allowed)
        made: list[tuple[str, int, str | None]] = []
        for key, child in _made_members(node):
            if child.star == "prompt":
                made.append((key, _M_PROMPT, None))
            elif child.star == "label":
                made.append((key, _M_LABEL, None))
            elif child.digest_of and _RANK[child.level] <= allowed:
                made.append((key, _M_DIGEST, child.digest_of))
            elif child.twin_of and ceiling == "redacted":
                made.append((key, _M_TWIN, child.twin_of))
        self.made = tuple(made)


def _action(child: _ct.Node, ceiling: str, allowed: int) -> tuple[int, Any]:
    if child.star in ("prompt", "label"):
        return _SKIP, None
    if child.star == "values":
        return _VALUES, None
    if _RANK[child.level] > allowed:
        return _SKIP, None
    if child.level != "metadata":
        return _CONTENT, None
    if child.props is not None:
        return _OBJ, _compiled(child, ceiling)
    if child.items is not None:
        item = child.items
        if item.props is not None:
            return _ARR, (_OBJ, _compiled(item, ceiling))
        if item.level != "metadata":
            return _ARR, ((_CONTENT if _RANK[item.level] <= allowed else _SKIP), None)
        return _ARR, (_KEEP, None)
    return _KEEP, None


_COMPILED: dict[tuple[int, str], _Compiled] = {}  # (id(node), ceiling); nodes live forever


def _compiled(node: _ct.Node, ceiling: str) -> _Compiled:
    key = (id(node), ceiling)
    plan = _COMPILED.get(key)
    if plan is None:
        plan = _COMPILED[key] = _Compiled(node, ceiling)
    return plan


class _Run:
    """One compiled gating pass (:meth:`GatePlan.gate` without hints): the
    payload walked by the plans, the level honored accumulated."""

    __slots__ = ("ceiling", "policy", "agent", "subject", "honored")

    def __init__(self, ceiling: str, policy: CapturePolicy, agent: Any, subject: Any) -> None:
        self.ceiling = ceiling
        self.policy = policy
        self.agent = agent
        self.subject = subject
        self.honored = "metadata"

    def content(self, v: Any) -> Any:
        if self.ceiling == "redacted":
            if self.honored == "metadata":
                self.honored = "redacted"
            return redact_value(v, self.policy)
        self.honored = "full"  # only a full ceiling keeps content verbatim
        return v if v.__class__ in _SCALARS else _copy(v)

    def obj(self, plan: _Compiled, value: dict[str, Any], index: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        acts = plan.acts
        for key, v in value.items():
            act = acts.get(key)
            if act is None:  # unannotated: metadata (AEP-0002 §5.1 rule 4)
                out[key] = v if v.__class__ in _SCALARS else _copy(v)
                continue
            kind, sub = act
            if kind == _KEEP:
                out[key] = v if v.__class__ in _SCALARS else _copy(v)
            elif kind == _OBJ:
                if isinstance(v, dict):
                    out[key] = self.obj(sub, v, 0)
            elif kind == _CONTENT:
                out[key] = self.content(v)
            elif kind == _ARR:
                if isinstance(v, list):
                    out[key] = self.arr(sub, v)
            elif kind == _VALUES:
                if isinstance(v, dict):
                    kept, lvl = _gate_values(None, v, self.ceiling, self.policy)
                    self.honored = _max(self.honored, lvl)
                    out[key] = kept
        if plan.made:
            self.make(plan, value, index, out)
        return out

    def make(self, plan: _Compiled, value: dict[str, Any], index: int,
             out: dict[str, Any]) -> None:
        """The members ``plan``'s node makes (``_Gate._made``), into ``out``."""
        for key, kind, src in plan.made:
            if kind == _M_PROMPT:
                v = value.get(key)
                if self.ceiling == "metadata" or not isinstance(v, str):
                    out[key] = synthesize_prompt(self.agent, value.get("kind"), self.subject)
                else:
                    out[key] = self.content(v)
            elif kind == _M_LABEL:
                v = value.get(key)
                if self.ceiling == "metadata" or not isinstance(v, str):
                    out[key] = _placeholder(value, index)
                else:
                    out[key] = self.content(v)
            elif key not in value and src in value:
                out[key] = digest(value[src]) if kind == _M_DIGEST else self.content(value[src])

    def arr(self, item: tuple[int, Any], values: list[Any]) -> list[Any]:
        kind, sub = item
        out: list[Any] = []
        if kind == _OBJ:
            for v in values:
                if isinstance(v, dict):  # numbered by its place in the output (see _Gate.arr)
                    out.append(self.obj(sub, v, len(out)))
        elif kind == _CONTENT:
            for v in values:
                out.append(self.content(v))
        elif kind == _KEEP:
            for v in values:
                out.append(v if v.__class__ in _SCALARS else _copy(v))
        return out


class GatePlan:
    """:func:`gate` for one type at one ceiling, with what can be decided
    without the payload decided once (the stamper keeps one per type):
    ``gate(data, policy, ...)`` returns exactly what ``gate(type_, data,
    ceiling, policy, ...)`` returns. A registered type's payload without
    hints goes through the node's compiled plan (:class:`_Compiled`); an
    unregistered type's through the plain-member shortcut; anything else
    through the full :class:`_Gate` pass. Raises ``ValueError`` for an
    unknown ``ceiling``."""

    __slots__ = ("type", "ceiling", "node", "compiled", "takes_plain", "_declared")

    def __init__(self, type_: str, ceiling: str) -> None:
        rank(ceiling)
        self.type = type_
        self.ceiling = ceiling
        self.node = _ct.node_for(type_)
        self.compiled = _compiled(self.node, ceiling) \
            if self.node is not None and ceiling != "none" else None
        #: an unregistered type below a ``none`` ceiling: a payload the emitter
        #: claims plain (:class:`bridges.core.bridge.Gating` ``plain``) is kept as it is
        self.takes_plain = self.node is None and ceiling != "none"
        # the last ``levels`` mapping gate_levels saw, with its declared keys
        # (a vendor type's hint is one module-level mapping: one lookup per type)
        self._declared: tuple[Mapping[str, str], frozenset[str]] | None = None

    def gate(self, data: Any, policy: CapturePolicy, *, agent: str | None = None,
             subject: str | None = None, form_fields: Any = None,
             levels: Mapping[str, str] | None = None,
             structural: Collection[str] = ()) -> tuple[dict[str, Any] | None, str]:
        """See :func:`gate` (the same arguments but the type and ceiling)."""
        ceiling = self.ceiling
        if ceiling == "none":
            return None, "none"
        if not isinstance(data, dict) or not data:
            return None, "metadata"
        node = self.node
        if node is None:
            if levels is None:
                return _copy(data), ceiling
            if form_fields is None and not structural:
                plain = _plain_members(data, levels)
                if plain is not None:
                    return plain, "metadata"
        elif self.compiled is not None and not levels and form_fields is None \
                and not structural:
            run = _Run(ceiling, policy, agent, subject)
            out = run.obj(self.compiled, data, 0)
            return (out or None), (run.honored if out else "metadata")
        g = _Gate(ceiling, policy, agent=agent, subject=subject, form_fields=form_fields,
                  levels=levels, structural=frozenset(structural or ()), derive=True)
        out = g.obj(node, data, "")
        return (out or None), (g.honored if out else "metadata")

    def gate_hinted(self, data: Any, policy: CapturePolicy, agent: str | None,
                    subject: str | None, hints: Mapping[str, Any] | None
                    ) -> tuple[dict[str, Any] | None, str]:
        """:meth:`gate` with an emission's ``gating`` hints as they come
        (:class:`bridges.core.bridge.Gating`, or ``None``), positional: the
        stamper's run path (:meth:`bridges.core.envelope.Stamper.stamp_run`).
        A ``plain`` claim on a type that :attr:`takes_plain` keeps a
        non-empty ``data`` dict as it is (``metadata``: the claim is that the
        gate would copy it so); a ``levels``-only hint takes
        :meth:`gate_levels`; anything else :meth:`gate` itself."""
        if not hints:
            return self.gate(data, policy, agent=agent, subject=subject)
        # the claim as Gating defines it: plain True, beside a levels mapping
        # (without one the gate claims the ceiling); plain False, or beside
        # levels None or a non-mapping, is no claim and takes the gate below
        if self.takes_plain and hints.get("plain") is True:
            levels = hints.get("levels")
            if levels.__class__ is dict or isinstance(levels, Mapping):
                if data.__class__ is dict and data:
                    return data, "metadata"
                return self.gate(data, policy, agent=agent, subject=subject, levels=levels)
        if len(hints) == 1 and "levels" in hints:
            return self.gate_levels(data, policy, agent, subject, hints["levels"])
        return self.gate(data, policy, agent=agent, subject=subject,
                         form_fields=hints.get("form_fields"), levels=hints.get("levels"),
                         structural=hints.get("structural") or ())

    def gate_levels(self, data: Any, policy: CapturePolicy, agent: str | None,
                    subject: str | None, levels: Mapping[str, str] | None
                    ) -> tuple[dict[str, Any] | None, str]:
        """:meth:`gate` with only a ``levels`` hint (no ``form_fields``,
        no ``structural``), positional: the stamper's run path
        (:meth:`bridges.core.envelope.Stamper.stamp_run`). The same
        answer as ``gate(data, policy, agent=agent, subject=subject,
        levels=levels)``: an unregistered type's payload naming no declared
        key takes the plain-member copy directly, everything else
        :meth:`gate` itself."""
        if self.node is None and levels is not None and self.ceiling != "none" \
                and data.__class__ is dict and data:
            seen = self._declared
            if seen is None or seen[0] is not levels:
                seen = self._declared = (levels, _level_keys(levels) if levels else frozenset())
            plain = _plain(data, seen[1])
            if plain is not None:
                return plain, "metadata"
        return self.gate(data, policy, agent=agent, subject=subject, levels=levels)


_PLANS: dict[tuple[str, str], GatePlan] = {}


def gate_plan(type_: str, ceiling: str) -> GatePlan:
    """The (shared, memoized) :class:`GatePlan` of ``type_`` at ``ceiling``
    (at most 4,096 kept: vendor type names are open-ended). Raises
    ``ValueError`` for an unknown ``ceiling``."""
    key = (type_, ceiling)
    plan = _PLANS.get(key)
    if plan is None:
        plan = GatePlan(type_, ceiling)
        if len(_PLANS) >= 4096:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def gate(type_: str, data: dict[str, Any] | None, ceiling: str, policy: CapturePolicy, *,
         agent: str | None = None, subject: str | None = None, form_fields: Any = None,
         levels: Mapping[str, str] | None = None,
         structural: Collection[str] = ()) -> tuple[dict[str, Any] | None, str]:
    """Gate one payload to ``ceiling`` (AEP-0003 §9.1-§9.5); returns
    ``(data, honored_level)`` with ``data`` a new dict or ``None`` when
    nothing is left.

    Registered types (:data:`bridges.core.captable.TABLE`):

    - every field whose annotation exceeds the ceiling is dropped (nested
      objects and array items included); unannotated fields are
      ``metadata`` (AEP-0002 §5.1 rule 4);
    - missing ``*_digest`` fields are computed from the original content
      first (``args_digest`` from ``args``...; §9.3 digests before
      redaction), when the digest is allowed;
    - at ``redacted`` every kept ``redacted``-gated value passes the §9.4
      pipeline, and a missing ``*_redacted`` twin (``args_redacted``,
      ``result_redacted``, ``content_redacted``, ``cited_text_redacted``)
      is filled from its ``full`` sibling through the pipeline; at ``full``
      content is verbatim;
    - ``[metadata*]`` (AEP-0002 §5.3, §8): at ``metadata``
      ``attention.requested.prompt`` becomes ``"{agent} requests {kind}:
      {subject}"`` (``agent``/``subject`` are the envelope's, keyword
      arguments here) and every ``options[].label`` / ``fields[].label`` /
      ``fields[].choices[].label`` becomes its item's ``id`` (else the
      1-based index); both are synthesized when missing since the schema
      requires them; at ``redacted``+ they are content. ``structural``
      names the starred paths (``"prompt"``, ``"options[].label"``,
      ``"fields[].label"``, ``"fields[].choices[].label"``) the caller
      asserts are ALREADY structural (a mapper's own synthesis such as
      ``"claude-code asks 2 questions"``): kept as given at any ceiling;
    - ``answer.values`` is gated per the request's ``form_fields`` (the
      ``field_spec`` list) as :func:`gate_form_values`; without
      ``form_fields`` only numbers and booleans survive ``metadata``.

    Unregistered types (``x.*``, reserved ``message.*``): there is no
    table, so the mapper shaped ``data`` to the ceiling (AEP-0002 §5.1 rule
    4 makes every field ``metadata`` by default). ``levels`` (dotted path ->
    level, e.g. ``{"file": "redacted"}``) declares content fields: they are
    dropped above the ceiling and redacted at ``redacted`` like annotated
    ones. For registered types ``levels`` can only raise a level.

    ``honored_level`` (AEP-0003 §9.5, AEP-0001 §8.2(a)): ``none`` when the
    ceiling is ``none`` (and ``data`` is ``None``: envelope only); else the
    highest level of any value actually kept, floored at ``metadata``: a
    kept ``redacted``-gated (or ``[metadata*]`` content) value counts
    ``redacted`` after the pipeline and ``full`` when verbatim; a kept
    ``full``-gated value counts ``full``. It never exceeds the ceiling. For
    an unregistered type without ``levels`` and non-empty data the gate
    cannot tell what the mapper put there, so it claims the ceiling
    itself: over-claiming is safe (a downstream hop strips more), an
    under-claim would leak past a lower consumer ceiling.

    Never raises for JSON-shaped ``data``/``form_fields``; a non-object
    ``data`` is dropped. Raises ``ValueError`` for an unknown ``ceiling``.
    The work is :meth:`GatePlan.gate` of :func:`gate_plan`."""
    return gate_plan(type_, ceiling).gate(data, policy, agent=agent, subject=subject,
                                          form_fields=form_fields, levels=levels,
                                          structural=structural)


# ------------------------------------------------------------------ relay hop


def downlevel(event: dict[str, Any], ceiling: str) -> dict[str, Any]:
    """A relay hop's mechanical down-level of a whole envelope to ``ceiling``
    (AEP-0001 §8.2(b)(e), AEP-0002 §5.1 rule 3, AEP-0003 §6.4; fixture
    ``downlevel/cases.json``). Returns a new dict; never up-levels; never
    mints ``redacted``.

    - ``ceiling`` at or above the event's ``capture`` (absent: ``metadata``):
      unchanged copy.
    - ``none``: ``data`` removed, ``capture: none``.
    - otherwise the target is ``metadata``: a ``redacted`` ceiling on a
      ``full`` event lands on ``metadata`` (§8.2(e): dropping fields cannot
      establish the redaction provenance claim).
    - registered types: fields above ``metadata`` dropped by the table;
      ``[metadata*]`` content degraded structurally (prompt synthesized
      from the envelope ``agent``/``subject`` and ``data.kind``, labels to
      their item ids, ``answer.values`` keeps numbers/booleans only: a hop
      has no request context to classify strings). No digest is derived.
    - unregistered types: ``data`` dropped wholesale (no annotations, so the
      conservative direction).

    An unknown ``capture`` value on the event is treated as ``full``. Raises
    ``ValueError`` for an unknown ``ceiling``."""
    rank(ceiling)
    ev = _copy(event)
    cap = event.get("capture", "metadata")
    if cap not in _RANK:
        cap = "full"
    if _RANK[ceiling] >= _RANK[cap]:
        return ev
    target = "metadata" if ceiling == "redacted" else ceiling
    ev["capture"] = target
    data = ev.pop("data", None)
    if target == "none":
        return ev
    node = _ct.node_for(str(event.get("type")))
    if node is None or not isinstance(data, dict):
        return ev
    g = _Gate("metadata", _DEFAULT_POLICY, agent=event.get("agent"), subject=event.get("subject"),
              form_fields=None, levels=None, structural=(), derive=False)
    out = g.obj(node, data, "")
    if out:
        ev["data"] = out
    return ev
