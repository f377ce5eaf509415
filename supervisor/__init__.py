"""The daemon around the bridges. At the top, the modules that compose
everything: :mod:`.cli` (the ``aep-bridges`` entry point and its
subcommands), :mod:`.daemon` (start-up, the listeners, shutdown),
:mod:`.fleet` (each bridge's life) with its two bases :mod:`.pump` (the
relay channel's one consumer) and :mod:`.handoff` (the command hand-off),
:mod:`.config` (every setting), :mod:`.knobs` (docs/configuration.md's tables from
the settings metadata) and :mod:`.posture` (exposure warnings). Below
them, one sub-package per job, each with a curated ``__init__``:
:mod:`.sessionlog` (the JSONL session log), :mod:`.delivery` (each
bridge's uplink and its outbox), :mod:`.jetstream` (past one machine: NATS
JetStream), :mod:`.relay` (the embedded AEP relay), :mod:`.web` (the
daemon's HTTP plumbing), :mod:`.tools` (the operator's tools behind the
CLI) and :mod:`.hookinstall` (the hook entries in the agents' own
configs). A sub-package never imports the top modules and reaches a
sibling only through its ``__init__`` (``tests/unit/test_layers.py``).
"""
