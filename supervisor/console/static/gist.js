// aep-bridges console: the one-line gists of `aep-bridges tail`
// (supervisor/tail.py `gist`), ported family by family; the tests compare
// the two line for line.
function short(v, limit = 60) {
  const text = (typeof v === 'string' ? v : JSON.stringify(v)).split(/\s+/).filter(Boolean).join(' ');
  return text.length <= limit ? text : text.slice(0, limit - 1) + '…';
}
const obj = (v) => (v && typeof v === 'object' && !Array.isArray(v) ? v : {});
const ms = (d) => (typeof d.duration_ms === 'number' ? ' (' + d.duration_ms + ' ms)' : '');
function toolName(d) { const t = d.tool; return t && typeof t === 'object' ? String(t.name || '?') : String(t || '?'); }
function optionsGist(d) {
  if (!Array.isArray(d.options) || !d.options.length) {
    if (Array.isArray(d.fields) && d.fields.length) return '  {' + d.fields.filter((f) => f && typeof f === 'object').map((f) => String(f.label || f.id)).join(', ') + '}';
    return '';
  }
  return '  [' + d.options.filter((o) => o && typeof o === 'object').map((o) => String(o.id || o.label)).join('|') + ']';
}
function familyGist(type, d) {
  switch (type) {
    case 'tool.requested': return toolName(d) + ' requested';
    case 'tool.completed': return toolName(d) + ' ✓ ' + (d.status || 'completed') + ms(d);
    case 'tool.failed': {
      const e = d.error; const m = e && typeof e === 'object' ? (e.message || e.type) : e;
      return toolName(d) + ' ✗ failed' + (m ? ': ' + short(m) : '') + ms(d);
    }
    case 'tool.denied': return toolName(d) + ' ⊘ denied' + (d.by ? ' by ' + d.by : '');
    case 'run.started': return 'started' + (d.trigger ? ' (' + d.trigger + ')' : '');
    case 'run.finished': return 'finished ok' + ms(d);
    case 'run.failed': return 'failed: ' + (d.reason || '?') + ms(d);
    case 'run.cancelled': return 'cancelled' + (d.by ? ' by ' + d.by : '');
    case 'attention.requested': return (d.kind || 'ask') + ': ' + short(d.prompt || '') + optionsGist(d);
    case 'attention.answered': {
      const a = d.answer; const v = a && typeof a === 'object' ? (a.option || a.text || a.values) : a;
      return 'answered ' + short(v === undefined ? null : v, 40) + (d.via ? ' via ' + d.via : '');
    }
    case 'attention.resolved': return 'resolved: ' + (d.resolution || '?');
    case 'attention.timeout': return 'timed out';
    case 'session.started': {
      const c = obj(d.client);
      return 'started ' + [String(c.name || ''), String(d['gen_ai.request.model'] || ''), String(d.label || '')].filter(Boolean).join(' ');
    }
    case 'session.ended': return ('ended ' + (d.reason || '')).trimEnd();
    default: return null;
  }
}
export function gist(ev) {
  const type = String(ev.type || '?');
  const d = obj(ev.data);
  let out;
  try {
    out = familyGist(type, d);
    if (out === null) {
      if (type === 'control.rejected') out = 'rejected: ' + (d.reason || '?');
      else if (type.startsWith('control.')) out = (type.slice(8) + ' → ' + (ev.subject || '')).replace(/[ →]+$/, '');
      else if (type === 'error.raised') { const e = obj(d.error); out = short(e.message || e.type || d.code || 'error'); }
      else if (type === 'progress.status') out = short(d.message || d.phase || '');
      else if (type.startsWith('progress.task.')) { const t = obj(d.task); out = type.slice(14) + ': ' + short(t.title || t.id || ''); }
      else {
        out = Object.entries(d).filter(([, v]) => v !== null && v !== undefined).slice(0, 4).map(([k, v]) =>
          (k === 'tool' && v && typeof v.name === 'string' ? 'tool=' + short(v.name, 30)
            : Array.isArray(v) ? short(k, 30) + '[' + v.length + ']'
            : typeof v === 'object' ? short(k, 30) + '{' + Object.keys(v).length + '}'
            : short(k, 30) + '=' + short(String(v), 30))).join(' ');
      }
    }
  } catch (e) { out = short(d); }
  if (!out && typeof ev.subject === 'string') out = short(ev.subject);
  return out;
}
export function timelineLine(ev) {
  const t = typeof ev.time === 'string' && ev.time.includes('T') ? ev.time.split('T')[1].slice(0, 12) : '?';
  return (t + '  ' + String(ev.type) + '  ' + gist(ev)).slice(0, 400);
}
