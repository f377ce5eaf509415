"""Exception groups, walked once: trio nurseries (and hypercorn's, and the
bridges' own) wrap failures in nested ``BaseExceptionGroup``\\ s, and every
place that reports or classifies a failure wants the leaves.

Pure: no I/O."""
from __future__ import annotations

__all__ = ["leaves", "root_cause"]


def leaves(exc: BaseException) -> list[BaseException]:
    """The non-group exceptions inside ``exc``, depth first in group order;
    ``[exc]`` when ``exc`` is not a group. An empty group has no leaves."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in leaves(sub)]
    return [exc]


def root_cause(exc: BaseException) -> BaseException:
    """The first leaf of ``exc`` (``exc`` itself when it is not a group, or
    a group without exceptions): what an operator wants named instead of
    "ExceptionGroup"."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
