"""Where the OpenHands receiver keeps its conversations across a restart
(split from :mod:`bridges.openhands.receiver` by issue 26):
:class:`ConversationStore`, the receiver's base, owns the server's state
document ``{AEP_STATE_DIR}/openhands/<server>.json`` and its journal
(:mod:`bridges.core.statefile`): a conversation's entry loaded at attach,
the one writer task (:meth:`ConversationStore.persist`) that writes every
queued change :data:`STATE_LINGER` later in one journal ``write``, and the
old layout (a file per conversation) carried into the document at the first
load.
"""
from __future__ import annotations

import json
import logging
import re
import urllib.parse
from pathlib import Path
from typing import Any

import trio

from bridges.core.bridge import BridgeContext
from bridges.core.statefile import StateFile

from .conversation import Conversation

log = logging.getLogger("aep.bridge.openhands")

FLUSH_EVERY = 1.0
STATE_LINGER = 0.05
"""Seconds a queued state write waits for more changes (a replay's burst
of frames and status changes becomes one write per conversation); the
window a crash can lose, beside the relay channel's own."""
_STATE_NAME = re.compile(r"[0-9A-Za-z-]+")
"""A conversation id as the old layout named its file (:meth:`Receiver._migrate`)."""
_LEFTOVER = re.compile(r"\.[0-9A-Za-z-]+\.json\..+")
"""A temporary file the old layout's atomic write left behind in a crash."""


def _server_key(url: str) -> str:
    p = urllib.parse.urlsplit(url)
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{p.hostname or 'server'}_{p.port or ''}").strip("_")


class ConversationStore:
    """The receiver's state document (:class:`~bridges.openhands.receiver.Receiver`
    is the one subclass; it owns the attributes below)."""

    ctx: BridgeContext
    conversations: dict[str, Conversation]
    _persisting: bool
    _state_due: dict[str, Conversation]
    _state_wake: trio.Event
    _state: StateFile | None
    _state_open: bool
    _state_dir: Path | None

    # ------------------------------------------------------------------ persistence
    def _opened(self) -> StateFile | None:
        """The server's state document (:mod:`bridges.core.statefile`),
        loaded on first use, the old layout carried into it (:meth:`_migrate`);
        ``None`` without a state directory. Loaded once: a conversation's
        entry is then read from memory at attach (:meth:`_load`), never
        from a file per conversation and poll."""
        st = self._state
        if st is not None and not self._state_open:
            self._state_open = True
            st.load()  # its entries stay in ``st`` as texts; the parsed document is dropped
            self._migrate(st)
        return st

    def _load(self, cid: str) -> Conversation:
        """The conversation as the state document last held it (fresh when
        it holds nothing for ``cid``, or no state directory; an unreadable
        document is one warning and a fresh start, see
        :meth:`StateFile.load`)."""
        st = self._opened()
        return Conversation(cid) if st is None else Conversation.restore(st.entry(cid), cid)

    def _flush(self, conv: Conversation, *, force: bool = False, now: bool = False) -> None:
        """Persist the conversation's state when dirty, at most once per
        :data:`FLUSH_EVERY` seconds unless ``force``. While :meth:`persist`
        runs, the write is queued for it (within :data:`STATE_LINGER`, one
        journal ``write`` for a whole burst of frames and status changes of
        every conversation queued: an entry replaces the last one, so only
        the last state counts); ``now`` (a task's end) or no writer: written
        at once."""
        if not conv.dirty:
            return
        t = trio.current_time()
        if not force and t - conv.last_flush < FLUSH_EVERY:
            return
        conv.dirty = False
        conv.last_flush = t
        if self._state is None:
            return
        if self._persisting and not now:
            self._state_due[conv.id] = conv
            self._state_wake.set()
            return
        self._state_due.pop(conv.id, None)
        self._write_state(conv)

    def _write_state(self, conv: Conversation) -> None:
        """Save the conversation's state now (one journal line)."""
        self._save({conv.id: conv.persisted()})

    def _save(self, changes: dict[str, dict[str, Any] | None]) -> bool:
        """``changes`` (``{cid: Conversation.persisted() or None for
        gone}``) into the state document's journal, one ``write``
        (:meth:`StateFile.save_changes`: entries equal to what is saved are
        skipped; compaction is its own). A failure is counted
        (``state_write_errors``) and logged once by the state file, never
        raised; returns ``False`` then."""
        st = self._opened()
        if st is None or not changes:
            return True
        errors = st.errors
        st.save_changes(changes)
        if st.errors == errors:
            return True
        self.ctx.health.count("state_write_errors", st.errors - errors)
        return False

    def _write_due(self) -> None:
        due, self._state_due = self._state_due, {}
        self._save({cid: conv.persisted() for cid, conv in due.items()})

    async def persist(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The state writer (started by :meth:`run` when there is a state
        directory): writes what :meth:`_flush` queued, :data:`STATE_LINGER`
        after the first of a burst, all of it in one journal ``write``, and
        everything still queued when it is cancelled; runs the state
        document's compactor (:meth:`StateFile.compactor`) beside it. Each
        conversation's own file, replaced whole (a new file and a rename:
        30-800 us of kernel time each on this machine's disk), cost more
        than the conversation's frames (issue 11)."""
        assert self._state is not None
        self._persisting = True
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._state.compactor)
                task_status.started()
                while True:
                    await self._state_wake.wait()
                    await trio.sleep(STATE_LINGER)
                    self._state_wake = trio.Event()
                    self._write_due()
        finally:
            self._persisting = False
            self._write_due()

    def _forget(self, cid: str) -> None:
        """Drop the conversation's entry (it vanished from the server)."""
        self._state_due.pop(cid, None)  # a queued write would bring it back
        self._save({cid: None})

    def _migrate(self, st: StateFile) -> None:
        """Carry the old layout into the document: one file per
        conversation, ``{AEP_STATE_DIR}/openhands/{server}/{cid}.json``.
        Each file is read (an unreadable one is a warning and a fresh
        start, as it was), all of them saved in one journal ``write``, then
        removed with the directory (and any temporary file a crash left).
        A file whose conversation the document already holds was carried
        before (a crash before the removal) and is only removed: the
        document's entry is as new or newer. A failed save removes nothing
        (tried again at the next start)."""
        legacy = self._state_dir
        assert legacy is not None
        try:
            paths = sorted(legacy.iterdir())
        except FileNotFoundError:
            return
        except OSError as e:
            log.warning("old OpenHands state under %s unreadable (%s); not carried over", legacy,
                        e.strerror or type(e).__name__)
            return
        carried: dict[str, dict[str, Any] | None] = {}
        done: list[Path] = []
        for path in paths:
            cid = path.name.removesuffix(".json")
            if _LEFTOVER.fullmatch(path.name):
                done.append(path)
            elif cid != path.name and _STATE_NAME.fullmatch(cid):
                done.append(path)
                if st.entry(cid) is not None:
                    continue
                try:
                    body = json.loads(path.read_text())
                except (OSError, ValueError) as e:
                    log.warning("OpenHands state for %s unreadable (%s); starting fresh", cid,
                                type(e).__name__)
                    continue
                carried[cid] = Conversation.restore(body, cid).persisted()
        if not self._save(carried):
            return
        for path in done:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as e:  # carried again at the next start (the document's entry wins)
                log.warning("cannot remove old OpenHands state file %s (%s)", path,
                            e.strerror or type(e).__name__)
        try:
            legacy.rmdir()
        except OSError:  # something else is in it: left alone
            pass
        log.info("OpenHands state: %d conversation files under %s carried into %s", len(carried),
                 legacy, st.path)
