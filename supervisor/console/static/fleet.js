// aep-bridges console: the fleet panel (/healthz). A bridge's counters are
// /healthz's raw keys; a person reads a plain label (the raw key in its
// tooltip), in this order: the bridge's traffic, control, faults (marked),
// then what it filters out by design (duplicates, repeats, text deltas);
// zero counters are left out (a fault counter that stays 0 is no news).
import { el } from './dom.js';

const GROUPS = ['traffic', 'control', 'fault', 'filtered'];
// [raw key, label, group]; within a group the order here is the order shown
// (a bridge's own prefix, `otlp.` or `agui.`, is left out of the lookup)
const KNOWN = [
  ['requests', 'requests', 'traffic'], ['records', 'records received', 'traffic'],
  ['events', 'events read', 'traffic'], ['streams', 'streams', 'traffic'],
  ['emitted', 'events emitted', 'traffic'], ['frames', 'frames read', 'traffic'],
  ['hooks_received', 'hook calls', 'traffic'], ['sessions_subscribed', 'sessions followed', 'traffic'],
  ['conversations_attached', 'conversations followed', 'traffic'],
  ['tee_connections', 'editor connections', 'traffic'], ['tees_seen', 'editors seen', 'traffic'],
  ['heartbeats', 'heartbeats', 'traffic'], ['reconnects', 'reconnects', 'traffic'],
  ['resyncs', 'resyncs', 'traffic'], ['reconciles', 'reconciles', 'traffic'],
  ['restarts', 'restarts', 'traffic'],
  ['control_commands', 'commands received', 'control'], ['control_accepted', 'commands accepted', 'control'],
  ['control_rejected', 'commands rejected', 'control'],
  ['control_refused', 'commands refused by the agent', 'control'],
  ['control_redelivered', 'commands retried (same id)', 'control'],
  ['instructions_delivered', 'instructions delivered', 'control'],
  ['frames_malformed', 'malformed frames', 'fault'], ['frames_not_json', 'frames not JSON', 'fault'],
  ['frames_unmappable', 'frames not understood', 'fault'], ['frames_unknown', 'unknown frames', 'fault'],
  ['emit_errors', 'events not emitted', 'fault'], ['stamp_errors', 'events not stamped', 'fault'],
  ['socket_errors', 'socket errors', 'fault'], ['rest_errors', 'REST call errors', 'fault'],
  ['auth_failures', 'authentication failures', 'fault'],
  ['socket_auth_failed', 'socket authentication failures', 'fault'],
  ['control_errors', 'command errors', 'fault'], ['control_malformed', 'malformed commands', 'fault'],
  ['control_overload', 'commands refused: overloaded', 'fault'], ['commands_dropped', 'commands dropped', 'fault'],
  ['state_write_errors', 'state file write errors', 'fault'], ['state_read_errors', 'state file read errors', 'fault'],
  ['stream_silent', 'silent event streams', 'fault'], ['stream_overflow', 'event stream overflows', 'fault'],
  ['rejected', 'records rejected', 'fault'], ['saturated', 'refused: busy', 'fault'],
  ['malformed', 'malformed requests', 'fault'], ['bad_requests', 'bad requests', 'fault'],
  ['connection_errors', 'connection errors', 'fault'], ['upstream_errors', 'upstream errors', 'fault'],
  ['upstream_unreachable', 'upstream unreachable', 'fault'], ['lines_cut', 'lines cut (too long)', 'fault'],
  ['oversize', 'oversize inputs', 'fault'], ['refused', 'requests refused', 'fault'],
  ['duplicates', 'duplicates dropped', 'filtered'], ['frames_duplicate', 'duplicate frames', 'filtered'],
  ['repeats_reduced', 'repeated updates folded', 'filtered'],
  ['deltas_skipped', 'text deltas not forwarded', 'filtered'],
  ['sessionless_skipped', 'server events without a session', 'filtered'],
];
const INFO = new Map(KNOWN.map(([k, label, group], i) => [k, { label, group, i }]));
const FAULTY = /error|fail|refused|malformed|dropped|rejected|overflow|unwritten|unwritable|torn|lost/;
const plain = (key) => key.replace(/^[a-z]+\./, '');

/** What is known of a raw counter key: ``{label, group, i}`` (an unknown
 *  key: the key in words, a fault when its name says so, after the known). */
export function counterInfo(key) {
  const bare = plain(key);
  return INFO.get(bare) || { label: bare.replace(/[_.]/g, ' '), group: FAULTY.test(bare) ? 'fault' : 'traffic',
                             i: KNOWN.length };
}

/** The plain label of a raw counter key. */
export const counterLabel = (key) => counterInfo(key).label;

/** A bridge's non-zero counters as [key, value] pairs, in reading order. */
export function counterOrder(counters) {
  const rows = Object.entries(counters || {}).filter(([, v]) => typeof v === 'number' && v !== 0);
  const rank = (k) => { const c = counterInfo(k); return GROUPS.indexOf(c.group) * 1000 + c.i; };
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
      const c = counterInfo(k);
      box.append(el('span', { class: 'counter ' + c.group, 'data-key': k, title: k, text: c.label + ' ' + String(v) }));
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
