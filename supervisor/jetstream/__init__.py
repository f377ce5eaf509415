"""Past one machine (issue 14; DESIGN.md "Past one machine"): the fleet
publishes every event into NATS JetStream and ``aep-bridges relay`` serves
the AEP bindings from the stream.

- :mod:`.subjects`: the subject scheme, KV keys and message ids (pure).
- :mod:`.config`: the ``AEP_NATS_*`` settings (pure).
- :mod:`.link`: the one connection, nats-py run under trio through
  trio-asyncio (the only place asyncio is touched).
- :mod:`.publish`: the stream, its outbox and the acked publisher
  (:class:`~.publish.Publisher`, acks matched on one inbox).
- :mod:`.sink`: the fleet's sink into the stream; :mod:`.recover`: what a
  killed run logged but never got acknowledged, published first at start;
  :mod:`.presence`: the session claims in the KV bucket and the daemon's
  command subject; :mod:`.lost`: the sessions its fleet was refused, and
  when each is asked about again (pure).
- :mod:`.relay` and :mod:`.plan`: ``aep-bridges relay`` served from the
  stream (a :class:`~supervisor.relay.Relay` subclass; subject filters and
  ``from`` positions), with its three bases: :mod:`.subscribe` (each
  subscription's pull consumer, replay then live), :mod:`.ingest` (events
  published and acknowledged) and :mod:`.routing` (the ``/socket``
  emitters' claims, the roster, commands routed by the claims bucket;
  ``owners``: the session bindings bucket every relay and daemon checks).

Nothing here is imported unless ``AEP_NATS_URL`` is set: the embedded relay
stays the single-host default.
"""

__all__ = ["config", "ingest", "link", "lost", "owners", "plan", "presence", "publish", "recover", "relay",
           "routing", "sink", "subjects", "subscribe"]
