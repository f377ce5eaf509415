"""Past one machine (issue 14; DESIGN.md "Past one machine"): the fleet
publishes every event into NATS JetStream and ``aep-bridges relay`` serves
the AEP bindings from the stream.

- :mod:`.subjects`: the subject scheme, KV keys and message ids (pure).
- :mod:`.config`: the ``AEP_NATS_*`` settings (pure).
- :mod:`.link`: the one connection, nats-py run under trio through
  trio-asyncio (the only place asyncio is touched).

Nothing here is imported unless ``AEP_NATS_URL`` is set: the embedded relay
stays the single-host default.
"""
