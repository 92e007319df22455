'use strict';
// ursula-sqlite: replicated SQLite databases on Ursula streams, on better-sqlite3.
//
// It loads Ursula's SQLite extension (libursula_vfs.so) into better-sqlite3's SQLite,
// attaches a local file to a stream with ursula_attach and opens it with the ursula VFS:
// every commit returns only after the stream acknowledged it. The extension is found
// through SQLITE_URSULA_VFS or URSULA_VFS_EXTENSION (a path; the first is the name other
// packagings of the extension read) or the repository's bin/libursula_vfs.so.
//
// Entries: this one (better-sqlite3, any Node from 20), ./node-sqlite (node:sqlite, where
// the running Node has it with extension loading) and ./pi (the Pi Durable adapter).

const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
// better-sqlite3 is needed by this entry's connections only: the ./node-sqlite and ./pi
// entries reuse its errors and naming without it.
const Database = (() => {
  try {
    return require('better-sqlite3');
  } catch {
    return null;
  }
})();

// ---- errors (checklist W) -----------------------------------------------------------------

class UrsulaError extends Error {
  constructor(message, { kind = null, action, reason, fenced = false, cause } = {}) {
    super(message, cause ? { cause } : undefined);
    this.name = this.constructor.name;
    this.kind = kind;
    this.action = action || this.constructor.defaultAction;
    this.reason = reason === undefined ? message : reason;
    this.fenced = fenced;
    if (cause) {
      this.code = cause.code;
      this.errcode = extendedCode(cause.code);
      this.errstr = cause.message;
    }
  }
}
UrsulaError.defaultAction = 'fix';

class UrsulaWriteRefusedError extends UrsulaError {}
UrsulaWriteRefusedError.defaultAction = 'retry';
class UrsulaPaymentRequiredError extends UrsulaWriteRefusedError {}
UrsulaPaymentRequiredError.defaultAction = 'retry';
class UrsulaReplicationError extends UrsulaError {}
UrsulaReplicationError.defaultAction = 'fix';
class UrsulaReattachError extends UrsulaReplicationError {}
UrsulaReattachError.defaultAction = 'reattach';
class UrsulaFencedError extends UrsulaReplicationError {}
UrsulaFencedError.defaultAction = 'stop';
class UrsulaSetupError extends UrsulaError {}
UrsulaSetupError.defaultAction = 'fix';

// better-sqlite3 names SQLite's extended result codes; the numbers of the ones used here.
const CODES = {
  SQLITE_ERROR: 1, SQLITE_AUTH: 23, SQLITE_CANTOPEN: 14, SQLITE_READONLY: 8, SQLITE_IOERR: 10,
  SQLITE_IOERR_READ: 266, SQLITE_IOERR_WRITE: 778, SQLITE_IOERR_AUTH: 7178,
};
function extendedCode(name) {
  return CODES[name] === undefined ? null : CODES[name];
}

const REFUSED = new Set(['unauthorized', 'forbidden', 'rate_limited', 'not_applied', 'unreachable', 'refused', 'unavailable']);
const REATTACH = new Set(['outcome_unknown', 'local_damage', 'local_state', 'internal', 'poisoned', 'damaged']);
const SETUP = new Set(['invalid_argument', 'invalid_url', 'invalid_name', 'not_found', 'in_use', 'unreplicated_file',
  'other_stream', 'unsupported', 'stream_state', 'not_attached', 'local_setup', 'attach_failed']);

function errorClass(kind, setup) {
  if (kind === 'payment_required') return UrsulaPaymentRequiredError;
  if (REFUSED.has(kind) || kind === 'too_large') return UrsulaWriteRefusedError;
  if (kind === 'fenced') return UrsulaFencedError;
  if (REATTACH.has(kind)) return UrsulaReattachError;
  if (setup && SETUP.has(kind)) return UrsulaSetupError;
  return UrsulaReplicationError;
}
function actionFor(cls, kind) {
  return kind === 'too_large' ? 'fix' : cls.defaultAction;
}

const FN_ERROR = /^(ursula_\w+): ([a-z_]+): ([\s\S]*)$/;
function fromFunctionError(e) {
  const m = FN_ERROR.exec(e && e.message);
  if (!m) return e;
  const [, fn, kind, msg] = m;
  const cls = errorClass(kind, fn === 'ursula_attach' || fn === 'ursula_lazy_open' || kind === 'not_attached' || kind === 'attach_failed');
  return new cls(e.message, { kind, action: actionFor(cls, kind), reason: msg, fenced: kind === 'fenced', cause: e });
}

// ---- the extension --------------------------------------------------------------------------

// extensionPath: SQLITE_URSULA_VFS, else its alias URSULA_VFS_EXTENSION, else the repository's build.
function extensionPath() {
  return process.env.SQLITE_URSULA_VFS || process.env.URSULA_VFS_EXTENSION ||
    path.resolve(__dirname, '..', '..', '..', 'bin', 'libursula_vfs.so');
}

let loader = null;
// loadUrsulaVfs loads the extension once per process and returns the connection that
// loaded it (the SQL functions live there). From then on ursula is the default VFS.
function loadUrsulaVfs() {
  if (loader) return loader;
  if (!Database) {
    throw new UrsulaSetupError('better-sqlite3 is not installed: run `npm ci` here, or use the ./node-sqlite entry', { kind: 'local_setup' });
  }
  const p = extensionPath();
  if (!fs.existsSync(p)) {
    throw new UrsulaSetupError(`the Ursula SQLite extension is not at ${p}: run \`make extension\` or set URSULA_VFS_EXTENSION`, { kind: 'local_setup' });
  }
  const db = new Database(':memory:');
  db.loadExtension(p);
  loader = db;
  return db;
}

function call(sql, ...args) {
  const db = loadUrsulaVfs();
  try {
    return db.prepare(sql).pluck().get(...args);
  } catch (e) {
    throw fromFunctionError(e);
  }
}

function absPath(p) {
  if (typeof p !== 'string' || p === '' || p === ':memory:' || p.startsWith('file:')) {
    throw new UrsulaSetupError(`the file must be a plain file path (not ${JSON.stringify(p)})`, { kind: 'invalid_argument' });
  }
  return path.resolve(p);
}

// attach attaches the file at file to the stream at url (no connection may have it open
// yet) and returns the offset the file reflects, as a string.
function attach(file, url, { readOnly = false } = {}) {
  const p = absPath(file);
  return readOnly ? call('SELECT ursula_attach(?, ?, ?)', p, url, 'read_only') : call('SELECT ursula_attach(?, ?)', p, url);
}

// status is the replication state of an attached file; error is null while writes go through.
function status(file) {
  const st = JSON.parse(call('SELECT ursula_status(?)', absPath(file)));
  if (st.error === undefined) st.error = null;
  return st;
}

// stats: drains the measurements of an attached file (ursula_stats; see the README).
function stats(file) {
  return JSON.parse(call('SELECT ursula_stats(?)', absPath(file)));
}

// setToken sets the process-wide bearer token (null clears it).
function setToken(token) {
  call('SELECT ursula_set_token(?)', token === undefined ? null : token);
}

// ---- local file naming (checklist H; the same bytes as vfs.DefaultFileName) -------------------

const SAFE = new Set(Buffer.from('abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~$&+:=@'));

function segments(p) {
  const out = [];
  for (const s of p.split('/')) {
    if (s === '' || s === '.') continue;
    if (s === '..') { out.pop(); continue; }
    out.push(s);
  }
  return out.map((s) => {
    if (/%(?![0-9A-Fa-f]{2})/.test(s)) return Buffer.from(s, 'utf8');
    const bytes = [];
    const raw = Buffer.from(s, 'utf8');
    for (let i = 0; i < raw.length; i++) {
      if (raw[i] === 0x25) { bytes.push(parseInt(raw.subarray(i + 1, i + 3).toString(), 16)); i += 2; } else bytes.push(raw[i]);
    }
    return Buffer.from(bytes);
  });
}

function escapeSegment(b) {
  let s = '';
  for (const c of b) s += SAFE.has(c) ? String.fromCharCode(c) : '%' + c.toString(16).toUpperCase().padStart(2, '0');
  return s;
}

function splitURL(url) {
  const m = /^([A-Za-z][A-Za-z0-9+.-]*):\/\/([^/?#]*)([^?#]*)/.exec(url);
  if (!m) throw new UrsulaSetupError(`stream URL ${JSON.stringify(url)} does not parse`, { kind: 'invalid_url' });
  let host = m[2].replace(/^.*@/, '');
  let port = null;
  const hp = /^(\[[^\]]*\]|[^:]*)(?::(\d*))?$/.exec(host);
  if (hp) { host = hp[1]; port = hp[2] ? String(parseInt(hp[2], 10)) : null; }
  return { scheme: m[1].toLowerCase(), host: host.replace(/^\[|\]$/g, '').toLowerCase(), port, path: m[3] };
}

function canonicalNode(scheme, node) {
  const m = /^(?:\[([0-9A-Fa-f:.%]+)\]|([A-Za-z0-9._~%-]+))(?::([0-9]+))?$/.exec(node);
  const port = m && m[3] !== undefined ? parseInt(m[3], 10) : null;
  if (!m || (port !== null && (port < 1 || port > 65535))) {
    throw new UrsulaSetupError(`stream URL node ${JSON.stringify(node)} is not host:port`, { kind: 'invalid_url' });
  }
  let host = (m[1] || m[2]).toLowerCase();
  if (m[1]) host = `[${host}]`;
  if (port !== null && String(port) !== ({ http: '80', https: '443' })[scheme]) host += ':' + port;
  return host;
}

// canonicalURL is the one spelling of a stream URL that names its local file (the same
// bytes as the Go vfs package). A URL naming several nodes of a cluster lists them
// sorted, so the same nodes in another order name the same file.
function canonicalURL(url) {
  const nl = /^([A-Za-z][A-Za-z0-9+.-]*):\/\/([^/?#]*,[^/?#]*)([\s\S]*)$/.exec(url);
  if (nl) {
    const scheme = nl[1].toLowerCase();
    const names = nl[2].split(',').map((n) => canonicalNode(scheme, n)).sort();
    const rest = canonicalURL(`${scheme}://node${nl[3]}`);
    return `${scheme}://${names.join(',')}${rest.slice(`${scheme}://node`.length)}`;
  }
  const u = splitURL(url);
  let host = u.host.includes(':') ? `[${u.host}]` : u.host;
  if (u.port && !(u.scheme === 'http' && u.port === '80') && !(u.scheme === 'https' && u.port === '443')) host += ':' + u.port;
  return `${u.scheme}://${host}/` + segments(u.path).map(escapeSegment).join('/');
}

function defaultFileName(url) {
  const canon = canonicalURL(url);
  const segs = segments(canon.slice(canon.indexOf('/', canon.indexOf('://') + 3))).slice(-2);
  let label = 'stream';
  if (segs.length) {
    label = segs.map((b) => b.toString('utf8')).join('-').toLowerCase().replace(/[^a-z0-9_-]+/g, '_');
    if (label.startsWith('-')) label = '_' + label.slice(1);
    label = label.slice(0, 64);
  }
  return `${label}-${crypto.createHash('sha256').update(canon).digest('hex').slice(0, 32)}.db`;
}

function cacheDir() {
  let base = process.env.XDG_CACHE_HOME || '';
  if (!path.isAbsolute(base)) {
    let home = process.env.HOME || '';
    if (!path.isAbsolute(home)) home = os.userInfo().homedir || '';
    if (!path.isAbsolute(home)) {
      throw new UrsulaSetupError('no cache directory (set XDG_CACHE_HOME or HOME), so pass dir or path', { kind: 'local_setup' });
    }
    base = path.join(home, '.cache');
  }
  return path.join(base, 'sqlite-ursula');
}

function localPath(url, { dir, readOnly = false } = {}) {
  const d = dir === undefined ? cacheDir() : dir;
  fs.mkdirSync(d, { recursive: true, mode: 0o700 });
  const name = defaultFileName(url);
  if (!readOnly) return path.resolve(d, name);
  return path.resolve(d, name.slice(0, -3) + '-ro1.db');
}

function attachedHere(p) {
  try {
    status(p);
    return true;
  } catch {
    return false;
  }
}

// attachReadOnlyCopy attaches the first of <label>-<hash>-ro1..-ro8.db that neither this
// process (attached here) nor another one (in_use: its lock file is held) has.
function attachReadOnlyCopy(url, dir) {
  const first = localPath(url, { dir, readOnly: true });
  for (let n = 1; n <= 8; n++) {
    const p = first.replace(/-ro1\.db$/, `-ro${n}.db`);
    if (attachedHere(p)) continue;
    try {
      attach(p, url, { readOnly: true });
      return p;
    } catch (e) {
      if (e instanceof UrsulaSetupError && e.kind === 'in_use') continue;
      throw e;
    }
  }
  throw new UrsulaSetupError(`eight read-only copies of ${url} are open already: pass dir or path`, { kind: 'in_use' });
}

// ---- connections ------------------------------------------------------------------------------

function translate(db, e) {
  if (!e || e instanceof UrsulaError || typeof e.code !== 'string' || !db.ursulaPath) return e;
  if (!/^SQLITE_(IOERR|AUTH|CANTOPEN)/.test(e.code)) return e;
  let st;
  try {
    st = status(db.ursulaPath);
  } catch (se) {
    return se instanceof UrsulaError ? se : e;
  }
  const err = st.error || {};
  if (e.code === 'SQLITE_IOERR_READ' && (st.fenced || st.poisoned)) {
    const kind = st.fenced ? 'fenced' : err.kind || 'outcome_unknown';
    const cls = errorClass(kind);
    return new cls(`read refused, the file is ${kind === 'fenced' ? 'fenced' : 'poisoned'}: ${err.message || ''}`,
      { kind, action: actionFor(cls, kind), reason: err.message || '', fenced: !!st.fenced, cause: e });
  }
  if (!st.error) return e;
  const cls = errorClass(err.kind);
  return new cls(`commit not replicated: ${err.message} (${err.kind})`,
    { kind: err.kind, action: err.action || actionFor(cls, err.kind), reason: err.message, fenced: !!st.fenced, cause: e });
}

// A failed commit rolls its transaction back, so a helper's cleanup ROLLBACK (drizzle and
// the like run one on any error) would fail with "cannot rollback - no transaction is
// active" and hide the UrsulaError (checklist-vfs W207). After an UrsulaError, the next
// ROLLBACK run as a prepared statement with no transaction open succeeds as a no-op; one
// run through exec, and a ROLLBACK TO or RELEASE whose savepoint went with the
// transaction, rethrows the UrsulaError instead.
const ROLLBACK = /^\s*ROLLBACK(\s+TRANSACTION)?\s*;?\s*$/i;
const ENDS_SAVEPOINT = /^\s*(ROLLBACK(\s+TRANSACTION)?\s+TO\b|RELEASE\b)/i;
const NOTHING_TO_END = /no transaction is active|no such savepoint/;

function noted(db, err) {
  if (err instanceof UrsulaError) db.ursulaLastError = err;
  return err;
}

// afterUrsulaError answers a failed cleanup statement sql after an UrsulaError: null for
// the no-op, the UrsulaError to rethrow, or undefined when the rule does not apply.
function afterUrsulaError(db, sql, e, prepared) {
  const last = db.ursulaLastError;
  if (!last || typeof sql !== 'string' || db.inTransaction || !NOTHING_TO_END.test(e && e.message)) return undefined;
  if (prepared && ROLLBACK.test(sql)) {
    db.ursulaLastError = null;
    return null;
  }
  if (ROLLBACK.test(sql) || ENDS_SAVEPOINT.test(sql)) {
    db.ursulaLastError = null;
    return last;
  }
  return undefined;
}

function guard(db, fn, sql) {
  return function guarded(...args) {
    try {
      return fn.apply(this, args);
    } catch (e) {
      const after = afterUrsulaError(db, sql, e, true);
      if (after === null) return { changes: 0, lastInsertRowid: 0 };
      if (after) throw after;
      throw noted(db, translate(db, e));
    }
  };
}

// UrsulaDatabase is a better-sqlite3 Database of an attached file whose failed commits and
// reads (exec, and run/get/all/iterate of its statements) throw UrsulaError subclasses.
class UrsulaDatabase extends (Database || class {}) {
  prepare(sql) {
    const st = super.prepare(sql);
    const db = this;
    const proxy = new Proxy(st, {
      get(target, prop) {
        const v = target[prop];
        if (typeof v !== 'function') return v;
        if (prop === 'run' || prop === 'get' || prop === 'all') return guard(db, v.bind(target), sql);
        if (prop === 'iterate') {
          return (...args) => {
            const it = guard(db, v.bind(target), sql)(...args);
            return { next: guard(db, it.next.bind(it), sql), return: it.return.bind(it), [Symbol.iterator]() { return this; } };
          };
        }
        return (...args) => {
          const r = v.apply(target, args);
          return r === target ? proxy : r;
        };
      },
    });
    return proxy;
  }

  exec(sql) {
    try {
      return super.exec(sql);
    } catch (e) {
      const after = afterUrsulaError(this, sql, e, false);
      if (after) throw after;
      throw noted(this, translate(this, e));
    }
  }

  pragma(...args) {
    return guard(this, super.pragma).apply(this, args);
  }

  // transaction's BEGIN/COMMIT are better-sqlite3's own statements: translate their errors too.
  transaction(fn) {
    const t = super.transaction(fn);
    const g = guard(this, t);
    for (const k of ['deferred', 'immediate', 'exclusive']) g[k] = guard(this, t[k]);
    g.default = g;
    return g;
  }
}

// open attaches a local file to the stream at url and opens it with better-sqlite3 in WAL
// mode. options: path, dir (without path: <label>-<hash>.db in dir or the user's cache
// directory), readOnly, and better-sqlite3's own options.
function open(url, options = {}) {
  const { path: file, dir, readOnly = false, ...dbOptions } = options;
  loadUrsulaVfs();
  let p;
  if (file === undefined && readOnly) {
    p = attachReadOnlyCopy(url, dir);
  } else {
    p = file === undefined ? localPath(url, { dir }) : absPath(file);
    attach(p, url, { readOnly });
  }
  let db;
  try {
    db = new UrsulaDatabase(p, { ...dbOptions, readonly: readOnly, fileMustExist: readOnly });
  } catch (e) {
    throw new UrsulaSetupError(`cannot open ${p}: ${e.message}`, { kind: 'local_setup', cause: e });
  }
  db.ursulaPath = p;
  return db;
}

let lazyNames = 0;

// openLazy opens the database replicated on the stream at url lazily and read-only: no
// local copy, pages are fetched on demand (the extension's ursula-lazy source). options:
// at (a stream offset: the database as of it; default the tail now), follow (each new
// read transaction sees the latest commits; not with at), cacheMb (the page cache bound,
// default 64), and better-sqlite3's own options. A bad URL, a missing stream or an
// unreadable offset throws an UrsulaSetupError here. db.ursulaOffset is the offset read.
function openLazy(url, options = {}) {
  const { at = null, follow = false, cacheMb = null, ...dbOptions } = options;
  loadUrsulaVfs();
  // A name that never exists on disk: ursula_lazy_open makes the ursula VFS serve it.
  const name = path.join(os.tmpdir(), `ursula-lazy-${process.pid}-${++lazyNames}.db`);
  const offset = call('SELECT ursula_lazy_open(?, ?, ?, ?, ?)', name, url,
    at === null || at === undefined ? null : String(at), follow ? '1' : null,
    cacheMb === null || cacheMb === undefined ? null : String(cacheMb));
  let db;
  try {
    db = new UrsulaDatabase(name, { ...dbOptions, readonly: true });
  } catch (e) {
    throw new UrsulaSetupError(`cannot open ${url} lazily: ${e.message}`, { kind: 'local_setup', cause: e });
  }
  db.ursulaOffset = offset;
  return db;
}

module.exports = {
  open, openLazy, attach, status, stats, setToken, loadUrsulaVfs, extensionPath,
  localPath, canonicalURL, defaultFileName,
  // for the ./node-sqlite and ./pi entries, not an API
  internal: { absPath, fromFunctionError, errorClass, actionFor },
  UrsulaError, UrsulaWriteRefusedError, UrsulaPaymentRequiredError, UrsulaReplicationError,
  UrsulaReattachError, UrsulaFencedError, UrsulaSetupError, UrsulaDatabase,
};
