// aep-bridges console: ids and encodings (no DOM, no state).

// ---- ids (ULID: the command's idempotency key, AEP-0004 §2.3) -------------
const B32 = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';
export function ulid() {
  let t = Date.now(), time = '';
  for (let i = 0; i < 10; i++) { time = B32[t % 32] + time; t = Math.floor(t / 32); }
  const r = crypto.getRandomValues(new Uint8Array(16));
  let rand = '';
  for (let i = 0; i < 16; i++) rand += B32[r[i] % 32];
  return time + rand;
}

// the token as a WebSocket subprotocol (`aep.bearer.<base64url>`, no padding)
export function b64url(text) {
  let bin = '';
  for (const byte of new TextEncoder().encode(text)) bin += String.fromCharCode(byte);
  return btoa(bin).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

// an ask's identity: its emitter's source, its session, its id. An outcome
// settles only the ask its own emitter raised in its own session (AEP-0001
// §5.2: session identity is emitter-scoped; AEP-0002 §7: the emitter owns
// resolution), never one whose id another session's event names (issue 25)
export function askKey(source, session, id) {
  return JSON.stringify([String(source), String(session), String(id)]);
}
