// aep-bridges console: DOM helpers. Every string becomes a text node or an
// attribute value, never markup (nothing in the console parses data as HTML).
export const $ = (id) => document.getElementById(id);

export function el(tag, props, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'text') e.textContent = String(v);
    else if (k === 'class') e.className = v;
    else if (k === 'on') for (const [ev, fn] of Object.entries(v)) e.addEventListener(ev, fn);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of kids) if (c !== null && c !== undefined) e.append(c);  // strings become text nodes
  return e;
}

// A payload value as the text a person reads: a string as it is, a missing
// one as `fallback`, anything else (a malformed event's object or array) as
// its JSON, never "[object Object]".
export function str(v, fallback = '') {
  if (v === undefined || v === null) return fallback;
  if (typeof v === 'string') return v;
  if (typeof v === 'object') { try { return JSON.stringify(v); } catch (e) { return '?'; } }
  return String(v);
}

// an `attention.answered`'s data as a card line
export function answeredText(d) {
  const a = d.answer || {};
  const parts = [];
  if (a.option !== undefined) parts.push('option ' + String(a.option));
  if (a.text !== undefined) parts.push('text "' + String(a.text) + '"');
  if (a.values !== undefined) parts.push('values ' + JSON.stringify(a.values));
  return 'answered: ' + (parts.join(', ') || '(no detail)') + (d.via ? ' via ' + String(d.via) : '');
}

// the "Notify me of new asks" button: the permission is asked once, on a click
export function offerNotifications() {
  if ('Notification' in window && Notification.permission === 'default') {
    const b = $('notify');
    b.hidden = false;
    b.addEventListener('click', () => { Notification.requestPermission().finally(() => { b.hidden = true; }); });
  }
}
