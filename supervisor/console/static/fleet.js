// aep-bridges console: the fleet panel (/healthz). A bridge's counters are
// /healthz's raw keys; a person reads a plain label (the raw key in its
// tooltip), the bridge's traffic first, then control, then the faults;
// zero counters are left out (a fault counter that stays 0 is no news).
import { el } from './dom.js';

// [raw key, label]; the order here is the order shown
// (a bridge's own prefix, `otlp.` or `agui.`, is left out of the lookup)
const KNOWN = [
  // traffic
  ['requests', 'requests'], ['records', 'records received'], ['events', 'events read'],
  ['streams', 'streams'], ['emitted', 'events emitted'],
  ['frames', 'frames read'], ['heartbeats', 'heartbeats'], ['hooks_received', 'hook calls'],
  ['sessions_subscribed', 'sessions followed'], ['conversations_attached', 'conversations followed'],
  ['tee_connections', 'editor connections'], ['tees_seen', 'editors seen'],
  ['reconnects', 'reconnects'], ['resyncs', 'resyncs'], ['reconciles', 'reconciles'],
  ['restarts', 'restarts'],
  // control
  ['control_commands', 'commands received'], ['control_accepted', 'commands accepted'],
  ['control_rejected', 'commands rejected'], ['control_refused', 'commands refused by the agent'],
  ['control_redelivered', 'commands retried (same id)'], ['instructions_delivered', 'instructions delivered'],
  // faults
  ['frames_malformed', 'malformed frames'], ['frames_not_json', 'frames not JSON'],
  ['frames_unmappable', 'frames not understood'], ['frames_unknown', 'unknown frames'],
  ['frames_duplicate', 'duplicate frames'], ['duplicates', 'duplicates dropped'],
  ['emit_errors', 'events not emitted'], ['stamp_errors', 'events not stamped'],
  ['socket_errors', 'socket errors'], ['rest_errors', 'REST call errors'],
  ['auth_failures', 'authentication failures'], ['socket_auth_failed', 'socket authentication failures'],
  ['control_errors', 'command errors'], ['control_malformed', 'malformed commands'],
  ['control_overload', 'commands refused: overloaded'], ['commands_dropped', 'commands dropped'],
  ['state_write_errors', 'state file write errors'], ['state_read_errors', 'state file read errors'],
  ['stream_silent', 'silent event streams'], ['stream_overflow', 'event stream overflows'],
  ['rejected', 'records rejected'], ['saturated', 'refused: busy'], ['malformed', 'malformed requests'],
  ['bad_requests', 'bad requests'], ['connection_errors', 'connection errors'],
  ['upstream_errors', 'upstream errors'], ['upstream_unreachable', 'upstream unreachable'],
  ['lines_cut', 'lines cut (too long)'], ['oversize', 'oversize inputs'], ['refused', 'requests refused'],
];
const ORDER = new Map(KNOWN.map(([k], i) => [k, i]));
const LABEL = new Map(KNOWN);

/** The plain label of a raw counter key (unknown keys: the key in words). */
export function counterLabel(key) {
  const bare = plain(key);
  return LABEL.get(bare) || bare.replace(/[_.]/g, ' ');
}
const plain = (key) => key.replace(/^[a-z]+\./, '');

/** A bridge's non-zero counters as [key, value] pairs, in reading order:
 *  the known ones as listed above, then the rest by key. */
export function counterOrder(counters) {
  const rows = Object.entries(counters || {}).filter(([, v]) => typeof v === 'number' && v !== 0);
  const rank = (k) => (ORDER.has(plain(k)) ? ORDER.get(plain(k)) : KNOWN.length);
  return rows.sort(([a], [b]) => rank(a) - rank(b) || (a < b ? -1 : a > b ? 1 : 0));
}

/** The fleet panel's children for a /healthz body. */
export function fleetNodes(body) {
  const bridges = body && typeof body.bridges === 'object' && body.bridges ? body.bridges : {};
  const kids = Object.entries(bridges).map(([name, b]) => {
    const counters = b && typeof b.counters === 'object' && b.counters ? counterOrder(b.counters) : [];
    const box = counters.length ? el('div', { class: 'counters' }) : null;
    counters.forEach(([k, v], i) => {
      if (i) box.append(' · ');
      box.append(el('span', { class: 'counter', 'data-key': k, title: k, text: counterLabel(k) + ' ' + String(v) }));
    });
    return el('div', { class: 'bridge', 'data-bridge': name },
      el('span', { class: b && b.ok ? 'state-running' : 'state-waiting', text: (b && b.ok ? '● ' : '○ ') + name }),
      ' · ' + (b && b.source === true ? 'source up' : b && b.source === false ? 'source down'
               : 'source ' + String(b && b.source)) + (b && b.control ? ' · control on' : ''),
      box);
  });
  if (!kids.length) kids.push(el('span', { class: 'hint', text: body && body.ok ? 'relay only: no bridges here' : 'no fleet data' }));
  return kids;
}
