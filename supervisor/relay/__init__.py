"""The embedded AEP relay (AEP-0003 bindings, AEP-0004 §4 command routing)
in the reference relay's frozen ceiling: ingest, attr-match fan-out, bounded
replay, token auth; plus the roster frame (AEP-0003 §4.1).

Public API (what the daemon uses):

- ``Relay(token=None, buffer=10000, max_sessions=500, max_body=16 MiB,
  max_batch=10000, max_from=None, *, heartbeat_s=15.0, ws_ping_s=30.0,
  ws_timeout_s=90.0, queue_soft_bytes=1 MiB, queue_hard_bytes=8 MiB,
  max_subscriptions=64, sse_linger_s=0.001, instance=None,
  cors_origins=None, buffer_bytes=8 MiB, total_bytes=256 MiB)``
  (:mod:`.core`). ``relay.discovery()`` (pure dict), ``relay.stats()``
  (counts for an authorized ``/healthz``), ``relay.roster()``,
  ``await relay.close(reason, grace=2.0)`` (``: shutting-down`` + clean end
  on every SSE stream, ``closing`` + close 1001 on every WebSocket, in-process
  connections closed, stragglers aborted after ``grace``).
- ``conn = relay.attach_emitter(hello, deliver, *, open_sessions=False,
  source_base=None)``: an in-process emitter connection
  (:class:`LocalEmitter`; ``open_sessions``: its session ids come from
  unauthenticated senders, so its buffers are the open kind of
  :mod:`.pins`; ``source_base``: every source at or under it is the
  fleet's, :mod:`.fleetsources`), the same
  :class:`~.connections.Connection` family as a remote WebSocket emitter.
  ``await conn.ingest(event)`` validates, claims the session, buffers, fans
  out (raises :class:`InvalidEvent`, :class:`RelayClosed`,
  :class:`CommandRefused`); commands routed to its sessions are awaited
  into ``deliver(cmd)``; ``conn.close()`` drops its claims. Counts as
  authenticated iff the relay has a token.
- ``make_app(relay, *, healthz=None)`` (:mod:`.app`): the ASGI app
  (``POST/GET /events``, ``GET /.well-known/aep``, ``GET /stream``,
  ``GET /socket``, ``GET /healthz``), with the browser guards (CORS only
  for ``cors_origins``, WebSocket ``Origin`` check, the DNS-rebinding
  ``Host`` check on loopback listeners; :mod:`.app` "Browsers").
- ``await serve_relay(relay, (host, port) | socket, *, healthz, shutdown,
  reason, graceful_timeout, task_status)`` (:mod:`.serve`): the app served
  by :func:`bridges.core.http.serve_app` (hypercorn's trio worker with a
  per-connection abort handle, so a consumer that stopped reading can
  always be shed, §8.4, and shutdown stays bounded; a fault barrier; HTTP/1.1
  only), then the relay's orderly close.
- For a subclass that swaps the store (the JetStream relay,
  :mod:`supervisor.jetstream.relay`): the connection family
  (:class:`Connection`, :class:`SocketConnection`, the :class:`TooLarge` and
  :class:`Unavailable` refusals), the buffered :class:`Entry` and its
  :data:`Position`, :func:`trusted_entry`, the outlet's :class:`Outlet`,
  :class:`Subscriber`, :data:`OPEN` and :func:`frame_text`, and
  :func:`exhausted_marker`.

Modules, one concern each (the layering: this package uses
:mod:`bridges.core` and nothing else of ``supervisor``):

- pure: :mod:`.attrmatch` (filter dialect), :mod:`.envelope` (relay-grade
  envelope validation), :mod:`.capcheck` (data against its declared
  capture), :mod:`.buffer` (session buffers, over :mod:`.entry` (what is
  held of an event), :mod:`.ring` (one buffer) and :mod:`.stamped` (the
  stamped-append fast path)), :mod:`.replay` (replay plans
  and the chunked reader), :mod:`.params` (request parameters),
  :mod:`.lookalike` (names as a person reads them: the Unicode fold and the
  confusables the reserved sources of :mod:`.fleetsources` are read with);
- state: :mod:`.outlet` (a consumer's bounded queue, one dataclass per
  queued item), :mod:`.fanout` (live subscriptions), :mod:`.connections`
  (in-process and WebSocket parties, the claim table), :mod:`.core` (the
  :class:`Relay`, over its mixins :mod:`.ingest` (checks, admission),
  :mod:`.runs` (trusted stamped runs) and :mod:`.routing` (commands));
- transport: :mod:`.app` (HTTP routing, browsers, POST), :mod:`.streams`
  (the SSE and WebSocket pumps), :mod:`.serve`.
"""
from .bindings import (
    FLEET,
    binding_refusal,
    command_refusal,
    fleet_refusal,
    is_credential,
    is_verified,
)
from .buffer import Entry, Position
from .connections import (
    CommandRefused,
    Connection,
    LocalEmitter,
    RelayClosed,
    SocketConnection,
    TooLarge,
    Unavailable,
)
from .core import Relay
from .envelope import InvalidEvent, trusted_entry
from .outlet import OPEN, Outlet, Subscriber, frame_text
from .params import normalize_origin
from .replay import exhausted_marker

__all__ = ["Relay", "LocalEmitter", "CommandRefused", "RelayClosed", "InvalidEvent", "normalize_origin",
           # for a subclass of the relay (supervisor.jetstream.relay)
           "Connection", "SocketConnection", "TooLarge", "Unavailable", "Entry", "Position",
           "trusted_entry", "OPEN", "Outlet", "Subscriber", "frame_text", "exhausted_marker",
           # the session bindings' rule, shared with the JetStream relay's bucket
           "FLEET", "binding_refusal", "fleet_refusal", "is_verified",
           # per-sender scoping of commands (AEP-0004 §4.3), shared likewise
           "command_refusal", "is_credential"]
