"""The command ledger (AEP-0004 §2.3, §3, §4.2, §7; shared/DESIGN.md "The
command ledger is shared"; the "Ack discipline: REST-settled" sections of
``docs/bridge-openhands-design.md`` and ``docs/adapter-opencode-design.md``).

One ledger per run of a bridge, built by the fleet only
(``supervisor.fleet.run_bridge``) around the run's
:class:`bridges.core.control.Controller` (or none: then every command is
nacked ``unsupported``). For every command envelope routed to the bridge,
:meth:`CommandLedger.handle` makes exactly one ack decision and emits it as
``control.accepted`` / ``control.rejected`` in the command's target session
(``cause`` = command id, ``run`` copied from the command), within the
declared ack window.

Usage (the ledger owns a nursery for writes that outlive the guard, so it is
an async context manager)::

    async with CommandLedger(ctx, controller) as ledger:
        await ledger.serve(ctx.commands)      # one decision task per command
        # or, one task per command, concurrently:
        ack = await ledger.handle(cmd)

The controller's steps (see :mod:`bridges.core.control`): ``check(cmd) ->
plan`` (sync or async, under the guard deadline; a check still running at
the deadline is cancelled and nacked ``busy``; :class:`Refuse` or any
exception means nothing is written); ``note(plan) -> undo | None`` (sync,
right before the write starts; ``undo`` is called exactly once if the
command ends rejected, or if a write that outlived the guard, already acked
``accepted``, later fails: a stale note must not mislink a later, unrelated
outcome); ``perform(plan) -> WriteResult`` (async, in the ledger's nursery
so it can outlive the guard). A :class:`WriteResult` may carry
``after_ack``: run once the accepted ack is out (exceptions are logged and
counted, never change the decision).

Counters (in ``ctx.health.counters``): ``control_commands``,
``control_accepted``, ``control_rejected``, ``control_redelivered`` (a
recorded ack re-sent), ``control_inflight_duplicates`` (a duplicate answered
by the forthcoming ack), ``control_malformed`` (no ``id``/``session``: no ack
possible), ``control_guard_expired``, ``control_late_write_failed``,
``control_callback_errors``, ``control_overload``.
"""
from __future__ import annotations

import copy
import inspect
import logging
from collections import OrderedDict
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import trio

from .aep import ACK_WINDOW_MS
from .control import Command, Controller, Refuse, Unreachable
from .control import WriteResult as WriteResult  # where the controllers and tests have always found it

if TYPE_CHECKING:
    from .bridge import BridgeContext, ControlDeclaration, Emission, Envelope

log = logging.getLogger("aep.core.ledger")


DETAIL_MAX = 500
"""Characters kept of a nack ``detail`` (a vendor error page can be large);
the stamper's capture gate decides whether it leaves at all (``redacted``)."""


@dataclass
class _Record:
    """Dedupe state of one command: ``ack`` is ``None`` while the decision is
    pending, then a private deep copy of the ack envelope as emitted."""

    ack: dict[str, Any] | None = None


@dataclass
class _Decision:
    accepted: bool
    reason: str | None = None
    detail: str | None = None
    code: str | None = None  # :attr:`Refuse.code`: ``data.code`` (metadata)


@dataclass
class _Write:
    """One ``perform`` running in the ledger's nursery: its outcome, and
    whether it outlived the guard (``late``: its ack went out ``accepted``
    before it returned)."""

    done: trio.Event = field(default_factory=trio.Event)
    acked: trio.Event = field(default_factory=trio.Event)
    late: bool = False
    ack_out: bool = False
    result: Any = None
    error: BaseException | None = None
    undo: Callable[[], None] | None = None


def _clip(detail: str | None) -> str | None:
    if detail is None:
        return None
    detail = str(detail).strip()
    if not detail:
        return None
    return detail if len(detail) <= DETAIL_MAX else detail[:DETAIL_MAX - 1] + "\u2026"


class CommandLedger:
    """Dedupe + one ack decision per command + byte-identical re-ack.

    ``CommandLedger(ctx, controller=None, *, retain=10000, max_pending=256)``:

    - ``ctx``: the bridge's :class:`bridges.core.bridge.BridgeContext`; acks
      go out through ``ctx.emit`` (first decision) and ``ctx.redeliver``
      (byte-identical re-send).
    - ``controller``: the run's :class:`bridges.core.control.Controller`;
      its ``accepts`` is the bridge's declared ``control.accepts``
      (AEP-0004 §4.2; authoritative), ``ack_window_ms`` the window declared
      at ``hello`` (> 0), ``guard_ms`` the REST-settled ack guard
      (``*_ACK_GUARD_MS``), clamped to ``[0, ack_window_ms * 4 // 5]`` so at
      least a fifth of the window is left to stamp and deliver the ack. The
      guard clock starts when :meth:`handle` is called and covers ``check``
      and ``perform``. ``None``: accepts nothing, every command is nacked
      ``unsupported`` (window :data:`ACK_WINDOW_MS`).
    - ``retain``: decided commands remembered for dedupe (LRU: a redelivery
      refreshes its entry). The recorded ack lives exactly as long as the
      dedupe entry (AEP-0004 §3); a forgotten command's redelivery is a new
      command.
    - ``max_pending``: concurrent undecided commands; past it a new command
      is nacked ``busy`` at once (bounded memory under a command flood).

    Raises ``ValueError`` for a window <= 0 or ``retain``/``max_pending`` < 1.
    Must be entered (``async with ledger:``) before :meth:`handle`: the
    context owns the nursery in which writes keep running past the guard.
    Leaving the context cancels writes still running (the bridge is
    stopping; their acks already went out as ``accepted`` = will-try).

    ``ledger.declaration`` is the ``hello`` ``capabilities.control`` block:
    ``{"accepts": [...], "ack_window_ms": N}``.

    Acks are emitted with ``await ctx.emit``; when the fleet's relay channel
    is saturated that wait counts against the window (the channel is the
    fleet's backpressure, not the ledger's)."""

    def __init__(self, ctx: BridgeContext, controller: Controller[Any] | None = None, *,
                 retain: int = 10000, max_pending: int = 256) -> None:
        window = controller.ack_window_ms if controller is not None else ACK_WINDOW_MS
        if window <= 0:
            raise ValueError("ack_window_ms must be > 0")
        if retain < 1 or max_pending < 1:
            raise ValueError("retain and max_pending must be >= 1")
        self.ctx = ctx
        self.controller = controller
        self.accepts: tuple[str, ...] = tuple(controller.accepts) if controller is not None else ()
        self.ack_window_ms = int(window)
        guard = controller.guard_ms if controller is not None else 0
        self.guard_ms = max(0, min(int(guard), self.ack_window_ms * 4 // 5))
        self.retain = retain
        self.max_pending = max_pending
        self._records: OrderedDict[tuple[Any, str], _Record] = OrderedDict()
        self._pending = 0
        self._nursery: trio.Nursery | None = None
        self._nursery_cm: AbstractAsyncContextManager[trio.Nursery] | None = None

    # -- lifecycle -------------------------------------------------------
    async def __aenter__(self) -> "CommandLedger":
        if self._nursery is not None:
            raise RuntimeError("CommandLedger entered twice")
        cm = self._nursery_cm = trio.open_nursery()
        self._nursery = await cm.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        assert self._nursery is not None and self._nursery_cm is not None
        self._nursery.cancel_scope.cancel()  # lingering writes: see class doc
        try:
            # The ledger's tasks never raise (they catch and count), so the
            # body's own exception is passed through unwrapped instead of as
            # an ExceptionGroup from the nursery.
            await self._nursery_cm.__aexit__(None, None, None)
        finally:
            self._nursery = None
            self._nursery_cm = None
        return False

    @property
    def declaration(self) -> ControlDeclaration:
        """``hello.capabilities.control`` (AEP-0003 §4)."""
        return {"accepts": list(self.accepts), "ack_window_ms": self.ack_window_ms}

    def __len__(self) -> int:
        """Commands currently remembered (pending + decided)."""
        return len(self._records)

    def recorded(self, source: object, cmd_id: str) -> dict[str, Any] | None:
        """The recorded ack for ``(source, id)``, a copy, or ``None`` (unknown
        or still pending). For diagnostics and tests."""
        rec = self._records.get((source, cmd_id))
        return copy.deepcopy(rec.ack) if rec and rec.ack is not None else None

    # -- the inbox loop --------------------------------------------------
    async def serve(self, commands: trio.MemoryReceiveChannel[Command]) -> None:
        """Read ``commands`` (normally ``ctx.commands``) until it closes and
        run :meth:`handle` for each in its own task in the ledger's nursery
        (so a slow write never delays the next command's decision, and a
        duplicate really can arrive mid-decision). Returns when the inbox
        closes; decisions still running finish in the ledger's nursery."""
        nursery = self._require_nursery()
        async for cmd in commands:
            nursery.start_soon(self._handle_quiet, cmd)

    async def _handle_quiet(self, cmd: Command) -> None:
        try:
            await self.handle(cmd)
        except Exception:  # a ledger bug must not take the bridge down
            log.exception("%s: command handling failed", self.ctx.name)
            self.ctx.health.count("control_errors")

    # -- one command -----------------------------------------------------
    async def handle(self, cmd: Command) -> Envelope | None:
        """Make (or recall) the one ack decision for ``cmd``; returns the ack
        envelope as sent, or ``None`` when no ack goes out (a duplicate that
        arrived mid-decision, or a command with no string ``id`` / no
        ``session`` to ack in: counted ``control_malformed``).

        Order: (1) dedupe on ``(cmd.source, cmd.id)``: a decided command gets
        its recorded ack re-sent via ``ctx.redeliver`` (same ``id``, same
        ``epoch``/``seq``) and is returned; a pending one gets nothing;
        (2) ``cmd.type`` not in ``accepts`` -> ``control.rejected``
        ``unsupported``; (3) ``plan = check(cmd)`` may raise :class:`Refuse`
        (any other exception -> ``invalid``, logged); (4) ``note(plan)``;
        (5) ``perform(plan)`` under the guard: 2xx -> accepted; other
        non-5xx -> ``refused`` with ``HTTP {status}: {detail}``; 5xx,
        :class:`Unreachable` or an unexpected exception -> ``busy``;
        :class:`Refuse` -> its reason; still running at the guard deadline ->
        accepted (the write keeps running in the ledger's nursery; its
        outcome arrives as observed vendor events); (6) the ack, then the
        write's ``after_ack``. Raises ``RuntimeError`` outside ``async with``.

        Cancellation before the decision forgets the command (its
        redelivery is then a new command)."""
        nursery = self._require_nursery()
        self.ctx.health.count("control_commands")
        key = self._key(cmd)
        if key is None:
            self.ctx.health.count("control_malformed")
            log.warning("%s: command without id/session, no ack possible", self.ctx.name)
            return None
        rec = self._records.get(key)
        if rec is not None:
            return await self._again(key, rec)

        rec = _Record()
        self._records[key] = rec
        self._pending += 1
        decided = False
        write: _Write | None = None
        # an outcome the vendor reports before the write returns waits for the ack
        self.ctx.hold_outcomes(key[1])
        try:
            deadline = trio.current_time() + self.guard_ms / 1000
            if self._pending > self.max_pending:
                self.ctx.health.count("control_overload")
                decision = _Decision(False, "busy", "too many commands pending")
            else:
                decision, write = await self._decide(cmd, nursery, deadline)
            if not decision.accepted and write is not None and write.undo is not None:
                self._call_undo(write.undo)
            ack = await self._emit_ack(cmd, decision)
            rec.ack = copy.deepcopy(ack)
            decided = True
            self._evict()
        finally:
            self._pending -= 1
            self.ctx.release_outcomes(key[1])
            if not decided:
                self._records.pop(key, None)
            if write is not None:  # a late write's after_ack waits for this
                write.ack_out = decided
                write.acked.set()
        if write is not None:
            if decision.accepted and not write.late:
                await self._after_ack(cmd, write.result)
        return ack

    # -- internals -------------------------------------------------------
    def _require_nursery(self) -> trio.Nursery:
        if self._nursery is None:
            raise RuntimeError("use `async with CommandLedger(...)` before handling commands")
        return self._nursery

    @staticmethod
    def _key(cmd: Any) -> tuple[Any, str] | None:
        """The dedupe key ``(source, id)``, or ``None`` when no ack is
        possible (no string ``id`` or ``session``)."""
        if not isinstance(cmd, dict):
            return None
        cmd_id, session = cmd.get("id"), cmd.get("session")
        if not isinstance(cmd_id, str) or not cmd_id or not isinstance(session, str) or not session:
            return None
        return cmd.get("source"), cmd_id

    async def _again(self, key: tuple[Any, str], rec: _Record) -> dict[str, Any] | None:
        """A delivery of a known command: the recorded ack again, or nothing
        while the decision is pending (§3: the one forthcoming ack answers
        every delivery)."""
        if rec.ack is None:
            self.ctx.health.count("control_inflight_duplicates")
            return None
        self._records.move_to_end(key)
        again = copy.deepcopy(rec.ack)
        self.ctx.health.count("control_redelivered")
        await self.ctx.redeliver(again)
        return again

    async def _decide(self, cmd: dict[str, Any], nursery: trio.Nursery,
                      deadline: float) -> tuple[_Decision, _Write | None]:
        """Steps 2-5 of :meth:`handle`: the decision, and the write (with the
        note's undo) when one was started."""
        controller = self.controller
        if controller is None or cmd.get("type") not in self.accepts:
            return _Decision(False, "unsupported", f"{cmd.get('type')!s} is not accepted"), None
        planned = await self._check(controller, cmd, deadline)
        if isinstance(planned, _Decision):
            return planned, None
        plan = planned[0]
        write = _Write()
        try:
            write.undo = controller.note(plan)
        except Refuse as r:
            return _Decision(False, r.reason, r.detail, r.code), None
        except Exception as e:
            log.exception("%s: note failed for %s", self.ctx.name, cmd.get("id"))
            return _Decision(False, "invalid", type(e).__name__), None
        # The write runs in the ledger's nursery, not under this task's
        # cancel scope, so the guard can expire without cancelling it.
        nursery.start_soon(self._perform, controller, cmd, plan, write)
        with trio.move_on_at(deadline):
            await write.done.wait()
        if not write.done.is_set():
            write.late = True
            self.ctx.health.count("control_guard_expired")
            return _Decision(True), write
        return self._verdict(cmd, write), write

    async def _check(self, controller: Controller[Any], cmd: dict[str, Any],
                     deadline: float) -> tuple[Any] | _Decision:
        """``(plan,)`` from ``controller.check``, or the nack decision."""
        refused: _Decision | None = None
        plan: Any = None
        with trio.move_on_at(deadline) as cs:
            try:
                plan = controller.check(cmd)
                if inspect.isawaitable(plan):
                    plan = await plan
            except Refuse as r:
                refused = _Decision(False, r.reason, r.detail, r.code)
            except Exception as e:
                log.exception("%s: check failed for %s", self.ctx.name, cmd.get("id"))
                refused = _Decision(False, "invalid", type(e).__name__)
        if cs.cancelled_caught:
            return _Decision(False, "busy", "check did not settle within the ack guard")
        return refused if refused is not None else (plan,)

    async def _perform(self, controller: Controller[Any], cmd: dict[str, Any], plan: Any,
                       write: _Write) -> None:
        try:
            write.result = await controller.perform(plan)
        except Exception as e:  # Cancelled (BaseException) propagates
            write.error = e
        finally:
            write.done.set()
        if write.late:
            await self._settle_late(cmd, write)

    def _verdict(self, cmd: dict[str, Any], write: _Write) -> _Decision:
        err = write.error
        if isinstance(err, Refuse):
            return _Decision(False, err.reason, err.detail, err.code)
        if isinstance(err, Unreachable):
            return _Decision(False, "busy", str(err) or "vendor unreachable")
        if err is not None:
            log.error("%s: write failed for %s: %s", self.ctx.name, cmd.get("id"),
                      type(err).__name__, exc_info=err)
            return _Decision(False, "busy", type(err).__name__)
        status = getattr(write.result, "status", None)
        if not isinstance(status, int):
            log.error("%s: write returned %r, not a WriteResult", self.ctx.name,
                      type(write.result).__name__)
            return _Decision(False, "busy", "write returned no status")
        if 200 <= status < 300:
            return _Decision(True)
        detail = getattr(write.result, "detail", None)
        text = f"HTTP {status}: {detail}" if detail else f"HTTP {status}"
        if status >= 500:
            return _Decision(False, "busy", text)
        return _Decision(False, "refused", text)

    async def _settle_late(self, cmd: dict[str, Any], write: _Write) -> None:
        """A write that outlived the guard finished; its command was (or is
        being) acked ``accepted``. Success runs its ``after_ack`` once the ack
        is out (the rest of the outcome arrives as vendor events); failure
        undoes the pending note and is counted."""
        verdict = self._verdict(cmd, write)
        if verdict.accepted:
            await write.acked.wait()
            if write.ack_out:  # never an outcome for a command left unacked
                await self._after_ack(cmd, write.result)
            return
        self.ctx.health.count("control_late_write_failed")
        log.warning("%s: write for %s failed after its accepted ack (%s)",
                    self.ctx.name, cmd.get("id"), verdict.reason)
        if write.undo is not None:
            self._call_undo(write.undo)

    async def _after_ack(self, cmd: dict[str, Any], result: Any) -> None:
        after = getattr(result, "after_ack", None)
        if after is None:
            return
        try:
            await after()
        except Exception:
            log.exception("%s: after_ack failed for %s", self.ctx.name, cmd.get("id"))
            self.ctx.health.count("control_callback_errors")

    def _call_undo(self, undo: Callable[[], None]) -> None:
        try:
            undo()
        except Exception:
            log.exception("%s: undo failed", self.ctx.name)
            self.ctx.health.count("control_callback_errors")
    async def _emit_ack(self, cmd: Command, decision: _Decision) -> Envelope:
        emission: Emission
        if decision.accepted:
            emission = {"type": "control.accepted", "data": {}}
            self.ctx.health.count("control_accepted")
        else:
            data: dict[str, Any] = {"reason": decision.reason}
            detail = _clip(decision.detail)
            if detail is not None:
                data["detail"] = detail
            if decision.code is not None:
                data["code"] = decision.code
            emission = {"type": "control.rejected", "data": data}
            self.ctx.health.count("control_rejected")
        run = cmd.get("run")
        return await self.ctx.emit(cmd["session"], emission, cause=cmd["id"],
                                   run=run if isinstance(run, str) else None)

    def _evict(self) -> None:
        """Forget the least recently used *decided* commands beyond
        ``retain``; pending ones are never evicted (bounded by
        ``max_pending`` instead)."""
        excess = len(self._records) - self.retain
        if excess <= 0:
            return
        doomed = []
        for key, rec in self._records.items():  # oldest first
            if rec.ack is not None:
                doomed.append(key)
                if len(doomed) == excess:
                    break
        for key in doomed:
            del self._records[key]
