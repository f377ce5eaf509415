"""The stamped-append fast path of the session buffers
(:meth:`StampedAppends.append_stamped`): an in-process emitter's drain of
stamped envelopes appended to its held buffer in one loop, each held
tuple made from the envelope dict itself through its key layout
(:data:`_Layout`, remembered per key tuple), with no :class:`.entry.Entry`
(issue 11). Equal to :func:`.envelope.trusted_entry` +
:meth:`.buffer.SessionBuffers.admit` per pair (property test
``tests/unit/relay/test_append_stamped.py``).

:class:`StampedAppends` is a mixin of :class:`.buffer.SessionBuffers`
(which sets the attributes declared here)."""
from __future__ import annotations

from collections import OrderedDict
from operator import itemgetter
from typing import Any, Callable, Sequence

from bridges.core.aep import ACK_TYPES, CAPTURE_RANK, SEVERITY_RANK, is_command_type

from .entry import _MAX_NAMES, _NAMES, ENTRY_OVERHEAD, BufKey, Held
from .pins import PIN_TYPES
from .ring import SessionRing

__all__ = ["StampedAppends", "AppendFault"]

#: an envelope's key tuple (``tuple(ev)``) -> its :class:`_Layout`
#: (:meth:`SessionBuffers.append_stamped`); bounded
_LAYOUTS: dict[tuple[str, ...], _Layout] = {}

#: what an append reads from every envelope (a layout without one of them: the one-event path)
_NEEDED = ("type", "source", "session", "seq", "id")

_Layout = tuple  # (names, values, at type, source, session, agent, seq, epoch, id, severity, capture)
"""One envelope key layout: its attribute names (the keys but ``data``,
shared through :data:`_NAMES`), the getter of their values in that order
(``operator.itemgetter``) and the index of each attribute an append reads
in those values (``-1``: absent)."""


def _layout(keys: tuple[str, ...]) -> _Layout | None:
    """``keys``' :data:`_Layout` (remembered in :data:`_LAYOUTS`); ``None``
    when an attribute of :data:`_NEEDED` is missing."""
    names = tuple(k for k in keys if k != "data")
    if any(k not in names for k in _NEEDED):
        return None
    if len(_NAMES) < _MAX_NAMES:
        names = _NAMES.setdefault(names, names)
    at = [names.index(k) if k in names else -1
          for k in ("type", "source", "session", "agent", "seq", "epoch", "id", "severity", "capture")]
    got = (names, itemgetter(*names), *at)
    if len(_LAYOUTS) >= _MAX_NAMES:
        _LAYOUTS.clear()
    _LAYOUTS[keys] = got
    return got


class AppendFault(Exception):
    """:meth:`SessionBuffers.append_stamped` failed part way through the
    append of a pair (the cause is chained): ``taken`` is the index after
    that pair (it and every pair before it from ``start`` were admitted:
    buffered, the failing one perhaps not whole), ``n`` the admission
    counter after them, ``held`` the held tuples of those before it (the
    failing one is not among them: the one-event path fans nothing out of
    an admission that raised)."""

    def __init__(self, taken: int, n: int, held: list[Held]) -> None:
        super().__init__(f"append failed at pair {taken - 1}")
        self.taken, self.n, self.held = taken, n, held


class _BufferState:
    """What :class:`StampedAppends` reads of the buffers, set by
    :class:`.buffer.SessionBuffers` (a class of its own: ``bytes``
    declared in the mixin's body would shadow the type there)."""

    depth: int
    buffer_bytes: int
    total_bytes: int
    bytes: int
    counters: dict[str, int]
    _sessions: OrderedDict[BufKey, SessionRing]
    _sources: dict[str, dict[BufKey, None]]
    _trim: Callable[[SessionRing], None]


class StampedAppends(_BufferState):
    """The stamped appends of :class:`.buffer.SessionBuffers` (a mixin)."""

    def append_stamped(self, key: BufKey, pairs: Sequence[tuple[dict[str, Any], bytes]],
                       start: int, n: int, agent: str | None, plain: set[str]
                       ) -> tuple[int, int, list[Held]]:
        """Admit into the held buffer ``key`` the stamped envelopes of
        ``pairs[start:]`` (``(event dict, its wire bytes)``: what
        :func:`.envelope.trusted_entry` takes) that the relay's trusted run
        (:meth:`Relay.admit_stamped_run <supervisor.relay.core.Relay.admit_stamped_run>`)
        would simply append to it, in one loop, with no :class:`Entry`:
        each pair's held tuple made from the dict itself, its admission
        number ``n + 1``, ``n + 2``... It stops at the first pair that is
        not such an append: another ``source`` or ``session`` than
        ``key``'s, a ``type`` that is not a ``str`` in ``plain`` nor a
        non-command ``str`` (added to ``plain`` then), one of
        :data:`.pins.PIN_TYPES` (an ask opened or closed: :meth:`admit`
        marks it), an ``agent`` other
        than ``agent`` (``None``: any), a ``seq`` or ``epoch`` that is not
        an ``int``, a position not past the buffer's last, an ``id`` it
        holds, an unknown ``severity`` or ``capture``, an entry that does
        not fit both byte budgets as they stood before the first (so no
        byte budget trims), anything that raises while it is looked at;
        or at once when ``key``'s source has other buffers too. Those are
        exactly the pairs for which the run's checks
        (:meth:`fresh`, the owner check made already for ``key``'s source,
        the agent check) pass and :meth:`admit` appends; the depth is
        trimmed as :meth:`admit` trims it, after each append. Equal to
        :func:`.envelope.trusted_entry` + :meth:`admit` per pair (property
        test ``tests/unit/relay/test_append_stamped.py``).

        Returns ``(stop, n, held)``: the index of the first pair not taken,
        the admission counter after the taken ones and their held tuples in
        order (what the caller fans out). The caller counts them, and
        claims nothing: it admitted an event of ``key`` just before (the
        claims of ``key``'s session and source are already the most recent).
        Raises :class:`AppendFault` when an append raises part way."""
        s = self._sessions.get(key)
        source, session = key
        if s is None or len(self._sources[source]) > 1:
            return start, n, []
        ids, entries, marks = s.ids, s.entries, s.keys
        last = marks[-1] if marks else None
        room = min(self.buffer_bytes - s.bytes, self.total_bytes - self.bytes)
        limit = self.depth + s.start  # len(entries) past it: over the depth
        sev_rank, cap_rank, layouts = SEVERITY_RANK, CAPTURE_RANK, _LAYOUTS
        sev_info, cap_metadata = sev_rank["info"], cap_rank["metadata"]
        held: list[Held] = []
        keep, hold, mark = held.append, entries.append, marks.append
        added = 0
        lkeys: tuple[str, ...] | None = None
        k, n0 = start, n
        try:
            for k in range(start, len(pairs)):  # noqa: B007 -- k: where it stopped
                try:
                    ev, raw = pairs[k]
                    keys = tuple(ev)
                    if keys != lkeys:
                        got = layouts.get(keys) or _layout(keys)
                        if got is None:
                            break
                        names, values, at_t, at_src, at_ses, at_ag, at_seq, at_ep, at_id, \
                            at_sev, at_cap = got
                        if agent is not None and at_ag < 0:
                            break
                        lkeys = keys
                    vals = values(ev)
                    t = vals[at_t]
                    if t not in plain:
                        if t.__class__ is not str or is_command_type(t) or t in ACK_TYPES \
                                or t in PIN_TYPES:  # (never in plain: .pins marks them)
                            break
                        plain.add(t)
                    # the buffer's own source and session: the same object (a
                    # stamper's run), else an equal exact str (as the key lookup)
                    src, ses = vals[at_src], vals[at_ses]
                    if (src is not source and (src.__class__ is not str or src != source)) or \
                            (ses is not session and (ses.__class__ is not str or ses != session)) \
                            or (agent is not None and vals[at_ag] != agent):
                        break
                    seq = vals[at_seq]
                    epoch = vals[at_ep] if at_ep >= 0 else 0
                    if seq.__class__ is not int or epoch.__class__ is not int:
                        break
                    pos = (epoch, seq)
                    ident = vals[at_id]
                    if (last is not None and pos <= last) or ident in ids:
                        break
                    sev = sev_rank[vals[at_sev]] if at_sev >= 0 else sev_info
                    cap = cap_rank[vals[at_cap]] if at_cap >= 0 else cap_metadata
                    size = len(raw) + ENTRY_OVERHEAD
                    if added + size > room:
                        break
                    h = (names, raw, sev, cap, n + 1, size, epoch, seq, src, ident) + vals
                except Exception:  # noqa: BLE001 -- not an append: the one-event path answers it
                    break
                n += 1
                ids[ident] = h
                hold(h)
                mark(pos)
                last = pos
                added += size
                if len(entries) > limit:  # as admit(): the oldest out, now
                    s.bytes += added  # (accounted first, as admit() does)
                    self.bytes += added
                    added = 0
                    limit = self._trim_appended(s)
                keep(h)
            else:
                k = len(pairs)
        except Exception as exc:
            raise AppendFault(k + 1, n, held) from exc
        finally:
            self._appended(key, s, added, n != n0)
        return k, n, held

    def _trim_appended(self, s: SessionRing) -> int:
        """:meth:`append_stamped` past the depth: the oldest entries trimmed
        and counted until it is not (as :meth:`admit` does: one, unless a
        trim that raised left it over); returns the length of ``s.entries``
        past which it is over again (a trim may compact the list)."""
        depth, counters = self.depth, self.counters
        while len(s.entries) - s.start > depth:
            self._trim(s)
            counters["trimmed"] += 1
        return depth + s.start

    def _appended(self, key: BufKey, s: SessionRing, added: int, any_: bool) -> None:
        """:meth:`append_stamped`'s accounting: ``added`` bytes and (``any_``
        appended) ``key`` the most recently written."""
        s.bytes += added
        self.bytes += added
        if any_:
            self._sessions.move_to_end(key)  # recency = last buffered write
            s.order.move_to_end(key)  # type: ignore[union-attr]  # (a held buffer has one)
