"""The ACP bridge (``bridges/acp``): the Agent Client Protocol tee and the
daemon side that maps what the tees observe. Design record:
``shared/aep/docs/bridge-acp-design.md``; pins
``shared/aep/conformance/fixtures/mappings/acp.json``.

- :mod:`bridges.acp.mapping`: the pure moment -> emissions mapping.
- :mod:`bridges.acp.join`: the pure per-tee state (request/response join per
  (direction, id), run identity, the attention lifecycle).
"""
