"""Delivery out of the process, one bridge at a time: with ``AEP_UPLINK``
each bridge's events leave through its own :mod:`.uplink` (an AEP emitter
connection to a remote relay's ``/socket``: hello, the events in order,
acks, reconnects with backoff, the commands routed back to the bridge)
from a bounded :mod:`.outbox` (:class:`Outbox`: the AEP-0003 §8.4
shedding order, lowest severity first, never a notice or above; pure, no
I/O). The JetStream path past one machine (:mod:`supervisor.jetstream`)
reuses the same outbox. :mod:`.uplink` is imported only when an uplink is
configured (it loads the WebSocket client), so this ``__init__`` loads
the outbox alone.
"""
from .outbox import Entry, Outbox

__all__ = ["outbox", "uplink", "Entry", "Outbox"]
