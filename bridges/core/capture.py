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

The pieces (issue 26): :mod:`bridges.core.cappolicy` (the policy, the §9.4
pipeline, digests), :mod:`bridges.core.capwalk` (the member-by-member pass,
the reference and the hinted path), and here the compiled plans
(:class:`GatePlan`, :func:`gate_plan`), :func:`gate` and :func:`downlevel`.
Every public name of the three is offered here.
"""
from __future__ import annotations

from typing import Any, Collection, Mapping

from . import captable as _ct
from .aep import CAPTURE_LEVELS as LEVELS
from .aep import CAPTURE_RANK as _RANK
from .aep import capture_rank as rank
from .cappolicy import (
    _DEFAULT_POLICY,
    BUILTIN_SECRET_NAMES,
    CaptureConfigError,
    CapturePolicy,
    _max,
    canonical_json,
    digest,
    redact_text,
    redact_value,
)
from .capwalk import (
    _SCALARS,
    _copy,
    _Gate,
    _gate_values,
    _level_keys,
    _made_members,
    _placeholder,
    _plain,
    _plain_members,
    declares,
    gate_form_values,
    synthesize_prompt,
)

__all__ = [
    "LEVELS", "rank", "BUILTIN_SECRET_NAMES", "CaptureConfigError", "CapturePolicy",
    "canonical_json", "digest", "redact_text", "redact_value", "declares", "gate_form_values",
    "synthesize_prompt", "GatePlan", "gate_plan", "gate", "downlevel",
]


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
