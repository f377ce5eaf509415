// aep-bridges console: virtualized lists (only the rows in view are in the DOM).
// a list row is a button for the keyboard too: focusable, Enter or Space acts
export function rowButton(row, act) {
  row.tabIndex = 0;
  row.addEventListener('click', act);
  row.addEventListener('keydown', (e) => {
    if ((e.key === 'Enter' || e.key === ' ') && e.target === row) { e.preventDefault(); act(); }
  });
  return row;
}
export function virtual(scroller, spacer, count, rowH, make, key) {
  spacer.style.height = (count * rowH) + 'px';
  const top = scroller.scrollTop, h = scroller.clientHeight || 400;
  const first = Math.max(0, Math.floor(top / rowH) - 5);
  const last = Math.min(count, Math.ceil((top + h) / rowH) + 5);
  const rows = [];
  for (let i = first; i < last; i++) { const r = make(i); r.style.top = (i * rowH) + 'px'; rows.push(r); }
  // the rows are rebuilt on every change: a focused row's successor takes its focus
  const had = document.activeElement;
  const focused = had && had.parentNode === spacer ? had.getAttribute(key) : null;
  spacer.replaceChildren(...rows);
  if (focused !== null) {
    const again = rows.find((r) => r.getAttribute(key) === focused);
    if (again) again.focus({ preventScroll: true });
  }
}

// `list`'s children made exactly `nodes`, in order, moving only what moved
export function place(list, nodes) {
  const want = new Set(nodes);
  for (const c of [...list.children]) if (!want.has(c)) c.remove();
  nodes.forEach((n, i) => { if (list.children[i] !== n) list.insertBefore(n, list.children[i] || null); });
}
