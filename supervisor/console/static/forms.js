// aep-bridges console: AEP-0006 forms rendered from `field_spec` (string,
// number with min/max, boolean, select single or multi with `other` free
// text), checked as the spec says before anything is sent.
import { el, str } from './dom.js';

export function formFields(ask, fields, disabled, submit) {
  const box = el('div', { class: 'form' });
  const inputs = [];
  fields.forEach((f, i) => {
    if (!f || typeof f !== 'object') return;
    const fid = String(f.id);
    const name = 'field-' + i;
    const wrap = el('div', { class: 'field', 'data-field': fid });
    const label = str(f.label ?? fid) + (f.required ? ' *' : '');
    if (f.type === 'boolean') {
      const cb = el('input', { type: 'checkbox', id: name + '-' + ask.ev.id, name });
      wrap.append(el('label', { for: cb.id }, cb, ' ' + label));
      inputs.push({ f, read: () => ({ ok: true, value: cb.checked }), nodes: [cb] });
    } else if (f.type === 'select') {
      const choices = Array.isArray(f.choices) ? f.choices : [];
      const multi = !!f.multi;
      wrap.append(el('div', { text: label }));
      const boxes = choices.map((c, j) => {
        const inp = el('input', { type: multi ? 'checkbox' : 'radio', name: name + '-' + ask.ev.id,
                                  value: String(c.id), id: name + '-' + j + '-' + ask.ev.id });
        wrap.append(el('label', { for: inp.id }, inp, ' ' + str(c.label ?? c.id)));
        return inp;
      });
      let other = null;
      if (f.other) {
        other = el('input', { type: 'text', placeholder: 'other (free text)', 'aria-label': label + ' (other)',
                              class: 'other' });
        wrap.append(other);
      }
      inputs.push({ f, nodes: [...boxes, ...(other ? [other] : [])], read: () => {
        const picked = boxes.filter((b) => b.checked).map((b) => b.value);
        const o = other && other.value.trim() ? other.value.trim() : null;
        if (multi) {
          const v = o ? [...picked, o] : picked;
          if (f.required && !v.length) return { ok: false, why: 'pick at least one' };
          return { ok: true, value: v, skip: !v.length, text: !!o };
        }
        if (o && picked.length) return { ok: false, why: 'pick a choice or write another answer, not both' };
        const v = o || picked[0];
        if (v === undefined) return f.required ? { ok: false, why: 'pick one' } : { ok: true, skip: true };
        return { ok: true, value: v, text: !!o };
      } });
    } else {
      const inp = el('input', { type: 'text', name, 'aria-label': label,
                                inputmode: f.type === 'number' ? 'decimal' : null });
      wrap.append(el('label', {}, label, inp));
      inputs.push({ f, nodes: [inp], read: () => {
        const raw = inp.value.trim();
        if (!raw) return f.required ? { ok: false, why: 'required' } : { ok: true, skip: true };
        if (f.type !== 'number') return { ok: true, value: inp.value, text: true };
        const n = Number(raw);
        if (!Number.isFinite(n)) return { ok: false, why: 'not a number' };
        if (typeof f.min === 'number' && n < f.min) return { ok: false, why: 'at least ' + f.min };
        if (typeof f.max === 'number' && n > f.max) return { ok: false, why: 'at most ' + f.max };
        return { ok: true, value: n };
      } });
    }
    box.append(wrap);
  });
  const err = el('div', { class: 'form-error', role: 'alert' });
  const go = el('button', { type: 'button', class: 'send-form', text: 'Send answer',
                            disabled });
  go.addEventListener('click', () => {
    const values = {}; const problems = []; let text = false;
    for (const it of inputs) {
      const r = it.read();
      for (const n of it.nodes) n.removeAttribute('aria-invalid');
      if (!r.ok) { problems.push(str(it.f.label ?? it.f.id) + ': ' + r.why); for (const n of it.nodes) n.setAttribute('aria-invalid', 'true'); continue; }
      if (!r.skip) { values[String(it.f.id)] = r.value; if (r.text) text = true; }
    }
    err.textContent = problems.join('; ');
    if (problems.length) return;
    submit(values, text);
  });
  box.append(err, go);
  return box;
}
