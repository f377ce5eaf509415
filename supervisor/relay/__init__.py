"""The embedded AEP relay (AEP-0003 bindings, AEP-0004 §4 command routing)
in the reference relay's frozen ceiling: ingest, attr-match fan-out, bounded
replay, token auth; plus the roster frame (AEP-0003 §4.1).

Public API (what the daemon uses):

- ``Relay(token=None, buffer=10000, max_sessions=500, max_body=16 MiB,
  max_batch=10000, max_from=None, *, heartbeat_s=15.0, ws_ping_s=30.0,
  ws_timeout_s=90.0, queue_soft_bytes=1 MiB, queue_hard_bytes=8 MiB,
  max_subscriptions=64, sse_linger_s=0.005, instance=None,
  cors_origins=None, buffer_bytes=8 MiB, total_bytes=256 MiB)``
  (:mod:`.core`). ``relay.discovery()`` (pure dict), ``relay.stats()``
  (counts for an authorized ``/healthz``), ``relay.roster()``,
  ``await relay.close(reason, grace=2.0)`` (``: shutting-down`` + clean end
  on every SSE stream, ``closing`` + close 1001 on every WebSocket, in-process
  connections closed, stragglers aborted after ``grace``).
- ``conn = relay.attach_emitter(hello, deliver)``: an in-process emitter
  connection (:class:`LocalEmitter`), the same :class:`~.core.Connection`
  family as a remote WebSocket emitter. ``await conn.ingest(event)``
  validates, claims the session, buffers, fans out (raises
  :class:`InvalidEvent`, :class:`RelayClosed`, :class:`CommandRefused`);
  commands routed to its sessions are awaited into ``deliver(cmd)``;
  ``conn.close()`` drops its claims. Counts as authenticated iff the relay
  has a token.
- ``make_app(relay, *, healthz=None)`` (:mod:`.app`): the ASGI app
  (``POST/GET /events``, ``GET /.well-known/aep``, ``GET /stream``,
  ``GET /socket``, ``GET /healthz``), with the browser guards (CORS only
  for ``cors_origins``, WebSocket ``Origin`` check, the DNS-rebinding
  ``Host`` check on loopback listeners; :mod:`.app` "Browsers").
- ``await serve_relay(relay, (host, port) | socket, *, healthz, shutdown,
  reason, graceful_timeout, task_status)`` and the general
  ``serve_app(app, sock, shutdown, ...)`` / ``bind_socket(host, port)``
  (:mod:`.serve`): hypercorn's trio worker with a per-connection abort
  handle, so a consumer that stopped reading can always be shed (§8.4) and
  shutdown stays bounded, and a fault barrier: a connection that makes
  hypercorn (or the app) raise is closed, counted (``connection_errors`` /
  ``handler_errors``) and logged once per kind, never reaching the caller.
  The OTLP/HTTP listener is served the same way.

Modules: :mod:`.attrmatch` (filter dialect, pure), :mod:`.envelope`
(relay-grade envelope validation, pure), :mod:`.buffer` (replay buffers,
pure), :mod:`.capcheck` (data against its declared capture, pure),
:mod:`.core`, :mod:`.app`, :mod:`.serve`, :mod:`.faults` (rate-limited,
secret-free fault logging).
"""
from .core import CommandRefused, LocalEmitter, Relay, RelayClosed  # noqa: F401
from .envelope import InvalidEvent  # noqa: F401

__all__ = ["Relay", "LocalEmitter", "CommandRefused", "RelayClosed", "InvalidEvent"]
