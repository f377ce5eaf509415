"""Session bindings (issue 25, hardening round two): which emitter identity
a session belongs to, beyond the life of any one connection (AEP-0004 §4.5,
§8 "the router never resolves a tie": a claimed name may deny control,
never divert it).

An identity here is a *principal*, what the relay can verify about a
party, never what it asserts:

- :data:`FLEET`: the daemon's own bridges (in-process, :class:`LocalEmitter`);
- ``emitter:<name>``: a remote party that presented the per-emitter
  credential ``<name>`` of ``AEP_EMITTER_TOKENS`` (:func:`named`);
- :data:`SHARED`: the shared ``AEP_TOKEN``, which every party of one
  deployment holds; :data:`ANONYMOUS`: no token configured at all.

The rules a remote claimant (a ``/socket`` emitter's sequenced event; a
``POST /events`` event of a named emitter, which also meets the hold of
another live claimant's session, as on ``/socket``: outside review of
issue 25) meets, :meth:`Bindings.refusal`:

- an unbound session is bound to the first claimant's principal and source;
- a :data:`FLEET` session is the fleet's for ever: no remote party may emit
  its sequenced events;
- a fleet bridge that emits into a session bound to the shared or the
  anonymous principal takes it back (:meth:`Bindings.bind_fleet`: a remote
  party that pre-claimed a fleet session after a restart loses it) only
  once that binding is free by the rule any other claimant meets (no
  remote claimant connected and ``grace_s`` passed since the last one
  left), and never one bound to a per-emitter credential
  (:func:`fleet_refusal`): the OTLP receiver is unauthenticated and a
  ``conversation.id`` becomes the session verbatim, so anyone who read a
  session id on ``/stream`` could otherwise make the fleet take it
  (outside review of issue 25). Nor does a fleet bridge enter a session a
  fleet bridge of another agent claims now (two claimants: every command
  ``ambiguous``; two bridges of one agent share sessions by design):
  :meth:`.ingest.Ingest.fleet_refusal`. The fleet's events into such a
  session are refused instead (counted ``refused_fleet_into_owned``,
  logged once per session), never logged, never admitted;
- a named principal's session is that principal's: no one else may claim
  it, its owner connected or not, before or after a restart;
- the shared and anonymous principals cannot be told apart: a session
  bound to one of them is held for its first claimant's ``source`` (an
  asserted name) while a claimant is connected and for ``grace_s`` seconds
  after the last one left (``AEP_CLAIM_GRACE``), then it is free. A
  squatter under another source is refused (counted) instead of winning
  silently; one that copies the owner's source from ``/stream`` is the
  owner as far as anyone can tell (the stated limit: per-emitter
  credentials lift it).

Who may *command* a session follows from its binding too
(:func:`command_refusal`, AEP-0004 §4.3 per-sender scoping): a per-emitter
credential commands only the sessions bound to it (an unbound one
included: refused, a credential has no claim to it); the shared token and
the fleet command every session.

Bounded: at most ``cap`` bindings. A principal whose new binding fills
the table forgets its own least recently used one first (a party churning
new sessions pushes out only its own: a per-emitter credential that did
pushed out the fleet's and the other credentials' bindings, outside review
of issue 25); a principal with no other binding pushes out the shared
principal's least recently used, then the least recently used verified
one that is not the fleet's, the fleet's last.
The fleet's bindings are of two kinds (round 8 outside attack, finding 6:
an unauthenticated OTLP flood of new ``conversation.id`` s, all
:data:`FLEET`, pushed out a live Claude Code hook session's binding, and
after a restart a per-emitter credential posted into it): those an *open*
bridge made (``bind_fleet(..., open_=True)``: a bridge whose session ids
unauthenticated senders choose, the OTLP receiver and the AG-UI proxy,
:attr:`.connections.LocalEmitter.open_sessions`) are kept apart
(:attr:`Binding.open`, ``"o": 1`` in the journal). The same rules hold for
both (a remote party may enter neither), but an open bridge's new binding
pushes out only an open one (its own kind's least recently used; the one
just made when it is the only one), never an authenticated bridge's, a
credential's or the shared principal's; an authenticated bridge's new
binding pushes out the open kind's first, and every other principal's
reach the open kind's before any verified one. An authenticated bridge
that emits into a session an open bridge bound takes it into its own kind
(as the writer index ranks them, :mod:`supervisor.sessionlog.writers`).
Kept across restarts in a journal (:meth:`Bindings.open`: one JSON line a
binding, appended when it is made or changed, compacted at start and
whenever the lines appended since exceed twice the table plus 1,024, so
it stays within about three times the table): a restarted relay
remembers who owned what, and the shared principal's grace restarts from
the restart (every connection dropped at once). A session id or source
longer than :data:`KEY_MAX` characters is kept as a prefix and its
SHA-256 (:func:`key`), in the table and the journal alike."""
from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import IO, Iterable

__all__ = ["ANONYMOUS", "Binding", "Bindings", "COMMAND_SCOPE", "FLEET", "KEY_MAX", "SHARED",
           "binding_refusal", "command_refusal", "fleet_refusal", "is_credential", "is_verified",
           "key", "named"]

log = logging.getLogger("aep.relay")

FLEET = "fleet"
SHARED = "token"
ANONYMOUS = "anonymous"
_NAMED = "emitter:"
#: the longest session id or source the table and the journal keep
#: verbatim (:func:`key`)
KEY_MAX = 256


def named(name: str) -> str:
    """The principal of the per-emitter credential ``name``."""
    return _NAMED + name


def is_credential(principal: str) -> bool:
    """Whether ``principal`` is a per-emitter credential's (:func:`named`):
    the one kind of sender whose commands are scoped (:func:`command_refusal`)."""
    return principal.startswith(_NAMED)


#: the ``detail`` of a command a per-emitter credential may not send
#: (:func:`command_refusal`): the same whether the session is unbound or
#: bound to another principal, so a refusal says nothing of whose it is
COMMAND_SCOPE = ("a per-emitter credential commands only its own sessions "
                 "(AEP-0004 §4.3); this session is not bound to it")


def command_refusal(sender: str, bound: str | None) -> str | None:
    """Per-sender scoping of commands at the relay (AEP-0004 §4.3 item 3,
    "who may command whom is deployment-owned authorization", surfaced as
    ``unauthorized``; issue 25). Pure: why a command from ``sender`` (the
    sending connection's principal) may not be routed into a session bound
    to ``bound`` (``None``: unbound), or ``None`` when it may.

    - a per-emitter credential (``emitter:<name>``) commands only sessions
      bound to that same credential: not another credential's, not the
      fleet's, not a shared-token emitter's, and not an unbound session (a
      credential has no claim to a session nobody bound; its own sessions
      are bound by its first event in them, :meth:`Bindings.bind`);
    - the shared ``AEP_TOKEN`` (the operator, the console) and the fleet
      command every session, as before: the shared token is every party
      of one deployment, so it cannot be scoped (the stated limit:
      per-emitter credentials are what scoping applies to);
    - an unauthenticated sender never gets here (AEP-0004 §4.1 refuses it
      first)."""
    if not is_credential(sender) or bound == sender:
        return None
    return COMMAND_SCOPE


def is_verified(principal: str) -> bool:
    """Whether ``principal`` is verified per party (the fleet or a
    per-emitter credential): its bindings never expire."""
    return principal == FLEET or principal.startswith(_NAMED)


def binding_refusal(bound: str, bound_source: str, principal: str, source: str,
                    free: bool) -> str | None:
    """The rule of the module docstring for one bound session (pure):
    why ``principal`` under ``source`` may not claim a session bound to
    ``bound`` under ``bound_source``, or ``None``. ``free``: no claimant
    is connected and the grace since the last one left has passed (only
    read for a shared-principal binding)."""
    if bound == FLEET:
        return "this session belongs to a bridge of this daemon"
    verified = is_verified(bound)
    if bound == principal and (verified or bound_source == source):
        return None
    if verified:
        return "this session is bound to another emitter credential"
    if free:
        return None  # the shared principal's claim expired
    return ("this session is held for the emitter that claimed it (under another source) "
            "while it is connected and for AEP_CLAIM_GRACE seconds after it left")


def fleet_refusal(bound: str, free: bool) -> str | None:
    """The fleet's rule of the module docstring (pure): why a fleet bridge
    may not emit into a session bound to ``bound``, or ``None`` (its own;
    the shared or anonymous principal's once ``free``: taken back). A
    per-emitter credential's session is never the fleet's to take; a
    shared or anonymous one only when it is free by the rule any other
    claimant meets (``free``: no remote claimant connected and
    ``AEP_CLAIM_GRACE`` passed since the last one left)."""
    if bound == FLEET:
        return None
    if is_verified(bound):
        return ("this session is bound to a per-emitter credential; a bridge of this daemon "
                "never takes it")
    if free:
        return None
    return ("this session is held for the emitter that claimed it with the shared token "
            "while it is connected and for AEP_CLAIM_GRACE seconds after it left; a bridge "
            "of this daemon takes it only then")


class Binding:
    """One session's owner: ``principal``, the first claimant's ``source``,
    and ``seen`` (trio clock seconds) when a claimant was last known live;
    ``open``: a :data:`FLEET` binding an open bridge made (the module
    docstring: evicted before any verified binding)."""

    __slots__ = ("principal", "source", "seen", "open", "tick")

    def __init__(self, principal: str, source: str, seen: float, open_: bool = False) -> None:
        self.principal = principal
        self.source = source
        self.seen = seen
        self.open = open_
        #: the table's use counter when last bound or refreshed (recency
        #: across principals without scanning the table)
        self.tick = 0

    @property
    def named(self) -> bool:
        """Whether the principal is verified per party (the fleet or a
        per-emitter credential), so the binding never expires."""
        return is_verified(self.principal)


class Bindings:
    """The session -> :class:`Binding` table (see the module docstring).
    ``cap``: bindings kept; ``grace_s``: how long a shared-principal
    session stays held once its last claimant left."""

    def __init__(self, cap: int, grace_s: float) -> None:
        self.cap = cap
        self.grace_s = grace_s
        self._map: OrderedDict[str, Binding] = OrderedDict()
        #: the shared principal's sessions, least recently used first (evicted first)
        self._shared: OrderedDict[str, None] = OrderedDict()
        #: each principal's sessions, least recently used first (the shared
        #: and anonymous principals' together: :attr:`_shared`; the open
        #: bridges' fleet bindings apart: :attr:`_open`)
        self._own: dict[str, OrderedDict[str, None]] = {}
        #: the open bridges' fleet bindings, least recently used first
        self._open: OrderedDict[str, None] = OrderedDict()
        self._journal: IO[str] | None = None
        self._path: Path | None = None
        self._appended = 0
        self._ticks = 0

    def __len__(self) -> int:
        return len(self._map)

    def get(self, session: str) -> Binding | None:
        return self._map.get(key(session))

    def refusal(self, session: str, principal: str, source: str, now: float,
                live: bool) -> str | None:
        """Why ``principal`` (under ``source``) may not claim ``session``,
        or ``None`` when it may (then :meth:`bind`). ``live``: whether a
        connected party claims the session now."""
        b = self._map.get(key(session))
        if b is None:
            return None
        return binding_refusal(b.principal, b.source, principal, key(source),
                               free=not live and now - b.seen >= self.grace_s)

    def bind(self, session: str, principal: str, source: str, now: float) -> None:
        """``principal`` claims ``session`` (allowed by :meth:`refusal`):
        bound to it (journaled when new or changed), marked live ``now``."""
        session, source = key(session), key(source)
        b = self._map.get(session)
        if b is not None and b.principal == principal and (b.named or b.source == source):
            b.seen = now
            self._refresh(session, b)
            return
        self._set(session, Binding(principal, source, now))

    def fleet_refusal(self, session: str, now: float, live: bool) -> str | None:
        """Why a fleet bridge may not emit into ``session``
        (:func:`fleet_refusal`: a per-emitter credential holds it, or the
        shared principal while ``live``, a remote claimant connected, or
        within the grace), or ``None``."""
        b = self._map.get(key(session))
        if b is None:
            return None
        return fleet_refusal(b.principal, free=not live and now - b.seen >= self.grace_s)

    def bind_fleet(self, session: str, source: str, now: float, open_: bool = False) -> bool:
        """A fleet bridge claims ``session`` (allowed by
        :meth:`fleet_refusal`): bound to :data:`FLEET`, taken back from the
        shared or anonymous principal. ``open_``: the bridge is an open one
        (the module docstring); an authenticated bridge's claim of an open
        bridge's binding makes it an authenticated one. Returns whether it
        was bound to someone else (the caller drops that party's claim). A
        session a per-emitter credential holds is left to it (``False``,
        nothing bound: the caller refused the event already)."""
        session = key(session)
        b = self._map.get(session)
        if b is not None and b.principal == FLEET:
            b.seen = now
            if b.open and not open_:
                self._set(session, Binding(FLEET, b.source, now))
            else:
                self._refresh(session, b)
            return False
        if b is not None and fleet_refusal(b.principal, free=True) is not None:
            return False
        self._set(session, Binding(FLEET, key(source), now, open_))
        return b is not None

    def touch(self, sessions: Iterable[str], now: float) -> None:
        """Mark ``sessions`` live ``now``: their claimant left or they were
        posted into, so the grace counts from here."""
        m = self._map
        for s in sessions:
            b = m.get(key(s))
            if b is not None:
                b.seen = now

    def _set(self, session: str, b: Binding) -> None:
        self._put(session, b)
        self._trim(b.principal if b.named else None, b.open)
        if session in self._map:  # (an open bridge's only binding in a full table: not kept)
            self._append(session, b)

    def _order(self, b: Binding) -> OrderedDict[str, None]:
        if b.open:
            return self._open
        return self._own.setdefault(b.principal, OrderedDict()) if b.named else self._shared

    def _refresh(self, session: str, b: Binding) -> None:
        self._map.move_to_end(session)
        self._order(b).move_to_end(session)
        self._ticks += 1
        b.tick = self._ticks

    def _put(self, session: str, b: Binding) -> None:
        old = self._map.get(session)
        if old is not None:
            self._forget_order(session, old)
        self._map[session] = b
        self._map.move_to_end(session)
        self._order(b)[session] = None
        self._ticks += 1
        b.tick = self._ticks

    def _forget_order(self, session: str, b: Binding) -> None:
        order = self._order(b)
        order.pop(session, None)
        if not order and b.named and not b.open:
            del self._own[b.principal]

    def _evict(self, session: str) -> None:
        self._forget_order(session, self._map.pop(session))

    def _trim(self, principal: str | None = None, open_: bool = False) -> None:
        """Within ``cap`` (the module docstring): for an open bridge's new
        binding (``open_``), the open kind's least recently used (the new
        one itself when it is the only one); else the open kind's first for
        an authenticated bridge's (``principal`` :data:`FLEET`), then
        ``principal``'s (a verified one that just bound; ``None`` for the
        shared principal's, at :meth:`open`) least recently used while it
        holds another, then the shared principal's, then the open kind's,
        then the least recently used verified one, the fleet's last."""
        m, shared, opened = self._map, self._shared, self._open
        while len(m) > self.cap:
            own = self._own.get(principal) if principal is not None else None
            if open_ or (principal == FLEET and opened):
                self._evict(next(iter(opened)))
            elif own is not None and len(own) > 1:
                self._evict(next(iter(own)))
            elif shared:
                self._evict(next(iter(shared)))
            elif opened:
                self._evict(next(iter(opened)))
            else:
                victim = self._oldest_credential()
                self._evict(victim if victim is not None else next(iter(m)))

    def _oldest_credential(self) -> str | None:
        """The least recently used session of any verified principal but
        the fleet, from each principal's own order (as many steps as there
        are principals: a table full of the fleet's bindings used to be
        scanned whole for each eviction, minutes at start after a flood)."""
        m, best, best_tick = self._map, None, 0
        for principal, order in self._own.items():
            if principal == FLEET or not order:
                continue
            s = next(iter(order))
            tick = m[s].tick
            if best is None or tick < best_tick:
                best, best_tick = s, tick
        return best

    # -- the journal -----------------------------------------------------------------
    def open(self, path: Path, now: float) -> int:
        """Load the journal at ``path`` (the last line of each session
        wins; unreadable lines skipped), compact it and append to it from
        now on. Every binding read is marked live ``now``. Returns how many
        were loaded. An unwritable journal is logged and the table stays
        in memory."""
        loaded: OrderedDict[str, Binding] = OrderedDict()
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    got = _parse(line)
                    if got is not None:
                        loaded.pop(got[0], None)
                        loaded[got[0]] = Binding(got[1], got[2], now, got[3])
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("relay: session bindings not read (%s)", type(e).__name__)
        for s, b in self._map.items():  # made before the journal was opened
            loaded.pop(s, None)
            loaded[s] = b
        self._map, self._shared, self._own = OrderedDict(), OrderedDict(), {}
        self._open = OrderedDict()
        for s, b in loaded.items():
            self._put(s, b)
        self._trim()
        self._path = Path(path)
        self._compact()
        return len(self._map)

    def _compact(self) -> None:
        """Rewrite the journal as the table (atomically), then append to it."""
        assert self._path is not None
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        tmp = self._path.with_name(self._path.name + ".tmp")
        try:
            # a fresh file of our own: never a planted symlink's target, never
            # a leftover's mode (O_EXCL fails on either; unlinked first)
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.writelines(_line(s, b) for s, b in self._map.items())
            os.replace(tmp, self._path)
            self._journal = open(self._path, "a", encoding="utf-8")  # noqa: SIM115 -- kept open
        except OSError as e:
            log.warning("relay: session bindings journal unwritable (%s); bindings are kept "
                        "in memory only", type(e).__name__)
            self._path = None
        self._appended = 0

    def _append(self, session: str, b: Binding) -> None:
        f = self._journal
        if f is None:
            return
        try:
            f.write(_line(session, b))
            f.flush()  # before the event it binds is admitted: a kill keeps it
        except OSError as e:
            log.warning("relay: session binding not journaled (%s)", type(e).__name__)
            return
        self._appended += 1
        if self._appended > 2 * len(self._map) + 1024:
            self._compact()

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None


def key(value: str) -> str:
    """The table's and the journal's key for a session id or a source:
    ``value`` itself when at most :data:`KEY_MAX` characters, else its
    first ``KEY_MAX - 64`` characters, ``#`` and the SHA-256 of its UTF-8
    (one character longer than :data:`KEY_MAX`, so never a verbatim
    value's key). The session log names a long id's file by a digest too
    (:func:`supervisor.sessionlog.jsonlog.safe_name`); here a 100,000
    character hook session id made one journal line of 311 KB (outside
    review of issue 25)."""
    if len(value) <= KEY_MAX:
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
    return value[:KEY_MAX - 64] + "#" + digest


def _line(session: str, b: Binding) -> str:
    v: dict[str, object] = {"s": session, "p": b.principal, "src": b.source}
    if b.open:
        v["o"] = 1
    return json.dumps(v, ensure_ascii=True, separators=(",", ":")) + "\n"


def _parse(line: str) -> tuple[str, str, str, bool] | None:
    try:
        v = json.loads(line)
    except ValueError:
        return None
    if not isinstance(v, dict):
        return None
    s, p, src = v.get("s"), v.get("p"), v.get("src")
    if isinstance(s, str) and isinstance(p, str) and isinstance(src, str) and s and p:
        # a key as written (:func:`key`: at most KEY_MAX + 1 characters), or
        # an id of a journal written before keys were bounded; "o": an
        # open bridge's fleet binding (a line from before kinds: authenticated)
        return (s if len(s) <= KEY_MAX + 1 else key(s), p,
                src if len(src) <= KEY_MAX + 1 else key(src), p == FLEET and v.get("o") == 1)
    return None

