"""The operator's tools behind the ``aep-bridges`` subcommands
(:mod:`supervisor.cli` parses the command line and calls them): :mod:`.tail`
(``aep-bridges tail``: the live timeline of a relay, one line per event, or
``--json``; :mod:`.tailstream` is its tolerant SSE reader, :mod:`.gist` the one-line summary of an event), :mod:`.install` (``aep-bridges service install``: the systemd
unit or launchd agent rendered from the shipped templates in
``supervisor/service/``), :mod:`.notify` (the service manager's readiness and
watchdog notifications, which the daemon sends), :mod:`.logs` (the daemon's
log format and level), :mod:`.control` (``aep-bridges respond``, ``cancel``,
``pause``, ``resume``: one AEP-0004 command, its ack, its outcome;
:mod:`.pending` the open asks for ``respond --pending`` or no id),
:mod:`.resume` (``tail``'s saved position per endpoint; :mod:`.missed` the sessions
a restarted ``tail`` catches up on), :mod:`.timeline`
(``aep-bridges timeline``: session log files rendered as ``tail`` renders),
:mod:`.validate` (``aep-bridges validate``: events against the AEP schemas
shipped in ``schemas/``, with line numbers), :mod:`.doctor` (``aep-bridges
doctor``: the machine against the configuration, with a fix per failure;
:mod:`.hookdoctor` its checks of the hook bridges; :mod:`.holder` which
aep-bridges process holds a port). Each tool is loaded only by the command that uses it,
so this ``__init__`` imports none of them: it lists them.
"""

__all__ = ["control", "doctor", "gist", "hookdoctor", "holder", "install", "logs", "missed", "notify", "pending", "resume",
           "tail", "tailstream", "timeline", "validate"]
