"""Does an event's ``data`` stay within the ``capture`` it declares?
(AEP-0001 §8.2(a): "An Event's data MUST honor its declared capture level;
payload schemas mark each field's minimum level", AEP-0002 §5.)

The relay fans out by the *declared* level: a subscriber with a
``metadata`` ceiling gets a ``metadata``-declared event untouched. An
emitter that declares ``metadata`` (or ``none``) while carrying a field the
schema gates ``full`` would leak that field to every lower ceiling; the
relay refuses such events at ingest (``invalid-event``).

The field table is the shared one (:mod:`bridges.core.captable`, checked
path for path against the schemas), compiled once into plain dicts. The
check is a necessary condition only, cheap on the hot path (a walk over
the payload's keys, no copies; measured ~1 us per registered-type event,
~0.2 us for a vendor type, against ~20 us for the whole ingest):

- ``none`` with a non-empty ``data`` exceeds, whatever the type;
- registered types: a present field whose annotation is above the declared
  level exceeds (nested objects and array items included); unannotated
  fields are ``metadata`` (AEP-0002 §5.1 rule 4);
- ``[metadata*]`` fields (``attention.requested.prompt``, the ``label``\\ s,
  ``answer.values``) are structural or content depending on how they were
  made, which the envelope cannot show: never counted as exceeding;
- vendor (``x.*``), reserved and unknown types have no table: only the
  ``none`` rule applies."""
from __future__ import annotations

from typing import Any

from bridges.core.aep import CAPTURE_LEVELS as _LEVELS
from bridges.core.aep import CAPTURE_RANK as _RANK
from bridges.core.captable import TABLE, Node

__all__ = ["exceeds", "content_level"]


class _Spec(dict[str, tuple[int, Any, Any]]):
    """``key -> (rank, object spec | None, array item spec | None)`` for the
    members of one table node (array items: ``(rank, object spec | None)``),
    and ``hot``: the keys whose presence can show more than ``metadata``
    (a rank above it, or below them a member that can). A value none of
    whose keys is hot shows ``metadata`` at most, whatever it nests."""

    __slots__ = ("hot",)

    def __init__(self, members: dict[str, tuple[int, Any, Any]]) -> None:
        super().__init__(members)
        hot = set()
        for key, (r, obj, item) in members.items():
            if r > 1 or (obj is not None and obj.hot) or (
                    item is not None and (item[0] > 1 or (item[1] is not None and item[1].hot))):
                hot.add(key)
        self.hot: frozenset[str] = frozenset(hot)


def _compile(node: Node) -> _Spec:
    """The :class:`_Spec` of ``node``'s members; ``[metadata*]`` members are
    left out (never counted)."""
    out: dict[str, tuple[int, Any, Any]] = {}
    for key, child in (node.props or {}).items():
        if child.star is not None:
            continue
        obj = _compile(child) if child.props is not None else None
        item = None
        if child.items is not None:
            it = child.items
            item = (_RANK[it.level], _compile(it) if it.props is not None else None)
        out[key] = (_RANK[child.level], obj, item)
    return _Spec(out)


_SPECS: dict[str, _Spec] = {t: _compile(n) for t, n in TABLE.items()}


def content_level(type_: str, data: object) -> str:
    """The highest capture level ``data`` shows for ``type_`` by the field
    table: ``"none"`` for no or empty ``data``, else ``"metadata"``,
    ``"redacted"`` or ``"full"`` (the walk stops at the first ``full``
    field). Never raises for JSON-shaped input."""
    if not isinstance(data, dict) or not data:
        return "none"
    spec = _SPECS.get(type_)
    if spec is None:
        return "metadata"
    return _LEVELS[_max_rank(spec, data, 1)]


def _max_rank(spec: _Spec, value: dict[str, Any], best: int) -> int:
    """The highest rank ``value`` shows by ``spec``, at least ``best``
    (``>= 1``): only its hot keys are looked at (:class:`_Spec`; held
    equal to the walk over every key by a property test,
    ``tests/unit/relay/test_relay_runs.py``)."""
    hot = spec.hot
    if hot.isdisjoint(value):
        return best
    for key, v in value.items():
        if key not in hot:
            continue
        r, obj, item = spec[key]
        if r > best:
            if r == 3:
                return 3
            best = r
        elif r == 1:
            if obj is not None:
                if isinstance(v, dict):
                    best = _max_rank(obj, v, best)
            elif item is not None and isinstance(v, list) and v:
                best = _items_rank(item, v, best)
            if best == 3:
                return 3
    return best


def _items_rank(item: tuple[int, _Spec | None], v: list[Any], best: int) -> int:
    """:func:`_max_rank` over a non-empty array by its item spec."""
    irank, iobj = item
    if iobj is not None:
        for x in v:
            if isinstance(x, dict):
                best = _max_rank(iobj, x, best)
                if best == 3:
                    return 3
    elif irank > best:
        best = irank
    return best


def exceeds(type_: str, data: object, declared: str) -> str | None:
    """``None`` when ``data`` honors ``declared`` (``full`` always does),
    else the higher level it shows. ``declared`` must be a capture level."""
    if declared == "full" or not data:
        return None
    level = content_level(type_, data)
    return level if _RANK[level] > _RANK[declared] else None
