"""``GET /metrics``: the daemon's counters in the Prometheus text format,
exposed with ``prometheus-client`` (its registry, collectors and
``generate_latest``; nothing hand-written).

Most figures already exist as counters (the fleet's, each bridge's
``BridgeHealth``, the relay's, the uplinks', the session log's); they are
read at scrape time by :class:`FleetCollector`, so the hot paths keep their
plain ``dict`` increments. Only the command-ack latency needs a live
instrument (:attr:`Metrics.ack_latency`, a histogram fed by the fleet).

Families (all prefixed ``aep_bridges_``):

===========================================  =====================================================
``events_emitted_total{bridge,family}``      events through the relay channel (JSONL + sink), by
                                             type family (``tool``, ``attention``, ``x`` ...)
``events_dropped_total{reason,severity}``    events not delivered somewhere, by why and severity
``relay_subscribers``                        open SSE/WebSocket subscriptions (embedded relay)
``relay_replay_buffer_bytes``                bytes held in the replay buffers
``relay_replay_sessions``                    sessions held in the replay buffers
``relay_replay_sessions_pinned``             of them, pinned by an open ask (``relay/pins.py``)
``relay_sessions_evicted_total{kind}``       buffers evicted, by kind: ``open``, ``fleet`` (and
                                             ``pinned`` among them); ``relay_pins_released_total``
``uplink_outbox_events{bridge}``             events waiting in an uplink outbox (AEP_RELAY_URL)
``uplink_connects_total{bridge}``            uplink (re)connections
``vendor_reconnects_total{bridge}``          vendor stream reconnects (SSE) and socket
                                             (re)connections (OpenHands, Kimi)
``bridge_restarts_total{bridge}``            crashed bridges restarted by the fleet
``bridge_up{bridge}``                        1 when the bridge's source and relay link are up
``acp_held_bytes{bridge}``                   unfinished-line bytes an ACP bridge holds for its tees
``otlp_requests_total{bridge,outcome}``      OTLP export requests by outcome
``command_acks_total{bridge,decision,reason}`` acks bridges emitted (``accepted`` / ``rejected`` + reason)
``relay_commands_total{outcome}``            commands the relay ``routed`` or ``refused`` itself
``command_ack_latency_seconds``              command arrival at the fleet (relay or uplink) -> its
                                             ack (histogram)
``nats_published_total`` ...                 the JetStream sink (``AEP_NATS_URL``): publishes,
                                             acks, duplicates, errors, outbox depth, connected,
                                             commands from relays by outcome
``session_log_*``                            lines, write errors, bytes on disk, rotations,
                                             compressions, removals (retention)
``process_*``                                fds, RSS, CPU (``prometheus_client.ProcessCollector``)
===========================================  =====================================================
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Mapping, Protocol

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

__all__ = ["Metrics", "FleetCollector", "PREFIX", "ACK_BUCKETS", "Watched", "WatchedMember"]

if TYPE_CHECKING:
    from bridges.core.bridge import BridgeHealth

    from ..delivery.uplink import Uplink
    from ..relay import Relay
    from ..sessionlog import RetainingSessionLog

PREFIX = "aep_bridges"

#: ack latency buckets, seconds: the ack window is 10 s (AEP-0004 §2.2)
ACK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# bridge counters -> (drop reason, severity); "*" when the count spans severities
_BRIDGE_DROPS = {
    "commands_dropped": ("control-inbox-full", "*"),
    "frames_unmappable": ("vendor-frame-unmappable", "*"),
    "frames_malformed": ("vendor-frame-malformed", "*"),
    "frames_not_json": ("vendor-frame-not-json", "*"),
    "otlp.rejected": ("otlp-record-rejected", "*"),
    "emit_errors": ("emit-error", "*"),
    "lines_cut": ("acp-line-cut", "*"),  # ACP: unfinished lines past AEP_ACP_MAX_HELD_BYTES
    "lines_refused": ("acp-line-refused", "*"),  # ACP: lines past the JSON bounds, unparsed
    # ACP and the hook bridges: AEP_ACP_NEW_SESSIONS_PER_S, AEP_<AGENT>_NEW_SESSIONS_PER_S
    "sessions_refused": ("session-refused", "*"),
    "agui.over_budget": ("agui-over-budget", "*"),  # AEP_AGUI_MAX_BUFFERED: mapped unparsed
}
_RECONNECTS = ("reconnects", "socket_connects")
_OTLP_REFUSALS = ("otlp.bad_gzip", "otlp.too_large", "otlp.unsupported_media_type",
                  "otlp.unsupported_encoding", "otlp.undecodable", "otlp.disconnected",
                  "otlp.refused_host", "otlp.too_many_records", "otlp.decode_timeout")


class WatchedMember(Protocol):
    """What the collector reads of one bridge of the fleet
    (:class:`supervisor.pump.Member`)."""

    @property
    def health(self) -> BridgeHealth: ...

    @property
    def restarts(self) -> int: ...

    @property
    def uplink(self) -> Uplink | None: ...


class Watched(Protocol):
    """What the collector reads of the fleet at scrape time (public members
    of :class:`supervisor.fleet.Fleet`; a ``jetstream`` attribute is read
    when present). The fleet is above this module: it owns a
    :class:`Metrics` and hands itself to :meth:`Metrics.watch`, so the shape
    lives here and this module never imports the fleet."""

    @property
    def emitted(self) -> Mapping[tuple[str, str], int]: ...

    @property
    def acks(self) -> Mapping[tuple[str, str, str], int]: ...

    @property
    def counters(self) -> Mapping[str, int]: ...

    @property
    def members(self) -> Mapping[str, WatchedMember]: ...

    @property
    def relay(self) -> Relay | None: ...

    @property
    def session_log(self) -> RetainingSessionLog: ...


class Metrics:
    """The daemon's registry: the process collector, the fleet collector
    and the live ack-latency histogram. :meth:`render` is the ``/metrics``
    body and content type."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        self.ack_latency = Histogram(f"{PREFIX}_command_ack_latency_seconds",
                                     "Command arrival at the fleet to its ack, seconds",
                                     buckets=ACK_BUCKETS, registry=self.registry)
        self._fleet: FleetCollector | None = None

    def watch(self, fleet: Watched) -> None:
        """Collect ``fleet``'s figures (once)."""
        if self._fleet is None:
            self._fleet = FleetCollector(fleet)
            self.registry.register(self._fleet)

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """``(body, content_type)`` for a scrape whose ``Accept`` header is
        ``accept``: the Prometheus text format, or OpenMetrics when asked
        (``prometheus_client``'s own negotiation)."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type


class FleetCollector(Collector):
    """Reads a :class:`supervisor.fleet.Fleet` (and its relay) at scrape time."""

    def __init__(self, fleet: Watched) -> None:
        self.fleet = fleet

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: families depend on the bridges running

    def collect(self) -> Iterator[Metric]:
        f = self.fleet
        emitted = CounterMetricFamily(f"{PREFIX}_events_emitted", "Events through the relay "
                                      "channel, by bridge and type family",
                                      labels=["bridge", "family"])
        for (bridge, family), n in sorted(f.emitted.items()):
            emitted.add_metric([bridge, family], n)
        yield emitted
        yield self._drops()
        yield from self._bridges()
        yield from self._relay()
        yield from self._nats()
        yield from self._session_log()
        acks = CounterMetricFamily(f"{PREFIX}_command_acks", "Command acks emitted, by decision",
                                   labels=["bridge", "decision", "reason"])
        for (bridge, decision, reason), n in sorted(f.acks.items()):
            acks.add_metric([bridge, decision, reason], n)
        yield acks

    def _drops(self) -> Metric:
        f = self.fleet
        drops = CounterMetricFamily(f"{PREFIX}_events_dropped", "Events not delivered, by reason "
                                    "and severity ('*': the count spans severities)",
                                    labels=["reason", "severity"])
        fleet_c = f.counters
        drops.add_metric(["unserializable", "*"], fleet_c.get("unserializable", 0))
        drops.add_metric(["sink-error", "*"], fleet_c.get("sink_errors", 0))
        drops.add_metric(["session-log-write-failed", "*"], f.session_log.errors)
        totals: dict[tuple[str, str], int] = {}
        for m in f.members.values():
            for name, key in _BRIDGE_DROPS.items():
                totals[key] = totals.get(key, 0) + int(m.health.counters.get(name, 0))
            up = getattr(m.uplink, "counters", None) or {}
            for sev in ("debug", "info"):
                k = ("uplink-outbox-full", sev)
                totals[k] = totals.get(k, 0) + int(up.get(f"dropped_{sev}", 0))
            k = ("uplink-outbox-full", "notice+")
            totals[k] = totals.get(k, 0) + int(up.get("dropped", 0))
        js = getattr(f, "jetstream", None)
        if js is not None:
            st = js.publisher.stats()
            for sev in ("debug", "info"):  # notice+ is never shed: the pump waits instead
                totals[("nats-outbox-full", sev)] = int(st[f"dropped_{sev}"])
            totals[("nats-too-large", "*")] = int(st["too_large"])
        if f.relay is not None:
            rc = f.relay.stats()["counters"]
            for sev in ("debug", "info"):  # notice+ is never shed: the stream ends instead
                totals[("relay-slow-consumer", sev)] = int(rc.get(f"dropped_{sev}", 0))
            totals[("relay-invalid-event", "*")] = int(rc.get("invalid_events", 0))
            # out of replay by the depth or by a byte budget (``trimmed_bytes``
            # counts entries too): a POSTed batch is mostly the second
            totals[("relay-replay-trimmed", "*")] = \
                int(rc.get("trimmed", 0)) + int(rc.get("trimmed_bytes", 0))
        for (reason, sev), n in sorted(totals.items()):
            drops.add_metric([reason, sev], n)
        return drops

    def _bridges(self) -> Iterator[Metric]:
        f = self.fleet
        up = GaugeMetricFamily(f"{PREFIX}_bridge_up", "1 when the bridge's vendor source and "
                               "relay link are up", labels=["bridge"])
        restarts = CounterMetricFamily(f"{PREFIX}_bridge_restarts", "Bridge restarts after a "
                                       "crash or return", labels=["bridge"])
        reconnects = CounterMetricFamily(f"{PREFIX}_vendor_reconnects", "Vendor stream "
                                         "reconnects and socket (re)connections",
                                         labels=["bridge"])
        otlp = CounterMetricFamily(f"{PREFIX}_otlp_requests", "OTLP export requests by outcome "
                                   "(admitted: records mapped, some may be rejected via "
                                   "partial_success)", labels=["bridge", "outcome"])
        outbox = GaugeMetricFamily(f"{PREFIX}_uplink_outbox_events", "Events waiting in the "
                                   "uplink outbox", labels=["bridge"])
        connects = CounterMetricFamily(f"{PREFIX}_uplink_connects", "Uplink connections made",
                                       labels=["bridge"])
        held = GaugeMetricFamily(f"{PREFIX}_acp_held_bytes", "Bytes of unfinished lines an ACP "
                                 "bridge holds for its tees (AEP_ACP_MAX_HELD_BYTES)",
                                 labels=["bridge"])
        unauth = CounterMetricFamily(f"{PREFIX}_hooks_unauthorized", "Hook requests the "
                                     "daemon's token guard refused (the agent's AEP_TOKEN or "
                                     "--token-file differs from the daemon's)", labels=["bridge"])
        for name, m in sorted(f.members.items()):
            c = m.health.counters
            if "hooks_unauthorized" in c:
                unauth.add_metric([name], int(c["hooks_unauthorized"]))
            up.add_metric([name], 1.0 if m.health.ok else 0.0)
            restarts.add_metric([name], m.restarts)
            reconnects.add_metric([name], sum(int(c.get(k, 0)) for k in _RECONNECTS))
            if "otlp.requests" in c or any(k.startswith("otlp.") for k in c):
                saturated = int(c.get("otlp.saturated", 0))
                otlp.add_metric([name, "admitted"], int(c.get("otlp.requests", 0)) - saturated)
                otlp.add_metric([name, "unavailable"], saturated)
                for k in _OTLP_REFUSALS:
                    if c.get(k):
                        otlp.add_metric([name, k[5:]], int(c[k]))
            if "held_bytes" in c:
                held.add_metric([name], int(c["held_bytes"]))
            if m.uplink is not None:
                uc = m.uplink.counters
                outbox.add_metric([name], int(uc.get("outbox", 0)))
                connects.add_metric([name], int(uc.get("connects", 0)))
        yield from (up, restarts, reconnects, otlp, outbox, connects, held, unauth)

    def _relay(self) -> Iterator[Metric]:
        relay = self.fleet.relay
        if relay is None:
            return
        st: dict[str, Any] = relay.stats()
        yield GaugeMetricFamily(f"{PREFIX}_relay_subscribers", "Open relay subscriptions",
                                value=st["subscribers"])
        yield GaugeMetricFamily(f"{PREFIX}_relay_connections", "Open relay connections "
                                "(emitters, sockets)", value=st["connections"])
        yield GaugeMetricFamily(f"{PREFIX}_relay_replay_buffer_bytes", "Bytes held in the "
                                "replay buffers", value=st["buffered_bytes"])
        yield GaugeMetricFamily(f"{PREFIX}_relay_replay_sessions", "Sessions held in the "
                                "replay buffers", value=st["sessions"])
        yield GaugeMetricFamily(f"{PREFIX}_relay_replay_sessions_pinned", "Sessions held in the "
                                "replay buffers that an open ask pins", value=st.get("sessions_pinned", 0))
        rc = st["counters"]
        evicted = CounterMetricFamily(f"{PREFIX}_relay_sessions_evicted", "Replay buffers evicted "
                                      "by the session cap or the total byte budget, by kind: open "
                                      "(OTLP, AG-UI, remote posts, restored), fleet (the "
                                      "authenticated bridges'), pinned (holding an open ask; "
                                      "also counted by its kind)", labels=["kind"])
        for kind in ("open", "fleet", "pinned"):
            evicted.add_metric([kind], rc.get(f"sessions_evicted_{kind}", 0))
        yield evicted
        yield CounterMetricFamily(f"{PREFIX}_relay_pins_released", "Open-ask pins released past "
                                  "a quarter of AEP_MAX_SESSIONS", value=rc.get("pins_released", 0))
        yield CounterMetricFamily(f"{PREFIX}_relay_events", "Events the relay accepted",
                                  value=rc.get("events", 0))
        cmds = CounterMetricFamily(f"{PREFIX}_relay_commands", "Commands the relay routed to a "
                                   "target or refused itself (AEP-0004 §4)", labels=["outcome"])
        cmds.add_metric(["routed"], rc.get("commands_routed", 0))
        cmds.add_metric(["refused"], rc.get("commands_refused", 0))
        yield cmds
        refused = CounterMetricFamily(f"{PREFIX}_relay_refused", "Events the relay refused "
                                      "from a party that may not send them: an ack not from its "
                                      "command's target, another emitter's session or source; "
                                      "or past the new-session budget; a bridge of this daemon's "
                                      "event into a per-emitter credential's session; a "
                                      "per-emitter credential's command into a session not "
                                      "bound to it (AEP-0004 §4.3, refused unauthorized)",
                                      labels=["reason"])
        for reason, key in (("ack", "refused_acks"), ("owned_session", "refused_owned_session"),
                            ("owned_source", "refused_owned_source"),
                            ("new_sessions", "refused_new_sessions"),
                            ("fleet_into_owned", "refused_fleet_into_owned"),
                            ("command_scope", "refused_command_scope")):
            refused.add_metric([reason], rc.get(key, 0))
        yield refused
        yield CounterMetricFamily(f"{PREFIX}_relay_streams_terminated", "Consumers shed as too "
                                  "slow (AEP-0003 §8.4)", value=rc.get("streams_terminated", 0))

    def _nats(self) -> Iterator[Metric]:
        js = getattr(self.fleet, "jetstream", None)
        if js is None:
            yield from _nats_relay(self.fleet.relay)
            return
        if js.link is not None:
            yield from _nats_link(js.link.counters)
        st = js.publisher.stats()
        for key, help_ in (("published", "JetStream publishes (resends included)"),
                           ("acked", "JetStream publish acks (duplicates included)"),
                           ("duplicates", "Publishes the server dropped as duplicates "
                                          "(Nats-Msg-Id seen)"),
                           ("publish_errors", "JetStream publishes that failed (retried)")):
            yield CounterMetricFamily(f"{PREFIX}_nats_{key}", help_, value=st[key])
        yield GaugeMetricFamily(f"{PREFIX}_nats_outbox_events", "Events waiting for a JetStream "
                                "ack", value=st["outbox"])
        yield GaugeMetricFamily(f"{PREFIX}_nats_connected", "1 while the NATS link is up",
                                value=st["connected"])
        pc = js.presence.counters
        cmds = CounterMetricFamily(f"{PREFIX}_nats_commands", "Commands from relays over NATS, "
                                   "handed to a bridge or refused", labels=["outcome"])
        cmds.add_metric(["delivered"], pc["commands_delivered"])
        cmds.add_metric(["refused"], pc["commands_refused"])
        yield cmds
        yield CounterMetricFamily(f"{PREFIX}_nats_fleet_refused", "Events of this daemon's "
                                  "bridges dropped (not logged, not published) because a "
                                  "per-emitter credential, or a shared-token emitter within "
                                  "its hold, holds their session in AEP_bindings",
                                  value=pc.get("refused_fleet_into_owned", 0))
        yield CounterMetricFamily(f"{PREFIX}_nats_fleet_reclaimed", "Shared-token sessions "
                                  "this daemon's bridges took back in AEP_bindings once free",
                                  value=pc.get("fleet_reclaimed", 0))
        yield CounterMetricFamily(f"{PREFIX}_nats_fleet_lost_evicted", "Sessions refused to "
                                  "this daemon's bridges forgotten past their cap (asked about "
                                  "again at their next event)", value=pc.get("lost_evicted", 0))

    def _session_log(self) -> Iterator[Metric]:
        sl = self.fleet.session_log
        yield CounterMetricFamily(f"{PREFIX}_session_log_lines", "Lines written to the session "
                                  "logs", value=sl.lines)
        yield CounterMetricFamily(f"{PREFIX}_session_log_write_errors", "Failed session log "
                                  "writes", value=sl.errors)
        for key, help_ in (("files_opened", "Session log files opened"),
                           ("descriptors_evicted", "Session log descriptors closed by the LRU "
                                                   "(AEP_LOG_MAX_OPEN)"),
                           ("torn_repaired", "Session log tails repaired at start")):
            if key in sl.counters:
                yield CounterMetricFamily(f"{PREFIX}_session_log_{key}", help_,
                                          value=sl.counters[key])
        spares = sl.spares
        if spares is not None:
            sp = CounterMetricFamily(f"{PREFIX}_session_log_spare_files", "Spare session log "
                                     "files made ahead, taken for new sessions, missed (a "
                                     "file created on the event loop), failed",
                                     labels=["outcome"])
            for key in ("made", "taken", "missed", "errors"):
                sp.add_metric([key], spares.counters[key])
            yield sp
        counters = sl.retained
        yield GaugeMetricFamily(f"{PREFIX}_session_log_bytes", "Bytes of session logs on disk",
                                value=sl.current_bytes())
        for key, help_ in (("rotations", "Session log files rotated"),
                           ("compressed", "Rotated files compressed"),
                           ("removed_files", "Session log files removed by retention"),
                           ("removed_bytes", "Bytes removed by retention"),
                           ("compress_errors", "Failed compressions"),
                           ("remove_errors", "Failed removals")):
            yield CounterMetricFamily(f"{PREFIX}_session_log_{key}", help_, value=counters[key])


def _nats_link(counters: dict[str, int]) -> Iterator[Metric]:
    """The NATS link's own counters (a daemon's sink or a JetStream relay)."""
    for key, help_ in (("disconnects", "NATS connections lost"),
                       ("reconnects", "NATS reconnections made")):
        yield CounterMetricFamily(f"{PREFIX}_nats_{key}", help_, value=counters.get(key, 0))


def _nats_relay(relay: Any) -> Iterator[Metric]:
    """``aep-bridges relay`` over JetStream: its link, publishes, consumers
    and command routing (``JetStreamRelay.nats_stats``), the daemon's names."""
    stats = getattr(relay, "nats_stats", None)
    if stats is None:
        return
    st: dict[str, int] = stats()
    yield from _nats_link(st)
    yield GaugeMetricFamily(f"{PREFIX}_nats_connected", "1 while the NATS link is up",
                            value=st["connected"])
    for key, help_ in (("published", "JetStream publishes acknowledged (POST /events, /socket)"),
                       ("publish_errors", "Events the stream did not acknowledge in time "
                                          "(the emitter was answered 503)"),
                       ("consumers_made", "JetStream consumers made for subscriptions"),
                       ("consumers_remade", "Consumers remade after a loss (node, leader, "
                                            "outage)"),
                       ("bad_stream_messages", "Stream messages that are not AEP events "
                                               "(skipped)")):
        yield CounterMetricFamily(f"{PREFIX}_nats_{key}", help_, value=st[key])
    yield GaugeMetricFamily(f"{PREFIX}_nats_consumers", "Live JetStream consumers "
                            "(one per subscription phase)", value=st["consumers"])
    cmds = CounterMetricFamily(f"{PREFIX}_nats_commands", "Commands over NATS: forwarded to "
                               "the owning daemon, received for this relay's /socket emitters, "
                               "refused no-route while NATS was unreachable", labels=["outcome"])
    for outcome in ("forwarded", "received", "unreachable"):
        cmds.add_metric([outcome], st[f"commands_{outcome}"])
    yield cmds
