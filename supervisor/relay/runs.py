"""The trusted runs of the embedded relay: an in-process emitter's own
stamped envelopes admitted without re-validation (:meth:`StampedRuns.admit_stamped`),
and a whole drain of them in one call (:meth:`StampedRuns.admit_stamped_run`:
the checks made once per run of one source, a stretch of mere appends
handed to :meth:`.buffer.SessionBuffers.append_stamped`, one fan-out at
the end). Each is equal to the one-event path of :mod:`.ingest` (property
tests ``tests/unit/relay/test_admit_run.py``,
``tests/unit/relay/test_append_stamped.py``).

:class:`StampedRuns` is a mixin of :class:`~.core.Relay` over
:class:`.ingest.Ingest`."""
from __future__ import annotations

from typing import Any, Sequence

from .acks import ACK_TYPES
from .buffer import AppendFault, Entry, Held
from .connections import Connection, LocalEmitter
from .envelope import is_command_type, is_foreign, trusted_entry
from .ingest import Ingest
from .pins import PIN_TYPES

__all__ = ["StampedRuns", "RunFault"]


class RunFault(Exception):
    """:meth:`Relay.admit_stamped_run` failed inside the admission of a
    pair: every pair before index ``taken`` (that one included) was handed
    to the relay, so a caller resumes at ``taken`` (the cause is chained)."""

    def __init__(self, taken: int) -> None:
        super().__init__(f"admission failed at pair {taken - 1}")
        self.taken = taken


class StampedRuns(Ingest):
    """The relay's trusted runs (a mixin of :class:`~.core.Relay`)."""

    def admit_stamped(self, ev: dict[str, Any], raw: bytes, conn: Connection) -> None:
        """Admit a non-command envelope an in-process emitter's own stamper
        built, with its wire bytes ``raw`` (:func:`.envelope.trusted_entry`:
        no re-validation, no re-encoding; the stamper's capture gate
        already holds ``data`` to its ``capture``). Still refused
        (:class:`InvalidEvent`): another emitter's ``source``, a taken
        ``(epoch, seq)`` or ``id`` (the checks that protect other emitters),
        a session not the fleet's to take (:class:`.ingest.FleetRefused`);
        another agent than the connection's is :meth:`_identity_mismatch`."""
        e = trusted_entry(ev, raw)
        self.check_owner(e, conn)
        if isinstance(conn, LocalEmitter):
            self.check_fleet_session(e, conn)
        self.check_position(e)
        if conn.agent is not None and ev["agent"] != conn.agent and not is_foreign(e.attrs["type"]):
            self._identity_mismatch(conn, ev["agent"])
        if e.attrs["type"] in ACK_TYPES:
            self.acks.check(e, conn, trusted=isinstance(conn, LocalEmitter))
        self._admit(e, conn)

    def admit_stamped_run(self, pairs: Sequence[tuple[dict[str, Any], bytes]], start: int,
                          conn: Connection) -> int:
        """:meth:`admit_stamped` for ``pairs[start:]`` in order, in one
        call (the fleet's pump hands a drain over at once): returns the
        index of the first pair it does not take, ``len(pairs)`` when it
        took them all. It stops, having done nothing of that pair, at a
        command or at an envelope :meth:`admit_stamped` would refuse or
        call an identity mismatch: the caller hands that one to
        :meth:`admit_stamped` (its refusal, its count) and goes on after
        it. Equal to one :meth:`admit_stamped` per pair (property test
        ``tests/unit/relay/test_admit_run.py``); the owner check is made
        once per run of one ``source`` (only this loop's own admissions,
        which make ``conn`` the owner, run in between). A pair whose checks
        raise is not taken (its index is returned, nothing of it done); a
        pair whose admission raises part way raises :class:`RunFault`
        (``taken``: the index after it), so the caller never hands an
        admitted pair over again."""
        taken: list[Entry | list[Held]] = []
        self._run = taken  # _admit collects the run's entries instead of offering each
        try:
            return self._admit_stamped_run(pairs, start, conn)
        finally:
            self._run = None
            # the run's fan-out, once its admissions are done (nothing reads
            # the fan-out in between; a refused pair's own answer comes after)
            if taken:
                self._offer_taken(taken)

    def _offer_taken(self, taken: list[Entry | list[Held]]) -> None:
        """Fan out what :meth:`admit_stamped_run` took, in order: entries
        with :meth:`.fanout.Fanout.offer_run`, a stretch's held tuples with
        :meth:`.fanout.Fanout.offer_held` (each equal to one
        :meth:`.fanout.Fanout.offer` per event, so the pieces in order are)."""
        fanout = self.fanout
        if len(taken) == 1 and taken[0].__class__ is list:
            fanout.offer_held(taken[0])  # the common drain: one stretch
            return
        entries: list[Entry] = []
        for x in taken:
            if x.__class__ is list:
                if entries:
                    fanout.offer_run(entries)
                    entries = []
                fanout.offer_held(x)
            else:
                entries.append(x)  # type: ignore[arg-type]
        if entries:
            fanout.offer_run(entries)

    def _admit_stamped_run(self, pairs: Sequence[tuple[dict[str, Any], bytes]], start: int,
                           conn: Connection) -> int:
        """:meth:`admit_stamped_run`'s checks and admissions (each
        :meth:`_admit` collects its entry for the caller's one fan-out).
        After each sequenced admission, the pairs that follow it and merely
        append to its buffer (one emitter session's drain) are admitted in
        one :meth:`.buffer.SessionBuffers.append_stamped` call, their held
        tuples collected for the fan-out in place of the entry (:meth:`_stretch`)."""
        buffers, claims, agent = self.buffers, self.claims, conn.agent
        fleet = isinstance(conn, LocalEmitter)
        checked: str | None = None  # the source last found not owned by another
        free: str | None = None  # the session last found no credential's
        plain: set[str] = set()  # the types found not commands (a run has few)
        i, end = start, len(pairs)
        while i < end:
            try:
                ev, raw = pairs[i]
                type_ = ev.get("type")
                if type_.__class__ is not str or type_ not in plain:
                    if is_command_type(type_) or type_ in ACK_TYPES:  # routed / gated
                        return i
                    if type_.__class__ is str and type_ not in PIN_TYPES:  # (.pins marks those)
                        plain.add(type_)
                e = trusted_entry(ev, raw)
                src = e.attrs["source"]
                if src != checked:
                    owner = claims.source_owner(src)
                    if owner is not None and owner is not conn:
                        return i
                    checked = src
                ses = e.attrs.get("session")
                if fleet and ses != free and ses.__class__ is str:
                    if self.fleet_refusal(ses, conn) is not None:  # not the fleet's to take
                        return i
                    free = ses
                # fresh(): one lookup says neither check can refuse it (an
                # emitter appending); else both checks, as admit_stamped makes
                if e.pos is not None and not buffers.fresh(e) and \
                        (buffers.conflict(e) or buffers.conflicting_duplicate(e)):
                    return i
                if agent is not None and ev["agent"] != agent and not is_foreign(e.attrs["type"]):
                    return i
            except Exception:  # noqa: BLE001 -- nothing of it done: its own answer on the one-event path
                return i
            try:
                self._admit(e, conn)
            except Exception as exc:
                raise RunFault(i + 1) from exc
            i += 1
            if e.pos is not None and i < end:
                i = self._stretch(e, pairs, i, agent, plain)
        return end

    def _stretch(self, e: Entry, pairs: Sequence[tuple[dict[str, Any], bytes]], i: int,
                 agent: str | None, plain: set[str]) -> int:
        """Right after ``e``'s admission: the pairs from ``i`` on that the
        run would check and :meth:`_admit` as mere appends to ``e``'s buffer
        (:meth:`.buffer.SessionBuffers.append_stamped`), admitted at once;
        returns the index of the first one not taken. Their source's owner
        check is ``e``'s, and their claims are ``e``'s (the same session and
        source, just made the most recent: claiming again changes nothing).
        In the run's fan-out list, ``e`` is replaced by one list: its held
        tuple then theirs (:meth:`.fanout.Fanout.offer_held`). Raises
        :class:`RunFault` when an append raises part way."""
        try:
            stop, n, held = self.buffers.append_stamped(e.bkey, pairs, i, self._admitted, agent, plain)
        except AppendFault as f:
            stop, n, held = f.taken, f.n, f.held
            fault: BaseException | None = f.__cause__ or f
        else:
            fault = None
        taken = stop - i
        if taken:
            self.counters["events"] += taken
            self._admitted = n
            run = self._run
            if held and run is not None:
                if run and run[-1] is e:  # (it is, unless _admit is not the relay's own)
                    held.insert(0, e.held())
                    run[-1] = held  # a stretch: its held tuples
                else:
                    run.append(held)
        if fault is not None:
            raise RunFault(stop) from fault
        return stop
