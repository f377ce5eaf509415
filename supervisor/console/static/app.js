// aep-bridges console (issue 28): one page over the relay's own bindings.
// /socket (AEP-0003 §3.5: hello, subscribe with `from`, roster, commands),
// /healthz (the fleet). Every payload string goes to the page as text
// (textContent / text nodes), never as markup.
import { $, answeredText, el, offerNotifications, str } from './dom.js';
import { fleetNodes } from './fleet.js';
import { formFields } from './forms.js';
import { gist, timelineLine } from './gist.js';
import { askKey, b64url, ulid } from './ids.js';
import { installKeys } from './keys.js';
import { place, rowButton, virtual } from './lists.js';

(() => {
  const MAX_PER_SESSION = 5000;   // timeline rows kept per session (count keeps counting)
  const MAX_CARDS = 100;          // pending cards in the DOM at once
  const MAX_SETTLED = 20;         // settled cards kept on screen
  const MAX_SEEN = 400000;        // (source, id) keys remembered for dedupe
  const MAX_EARLY = 2000;         // outcomes kept for asks not seen yet
  const MAX_CATCHUP = 500;        // sessions named in a catch-up filter (past it: replay all)
  const SROW = 44, TROW = 24;     // virtual list row heights (px; match app.css)
  const AGENT = 'aep-console';
  const INSTANCE = 'console-' + Math.random().toString(36).slice(2, 10);

  const S = {
    mode: 'unknown',              // 'open' (no AEP_TOKEN: watch-only) | 'token'
    token: null,
    ws: null, live: false, backoff: 500, everConnected: false,
    seen: new Set(),              // `${source}|${id}`: dedupe (AEP-0001 §7.4)
    sessions: new Map(),          // session -> record
    asks: new Map(),              // askKey(source, session, id) -> ask record
    cmds: new Map(),              // command id -> {ask?, session, verb}
    roster: new Map(),            // session -> control.accepts
    windows: new Map(),           // session -> its target's ack window (ms, from the roster)
    early: new Map(),             // askKey -> outcomes that arrived before their ask
    caps: {},                     // the relay's hello capabilities
    resumeSet: null,              // sessions resumed from positions, until the catch-up is sent
    order: [],                    // sessions sorted by last activity (rebuilt when dirty)
    selected: null, detail: null, toEnd: false, catchupFilter: {},
    events: 0, dups: 0, catchups: 0, hellos: 0,
    dirty: new Set(), timer: null,
  };
  window.aepConsole = S;          // for tests and benchmarks: read-only inspection
  S.gist = gist;

  // ---- auth -----------------------------------------------------------------
  async function health(token) {
    const headers = token ? { Authorization: 'Bearer ' + token } : {};
    const r = await fetch('/healthz', { headers, cache: 'no-store', credentials: 'omit' });
    return r.json();
  }
  const WATCH_ONLY = 'watch-only: the daemon has no AEP_TOKEN, so it refuses commands';
  const authorized = (b) => !!b && typeof b === 'object' && ('counts' in b || 'relay_counts' in b);

  async function start() {
    let body = null;
    try { body = await health(null); } catch (e) { setConn('relay unreachable: retrying', 'bad'); }
    if (body === null) { setTimeout(start, 1000); return; }
    if (authorized(body)) {
      S.mode = 'open';
      setMode(WATCH_ONLY, 'warn');
      fleet(body);
      connect();
      return;
    }
    S.mode = 'token';
    const saved = sessionStorage.getItem('aep-token');
    if (saved && await tokenWorks(saved)) { useToken(saved); return; }
    askToken('');
  }
  async function tokenWorks(t) {
    try { return authorized(await health(t)); } catch (e) { return false; }
  }
  function askToken(message) {
    $('token-form').hidden = false;
    $('token-error').textContent = message;
    setConn('token needed', 'warn');
    $('token-input').focus();
  }
  function useToken(t) {
    S.token = t;
    sessionStorage.setItem('aep-token', t);
    $('token-form').hidden = true;
    $('token-error').textContent = '';
    setMode('control on: answers go to the agents', 'ok');
    connect();
  }
  $('token-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    const t = $('token-input').value;
    $('token-input').value = '';
    if (t && await tokenWorks(t)) useToken(t);
    else askToken('That token was refused.');
  });

  function setConn(text, cls) { const c = $('conn'); c.textContent = text; c.className = 'pill ' + (cls || ''); }
  function setMode(text, cls) { const m = $('mode'); m.textContent = text; m.className = 'pill ' + (cls || ''); }
  const canCommand = () => S.mode === 'token' && S.live;

  // ---- the socket -----------------------------------------------------------
  function connect() {
    const url = (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/socket';
    const protocols = ['aep.v0.1'];
    if (S.token) protocols.push('aep.bearer.' + b64url(S.token));
    let ws;
    try { ws = new WebSocket(url, protocols); } catch (e) { return retry(); }
    S.ws = ws;
    setConn(S.everConnected ? 'reconnecting' : 'connecting', 'warn');
    ws.onopen = () => send({ type: 'hello', versions: ['0.1'], role: 'consumer',
                             identity: { agent: AGENT, instance: INSTANCE }, capabilities: {} });
    ws.onmessage = (m) => frame(m.data);
    ws.onclose = () => {
      if (S.ws !== ws) return;
      S.ws = null; S.live = false;
      mark('inbox', 'controls');
      retry();
    };
  }
  function retry() {
    setConn('disconnected: reconnecting', 'bad');
    setTimeout(reconnect, S.backoff);
    S.backoff = Math.min(S.backoff * 2, 4000);
  }
  async function reconnect() {
    // a restart may have set, changed or dropped AEP_TOKEN: look just before reconnecting
    let open = null;
    try { open = authorized(await health(null)); } catch (e) { open = null; }
    if (open === null) { retry(); return; }   // still down
    if (open && S.mode === 'token') {
      S.mode = 'open'; S.token = null; sessionStorage.removeItem('aep-token');
      $('token-form').hidden = true;
      setMode(WATCH_ONLY, 'warn');
    } else if (!open && S.mode === 'open') {
      S.mode = 'token';
      setMode('', '');
      askToken('The daemon now has AEP_TOKEN set.');
      return;
    } else if (!open && S.token) {
      let ok = null;
      try { ok = authorized(await health(S.token)); } catch (e) { ok = null; }
      if (ok === null) { retry(); return; }
      if (!ok) { sessionStorage.removeItem('aep-token'); S.token = null; askToken('The token was refused.'); return; }
    }
    connect();
  }
  function send(obj) {
    if (S.ws && S.ws.readyState === WebSocket.OPEN) { S.ws.send(JSON.stringify(obj)); return true; }
    return false;
  }
  function subscribeFrom() {
    // resume: where each known session was left (AEP-0003 §3.3); cold: all
    if (!S.everConnected) return 'all';
    const from = [];
    for (const s of S.sessions.values()) if (s.pos) from.push({ session: s.id, epoch: s.pos[0], seq: s.pos[1] });
    return from.length ? from : 'all';
  }

  // the sessions the relay holds that the resumed subscription does not name:
  // replayed whole on a second subscription (deduplicated; their live events
  // then come twice until the next reconnect, and dedupe drops the copy)
  function catchUp(filter) {
    S.catchups++;
    S.catchupFilter = filter;
    send({ type: 'subscribe', id: 'catchup', filter, from: 'all' });
  }

  function frame(text) {
    let msg;
    try { msg = JSON.parse(text); } catch (e) { return; }
    if (!msg || typeof msg !== 'object') return;
    const t = msg.type;
    if (typeof t === 'string' && t.includes('.')) { onEvent(msg, text); return; }
    if (t === 'hello') {
      S.caps = msg.capabilities && typeof msg.capabilities === 'object' ? msg.capabilities : {};
      const from = subscribeFrom();
      send({ type: 'subscribe', id: 'console', filter: {}, from });
      // resumed from positions: a session the relay began (or began and ended)
      // while we were away has none; once subscribed we ask which it holds
      S.resumeSet = Array.isArray(from) ? new Set(from.map((p) => p.session)) : null;
      S.live = true; S.everConnected = true; S.backoff = 500; S.hellos++;
      setConn('live', 'ok');
      send({ type: 'roster', id: 'r-' + Date.now() });
      mark('inbox', 'controls');
    } else if (t === 'ping') {
      send({ type: 'pong', t: msg.t });
    } else if (t === 'subscribed' && msg.id === 'console' && S.resumeSet) {
      // (after "subscribed": the subscription is in place, so every session the
      // relay holds from here on either is in the answer or reaches us live)
      if (S.caps.experimental && typeof S.caps.experimental === 'object' && S.caps.experimental.sessions) {
        send({ type: 'sessions', id: 'h-' + Date.now() });
      } else { S.resumeSet = null; catchUp({}); }   // a relay without it: replay all, deduplicated
    } else if (t === 'sessions' && Array.isArray(msg.entries) && S.resumeSet) {
      const known = S.resumeSet;
      S.resumeSet = null;
      const missing = [];
      for (const e of msg.entries) if (e && typeof e.session === 'string' && !known.has(e.session)) missing.push(e.session);
      if (msg.complete === false || missing.length > MAX_CATCHUP) catchUp({});
      else if (missing.length) catchUp({ session: missing });
    } else if (t === 'roster' && Array.isArray(msg.entries)) {
      S.roster.clear();
      for (const e of msg.entries) {
        if (!e || typeof e.session !== 'string') continue;
        const ctl = e.control && typeof e.control === 'object' ? e.control : {};
        const acc = Array.isArray(ctl.accepts) ? ctl.accepts : [];
        S.roster.set(e.session, acc.filter((a) => typeof a === 'string'));
        if (Number.isInteger(ctl.ack_window_ms) && ctl.ack_window_ms > 0) S.windows.set(e.session, ctl.ack_window_ms);
      }
      mark('controls');
    } else if (t === 'error' && msg.id === 'console' && msg.code === 'limit-exceeded') {
      // more resume positions than the relay takes (AEP_MAX_FROM): replay all, deduplicated
      S.resumeSet = null;
      S.catchups++;
      send({ type: 'subscribe', id: 'console', filter: {}, from: 'all' });
    } else if (t === 'error' && msg.id === 'catchup' && S.catchupFilter.session) {
      catchUp({});   // the session list was too long a filter for the relay: replay all
    } else if (t === 'error' && typeof msg.cause === 'string' && S.cmds.has(msg.cause)) {
      // the relay refused a command on its target's behalf (AEP-0004 §4.2)
      settleCommand(msg.cause, 'refused by the relay: ' + String(msg.code) + (msg.detail ? ' (' + String(msg.detail) + ')' : ''), false);
    }
  }

  // ---- events -> state -------------------------------------------------------
  function session(id, agent) {
    let s = S.sessions.get(id);
    if (!s) {
      s = { id, agent: agent || '?', state: 'idle', last: '', count: 0, events: [], run: null,
            pos: null, pending: new Set(), ctl: [], unacked: null };
      S.sessions.set(id, s);
      mark('order');
      if (S.live && !S.roster.has(id)) rosterSoon();
    }
    return s;
  }
  const before = (a, b) => a[0] < b[0] || (a[0] === b[0] && a[1] < b[1]);
  let rosterTimer = null;
  function rosterSoon() {
    if (rosterTimer) return;
    rosterTimer = setTimeout(() => { rosterTimer = null; send({ type: 'roster', id: 'r-' + Date.now() }); }, 300);
  }

  function onEvent(ev, raw) {
    const key = String(ev.source) + '|' + String(ev.id);
    if (S.seen.has(key)) { S.dups++; return; }
    S.seen.add(key);
    if (S.seen.size > MAX_SEEN) {   // bounded: the oldest keys go first (a Set keeps insertion order)
      let drop = S.seen.size - MAX_SEEN + MAX_SEEN / 4;
      for (const k of S.seen) { if (drop-- <= 0) break; S.seen.delete(k); }
    }
    S.events++;
    mark('counts');
    const sid = typeof ev.session === 'string' ? ev.session : null;
    if (!sid) return;
    const s = session(sid, ev.agent);
    s.count++;
    if (typeof ev.time === 'string' && ev.time > s.last) { s.last = ev.time; mark('order'); }
    // (epoch, seq): AEP-0001 §7, epoch 0 when absent. Two subscriptions (a
    // catch-up beside the resumed one) may interleave a session's events: the
    // timeline goes by position and the state follows its newest event only
    const pos = Number.isInteger(ev.seq) ? [Number.isInteger(ev.epoch) ? ev.epoch : 0, ev.seq] : null;
    let at = s.events.length;
    if (pos) while (at > 0 && s.events[at - 1].pos && before(pos, s.events[at - 1].pos)) at--;
    if (at === s.events.length) s.events.push({ ev, raw, pos }); else s.events.splice(at, 0, { ev, raw, pos });
    // trimmed in chunks: one splice per 500 events past the cap, not one per event
    if (s.events.length > MAX_PER_SESSION + 500) s.events.splice(0, s.events.length - MAX_PER_SESSION);
    if (pos && (!s.pos || before(s.pos, pos))) s.pos = pos;
    const d = ev.data && typeof ev.data === 'object' ? ev.data : {};
    const newest = !pos || !s.spos || before(s.spos, pos);
    const lifecycle = ev.type.startsWith('session.') || ev.type.startsWith('run.');
    if (lifecycle && pos && newest) s.spos = pos;
    switch (lifecycle && !newest ? '' : ev.type) {
      case 'session.started': if (s.state === 'ended') s.state = 'idle'; break;
      case 'session.ended': s.state = 'ended'; break;
      case 'run.started': s.run = ev.run || s.run; s.state = 'running'; break;
      case 'run.finished': case 'run.failed': case 'run.cancelled':
        if (!ev.run || ev.run === s.run) s.run = null;
        if (s.state !== 'ended') s.state = 'idle';
        break;
      case 'attention.requested': onAsk(ev, s); break;
      case 'attention.answered': case 'attention.resolved': case 'attention.timeout':
        onOutcome(ev, d, s); break;
      case 'control.accepted': case 'control.rejected': onAck(ev, d); break;
      default: break;
    }
    // a run control's outcome: the domain event cause-linked to it in its target session (AEP-0004 §1, §6)
    const c = typeof ev.cause === 'string' ? S.cmds.get(ev.cause) : null;
    if (c && !c.ask && c.session === sid && !ev.type.startsWith('control.')) { s.ctl.push(c.verb + ' → ' + ev.type); mark('controls'); }
    if (s.state !== 'ended') {
      if (s.pending.size) s.state = 'waiting';
      else if (s.state === 'waiting') s.state = s.run ? 'running' : 'idle';
    }
    mark('sessions');
    if (sid === S.selected) mark('timeline');
  }

  function onAsk(ev, s) {
    const key = askKey(ev.source, s.id, ev.id);
    if (S.asks.has(key)) return;
    const ask = { ev, key, session: s.id, agent: ev.agent, lines: [], settled: false, busy: false, node: null,
                  seenAt: Date.now(), unacked: null };
    S.asks.set(key, ask);
    s.pending.add(key);
    mark('inbox');
    const early = S.early.get(key);
    if (early) { S.early.delete(key); for (const o of early) onOutcome(o, o.data && typeof o.data === 'object' ? o.data : {}, s); }
    if (ask.settled) return;
    if (S.live && document.hidden && 'Notification' in window && Notification.permission === 'granted') {
      const d = ev.data || {};
      try { new Notification('An agent asks: ' + String(ev.agent), { body: str(d.prompt || ev.subject), tag: String(ev.id) }); } catch (e) { /* not allowed here */ }
    }
  }

  function onOutcome(ev, d, s) {
    if (typeof ev.subject !== 'string') return;
    const key = askKey(ev.source, s.id, ev.subject);   // the ask of this emitter and session only
    const ask = S.asks.get(key);
    if (!ask) {   // its ask is still to come (replayed on another subscription): kept for it
      if (!S.early.has(key)) S.early.set(key, []);
      S.early.get(key).push(ev);
      if (S.early.size > MAX_EARLY) S.early.delete(S.early.keys().next().value);
      return;
    }
    if (ev.type === 'attention.answered') {
      ask.lines.push(['good', answeredText(d)]);
    } else if (ev.type === 'attention.resolved') {
      ask.lines.push(['good', 'resolved: ' + String(d.resolution || '')]);
      settleAsk(ask, s);
    } else {
      ask.lines.push(['bad', 'timed out']);
      settleAsk(ask, s);
    }
    mark('inbox');
  }
  function settleAsk(ask, s) {
    ask.settled = true; ask.busy = false;
    s.pending.delete(ask.key);
  }

  function onAck(ev, d) {   // its target's: in the command's session (AEP-0004 §6), an answer's from the ask's emitter
    const c = S.cmds.get(ev.cause);
    if (!c || ev.session !== c.session) return;
    if (c.ask && String(ev.source) !== String((S.asks.get(c.ask) || { ev: {} }).ev.source)) return;
    if (ev.type === 'control.accepted') settleCommand(ev.cause, 'accepted by the agent', true);
    else settleCommand(ev.cause, 'rejected: ' + String(d.reason || '') + (d.detail ? ' (' + String(d.detail) + ')' : ''), false);
  }
  function settleCommand(id, text, ok) {
    const c = S.cmds.get(id);
    if (!c || c.done) return;
    c.done = true;
    if (c.ask) {
      const ask = S.asks.get(c.ask);
      if (ask) {
        ask.lines.push([ok ? 'good' : 'bad', text]);
        ask.unacked = null; ask.busy = ok && !ask.settled;   // refused: a new answer is a new command
        mark('inbox');
      }
    } else {
      const s = S.sessions.get(c.session);
      if (s) {
        if (s.unacked && s.unacked.cmd.id === id) s.unacked = null;
        s.ctl.push((ok ? '' : '✗ ') + c.verb + ': ' + text); mark('controls');
      }
    }
  }

  // ---- commands ----------------------------------------------------------------
  function command(type, sess, extra, capture) {
    const cmd = { aep: '0.1', id: ulid(), type, time: new Date().toISOString(),
                  source: 'aep://' + (location.hostname || 'localhost') + '/agent/' + AGENT,
                  agent: AGENT, session: sess, capture: capture || 'metadata', ...extra };
    return cmd;
  }
  // the target's declared ack window (AEP-0004 §3; 10 s by default), bounded
  const ackWindow = (sess) => Math.min(Math.max(S.windows.get(sess) || 10000, 1000), 120000);

  // `control` is the control that sent it (a retry is a click on the same one)
  function answer(ask, ans, capture, label, control) {
    if (!canCommand() || ask.busy || ask.settled) return;
    // an answer not acknowledged within the window is retried as the SAME
    // command (AEP-0004 §2.3: the id is the idempotency key; the target
    // dedupes on (source, id) and re-sends its recorded ack), never a new one
    const again = ask.unacked;
    const cmd = again ? again.cmd : command('control.attention.respond', ask.session,
      { subject: ask.ev.id, cause: ask.ev.id, data: { answer: ans } }, capture);
    if (!again) {
      S.cmds.set(cmd.id, { ask: ask.key, session: ask.session, verb: cmd.type, sends: 0 });
      ask.sentWith = { label, control };
    }
    if (!send(cmd)) { ask.lines.push(['bad', 'not sent: the socket is down']); mark('inbox'); return; }
    const c = S.cmds.get(cmd.id);
    const n = ++c.sends;
    ask.busy = true; ask.unacked = null;
    ask.lines.push(['', (again ? 'sent again (the same command): ' : 'sent: ') + ask.sentWith.label]);
    mark('inbox');
    const ms = ackWindow(ask.session);
    setTimeout(() => {   // AEP-0004 §3: silence past the ack window reads as a timeout nack
      if (c.done || c.sends !== n || ask.settled) return;
      ask.busy = false; ask.unacked = { cmd };
      ask.lines.push(['bad', 'no acknowledgement within ' + (ms / 1000) + ' s: click "' + ask.sentWith.label
                      + '" again to send the same command again']);
      mark('inbox');
    }, ms);
  }
  function control(sess, verb) {
    if (!canCommand()) return;
    const s = S.sessions.get(sess);
    if (!s) return;
    // the same verb again after the window passed in silence: the same command (AEP-0004 §2.3)
    const again = s.unacked && s.unacked.verb === verb ? s.unacked.cmd : null;
    let cmd = again;
    if (!cmd) {
      const extra = {};
      if (verb === 'control.cancel') {
        extra.data = s.run ? { scope: 'run' } : { scope: 'session' };
        if (s.run) extra.run = s.run;
      } else extra.data = {};
      cmd = command(verb, sess, extra, 'metadata');
      S.cmds.set(cmd.id, { session: sess, verb, sends: 0 });
    }
    if (!send(cmd)) { s.ctl.push('✗ ' + verb + ': not sent: the socket is down'); mark('controls'); return; }
    const c = S.cmds.get(cmd.id);
    const n = ++c.sends;
    s.unacked = null;
    s.ctl.push((again ? 'sent again (the same command) ' : 'sent ') + verb);
    mark('controls');
    const ms = ackWindow(sess);
    setTimeout(() => {
      if (c.done || c.sends !== n) return;
      s.unacked = { cmd, verb };
      s.ctl.push('✗ ' + verb + ': no acknowledgement within ' + (ms / 1000) + ' s (click it again: the same command)');
      mark('controls');
    }, ms);
  }

  // ---- rendering -------------------------------------------------------------------
  function mark(...what) {
    for (const w of what) S.dirty.add(w);
    if (!S.timer) S.timer = setTimeout(render, 30);
  }
  function render() {
    S.timer = null;
    const d = S.dirty; S.dirty = new Set();
    if (d.has('order')) S.order = [...S.sessions.values()].sort((a, b) => (a.last < b.last ? 1 : a.last > b.last ? -1 : 0));
    if (d.has('counts') || d.has('order')) {
      $('session-count').textContent = String(S.sessions.size);
      $('event-count').textContent = S.events + ' events';
    }
    if (d.has('inbox')) renderInbox();
    if (d.has('sessions') || d.has('order')) renderSessions();
    if (d.has('timeline')) renderTimeline();
    if (d.has('controls') || d.has('timeline')) renderControls();
  }

  function askCard(ask) {
    const ev = ask.ev, d = ev.data && typeof ev.data === 'object' ? ev.data : {};
    const card = el('article', { class: 'card', tabindex: '0', 'data-ask': ev.id });
    card.append(el('div', { class: 'meta', text: [ev.agent, ev.session, d.kind, ev.subject, (ev.time || '').slice(11, 19)].filter(Boolean).join(' · ') }));
    card.append(el('div', { class: 'prompt', text: str(d.prompt, '(no prompt at this capture level)') }));
    const via = Array.isArray(d.respond_via) ? d.respond_via : null;
    const controllable = !via || via.includes('control');
    const dis = !canCommand() || ask.busy || ask.settled || !!ask.unacked;
    if (!controllable) card.append(el('div', { class: 'meta', text: 'answered in the agent\'s own UI (' + via.join(', ') + ')' }));
    else if (d.kind === 'form' && Array.isArray(d.fields)) {
      const f = formFields(ask, d.fields, dis, (values, text) => answer(ask, { values }, text ? 'redacted' : 'metadata', 'the form', f.querySelector('.send-form')));
      card.append(f);
    }
    else {
      const opts = Array.isArray(d.options) ? d.options : [];
      if (opts.length) {
        const row = el('div', { class: 'options' });
        for (const o of opts) {
          if (!o || typeof o !== 'object') continue;
          const b = el('button', { type: 'button', 'data-option': String(o.id), text: str(o.label ?? o.id), disabled: dis });
          b.addEventListener('click', () => answer(ask, { option: String(o.id) }, 'metadata', str(o.label ?? o.id), b));
          row.append(b);
        }
        card.append(row);
      }
      // AEP-0008: a text answer (a permission's refusing option with its reason)
      const ta = el('textarea', { class: 'answer-text', 'aria-label': 'Answer in words', placeholder: opts.length ? 'or answer in words (a refusal with your reason)' : 'your answer', disabled: dis });
      const go = el('button', { type: 'button', class: 'send-text', text: 'Send text', disabled: dis });
      go.addEventListener('click', () => { const t = ta.value.trim(); if (t) answer(ask, { text: t }, 'redacted', 'text', go); });
      card.append(ta, go);
    }
    const st = el('div', { class: 'status' });
    card.append(st);
    ask.node = card; ask.statusNode = st; ask.shown = 0; ask.dis = null;
    return card;
  }
  function refreshCard(ask) {
    // unacknowledged: only the control that sent it stays live (its click retries)
    const retry = ask.unacked && ask.sentWith ? ask.sentWith.control : null;
    const dis = !canCommand() || ask.busy || ask.settled || !!ask.unacked;
    const sig = dis + '|' + (retry && canCommand() ? 'r' : '');
    if (sig !== ask.dis) {
      ask.dis = sig;
      for (const c of ask.node.querySelectorAll('button, textarea, input')) c.disabled = dis && !(c === retry && canCommand());
    }
    while (ask.shown < ask.lines.length) {
      const [cls, text] = ask.lines[ask.shown++];
      ask.statusNode.append(el('div', { class: cls, text }));
    }
    ask.node.classList.toggle('settled', ask.settled);
  }
  function renderInbox() {
    const pending = [], settled = [];
    for (const a of S.asks.values()) (a.settled ? settled : pending).push(a);
    pending.sort((a, b) => (a.ev.time < b.ev.time ? -1 : 1));
    const shown = pending.slice(0, MAX_CARDS);
    const recent = settled.slice(-MAX_SETTLED).reverse();
    for (const a of [...shown, ...recent]) { if (!a.node) askCard(a); refreshCard(a); }
    for (const a of settled.slice(0, -MAX_SETTLED)) a.node = null;   // bounded: dropped from the DOM
    place($('inbox-list'), shown.map((a) => a.node));
    place($('settled-list'), recent.map((a) => a.node));
    $('inbox-count').textContent = String(pending.length);
    $('inbox-more').textContent = pending.length > MAX_CARDS ? (pending.length - MAX_CARDS) + ' more waiting' : (pending.length ? '' : 'Nothing waiting on you.');
  }

  let shownSessions = [];
  function renderSessions() {
    const q = $('session-filter').value.trim().toLowerCase();
    shownSessions = q ? S.order.filter((s) => s.agent.toLowerCase().includes(q) || s.id.toLowerCase().includes(q)
                                         || s.state === q) : S.order;
    virtual($('sessions-scroll'), $('sessions-spacer'), shownSessions.length, SROW, (i) => {
      const s = shownSessions[i];
      const row = el('div', { class: 'row srow' + (s.id === S.selected ? ' sel' : ''), 'data-session': s.id, role: 'button' },
        el('div', {}, el('span', { class: 'state-' + s.state, text: s.state }), ' ' + s.agent + ' · ' + s.id),
        el('div', { class: 'sub', text: s.count + ' events · ' + (s.last || '').replace('T', ' ').slice(0, 19) }));
      row.title = s.agent + ' · ' + s.id;
      return rowButton(row, () => select(s.id));
    }, 'data-session');
  }
  function select(id) {
    S.selected = id; S.detail = null;
    $('envelope').textContent = '';
    $('timeline-title').textContent = id;
    S.toEnd = true;   // a timeline opens at its newest line
    mark('sessions', 'timeline', 'controls');
  }
  function renderTimeline() {
    const s = S.sessions.get(S.selected);
    const evs = s ? s.events : [];
    const sc = $('timeline-scroll'), sp = $('timeline-spacer');
    // at the newest line (or just opened): stay there as lines arrive, like `tail -f`
    const follow = S.toEnd || sc.scrollTop + sc.clientHeight >= sp.offsetHeight - TROW;
    S.toEnd = false;
    if (follow) { sp.style.height = (evs.length * TROW) + 'px'; sc.scrollTop = sp.offsetHeight; }
    virtual(sc, sp, evs.length, TROW, (i) => {
      const { ev, raw } = evs[i];
      const row = el('div', { class: 'row trow' + (S.detail === raw ? ' sel' : ''), 'data-event': String(ev.id), role: 'button', text: timelineLine(ev) });
      return rowButton(row, () => {
        S.detail = raw;
        let pretty = raw;
        try { pretty = JSON.stringify(JSON.parse(raw), null, 2); } catch (e) { /* shown as sent */ }
        $('envelope').textContent = pretty;
        mark('timeline');
      });
    }, 'data-event');
  }
  function renderControls() {
    const box = $('controls');
    const s = S.sessions.get(S.selected);
    if (!s) { box.replaceChildren(); box.dataset.sig = ''; return; }
    const accepts = S.roster.get(s.id) || [];
    const verbs = ['control.cancel', 'control.pause', 'control.resume',
                   ...accepts.filter((a) => /^x\.[^.]+\.control\./.test(a))];
    // rebuilt only when what it shows changes (a focused button stays put)
    const sig = JSON.stringify([s.id, accepts, !!s.run, canCommand(), s.state === 'ended', s.ctl.slice(-3)]);
    if (box.dataset.sig === sig) return;
    box.dataset.sig = sig;
    const kids = [];
    for (const v of verbs) {
      if (!accepts.includes(v)) continue;   // offered only where the target's hello declares it
      const label = v === 'control.cancel' ? (s.run ? 'Cancel run' : 'Cancel session') : v.replace(/^(x\.[^.]+\.)?control\./, '');
      const b = el('button', { type: 'button', 'data-verb': v, text: label, disabled: !canCommand() || s.state === 'ended' });
      b.addEventListener('click', () => control(s.id, v));
      kids.push(b);
    }
    if (!kids.length) kids.push(el('span', { class: 'ctl-status', text: 'no run controls declared for this session' }));
    kids.push(el('span', { class: 'ctl-status', text: s.ctl.slice(-3).join(' · ') }));
    box.replaceChildren(...kids);
  }
  $('sessions-scroll').addEventListener('scroll', () => mark('sessions'));
  $('session-filter').addEventListener('input', () => { $('sessions-scroll').scrollTop = 0; mark('sessions'); });
  $('timeline-scroll').addEventListener('scroll', () => mark('timeline'));

  // ---- fleet (/healthz) ---------------------------------------------------------------
  function fleet(body) { $('fleet-list').replaceChildren(...fleetNodes(body)); }
  async function pollFleet() {
    if (S.mode === 'open' || S.token) {
      try { fleet(await health(S.token)); } catch (e) { /* the socket's state says it */ }
    }
    setTimeout(pollFleet, 2000);
  }

  installKeys();

  offerNotifications();

  start();
  pollFleet();
})();
