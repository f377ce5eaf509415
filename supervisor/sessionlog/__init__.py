"""The session log: every stamped event, one JSON line, in one file per
session under the state directory, written before the event goes anywhere
else. :mod:`.jsonlog` is the writer (:class:`SessionLog`: whole lines or
nothing, one ``write`` per session file per batch, an LRU of open
descriptors, torn tails repaired at start); :mod:`.retention` keeps the
directory within its age and size caps (:class:`RetainingSessionLog`, the
``AEP_LOG_*`` settings); :mod:`.spares` makes the empty files a new session
is linked into ahead of time, in a worker thread, so a first line never
waits on a directory write; :mod:`.statelock` holds the state directory for
one daemon at a time; :mod:`.writers` records who wrote each file (the
groups retention shares its cap between). The fleet (:mod:`supervisor.fleet`) owns one log; the
JetStream recovery reads its files. Nothing here knows the relay, the
uplink or a bridge.
"""
from .jsonlog import SessionLog
from .retention import RetainingSessionLog, RetentionPolicy
from .spares import SPARE_DIR, SpareFiles
from .statelock import StateDirBusy, StateLock
from .writers import WriterIndex

__all__ = [
    "jsonlog", "retention", "spares", "statelock", "writers",
    "SessionLog", "RetainingSessionLog", "RetentionPolicy", "SPARE_DIR", "SpareFiles",
    "StateDirBusy", "StateLock", "WriterIndex",
]
