// aep-bridges console: the keyboard (the inbox without a mouse).
import { $ } from './dom.js';

// j/k move between asks, 1-9 pick an option, t writes an answer, Esc back to the card
export function installKeys() {
  document.addEventListener('keydown', (e) => {
    const tag = e.target && e.target.tagName;
    if (e.key === 'Escape') { const c = e.target.closest && e.target.closest('.card'); if (c) c.focus(); return; }
    if (tag === 'INPUT' || tag === 'TEXTAREA' || e.ctrlKey || e.metaKey || e.altKey) return;
    const cards = [...$('inbox-list').children];
    const cur = e.target.closest ? e.target.closest('.card') : null;
    const i = cur ? cards.indexOf(cur) : -1;
    if (e.key === 'j' || e.key === 'k') {
      const n = cards[Math.max(0, Math.min(cards.length - 1, i + (e.key === 'j' ? 1 : -1)))] || cards[0];
      if (n) { n.focus(); e.preventDefault(); }
    } else if (/^[1-9]$/.test(e.key) && cur) {
      const b = cur.querySelectorAll('.options button')[Number(e.key) - 1];
      if (b && !b.disabled) { b.click(); e.preventDefault(); }
    } else if (e.key === 't' && cur) {
      const f = cur.querySelector('textarea, input');
      if (f) { f.focus(); e.preventDefault(); }
    }
  });
}
