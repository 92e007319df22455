'use strict';
// ursula-sqlite against a real server: the ursula binary (URSULA_BIN or the repository's
// bin/ursula, memory engine) on a free port, and the extension (URSULA_VFS_EXTENSION or
// bin/libursula_vfs.so). Run: node --test test/ (from bindings/node).

const { test, before, after } = require('node:test');
const assert = require('node:assert');
const { spawn, spawnSync, execFileSync } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const Database = require('better-sqlite3');
const ursula = require('..');

const REPO = path.resolve(__dirname, '..', '..', '..');
const URSULA = process.env.URSULA_BIN || path.join(REPO, 'bin', 'ursula');
let server;
let base;
let tmp;

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
    s.on('error', reject);
  });
}

async function waitPort(port) {
  for (let i = 0; i < 200; i++) {
    const ok = await new Promise((resolve) => {
      const c = net.connect(port, '127.0.0.1', () => { c.destroy(); resolve(true); });
      c.on('error', () => resolve(false));
    });
    if (ok) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error('server did not start');
}

before(async () => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'ursula-sqlite-test'));
  const port = await freePort();
  server = spawn(URSULA, ['server', '--engine', 'memory', '--listen', `127.0.0.1:${port}`, '--admin-listen', '127.0.0.1:0', '--data', path.join(tmp, 'data')], { stdio: 'ignore' });
  await waitPort(port);
  base = `http://127.0.0.1:${port}`;
});

after(() => {
  if (server) server.kill();
  fs.rmSync(tmp, { recursive: true, force: true });
});

function child(code, env = {}) {
  const r = spawnSync(process.execPath, ['-e', `const ursula = require(${JSON.stringify(path.resolve(__dirname, '..'))});\n${code}`],
    { env: { ...process.env, ...env }, encoding: 'utf8', timeout: 120000 });
  return r.stdout + r.stderr;
}

test('open, commit, several connections, status, export', () => {
  const url = `${base}/nodebind/notes`;
  const file = path.join(tmp, 'notes.db');
  const db = ursula.open(url, { path: file });
  assert.strictEqual(db.pragma('journal_mode', { simple: true }), 'wal');
  db.exec('CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT)');
  const ins = db.prepare('INSERT INTO notes(body) VALUES (?)');
  db.transaction(() => { for (let i = 0; i < 100; i++) ins.run(`n${i}`); })();
  const other = new Database(file);
  assert.strictEqual(other.prepare('SELECT count(*) FROM notes').pluck().get(), 100);
  other.close();
  const st = ursula.status(file);
  assert.strictEqual(st.fenced, false);
  assert.strictEqual(st.error, null);
  assert.ok(st.commits >= 2);
  const out = path.join(tmp, 'notes-export.db');
  execFileSync(URSULA, ['export', url, out], { stdio: 'ignore' });
  const e = new Database(out, { readonly: true });
  const q = 'SELECT count(*) AS n, group_concat(body) AS b FROM notes';
  assert.deepStrictEqual(e.prepare(q).get(), db.prepare(q).get());
  e.close();
  db.close();
});

test('read-only open reads and refuses writes', () => {
  const url = `${base}/nodebind/ro`;
  const w = ursula.open(url, { path: path.join(tmp, 'ro-owner.db') });
  w.exec('CREATE TABLE t(x); INSERT INTO t VALUES (1)');
  const r = ursula.open(url, { dir: path.join(tmp, 'ro'), readOnly: true });
  assert.match(r.name, /-ro1\.db$/);
  assert.strictEqual(r.prepare('SELECT count(*) FROM t').pluck().get(), 1);
  assert.throws(() => r.exec('INSERT INTO t VALUES (2)'), /readonly/);
  assert.strictEqual(ursula.status(r.name).read_only, true);
  const r2 = ursula.open(url, { dir: path.join(tmp, 'ro'), readOnly: true });
  assert.match(r2.name, /-ro2\.db$/);
  r2.close();
  r.close();
  w.close();
});

test('setup errors carry kind and action', () => {
  assert.throws(() => ursula.open(`${base}/nodebind/q?x=1`, { path: path.join(tmp, 'q.db') }),
    (e) => e instanceof ursula.UrsulaSetupError && e.kind === 'invalid_url' && e.action === 'fix');
  assert.throws(() => ursula.attach(':memory:', `${base}/nodebind/m`), (e) => e instanceof ursula.UrsulaSetupError && e.kind === 'invalid_argument');
  assert.throws(() => ursula.status(path.join(tmp, 'never.db')), (e) => e instanceof ursula.UrsulaSetupError && e.kind === 'not_attached');
  ursula.setToken('secret');
  ursula.setToken(null);
});

test('journal mode other than WAL is refused', () => {
  const db = ursula.open(`${base}/nodebind/journal`, { path: path.join(tmp, 'journal.db') });
  assert.throws(() => db.pragma('journal_mode = DELETE'), /stays in WAL mode/);
  assert.strictEqual(db.pragma('journal_mode', { simple: true }), 'wal');
  db.close();
});

test('a refused commit fails alone with 7178 and the file stays usable', () => {
  const out = child(`
const db = ursula.open(${JSON.stringify(`${base}/nodebind/big`)}, { path: ${JSON.stringify(path.join(tmp, 'big.db'))} });
db.exec('CREATE TABLE t(x)');
try {
  db.prepare('INSERT INTO t SELECT randomblob(4000) FROM (WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i<200) SELECT i FROM n)').run();
  console.log('no error');
} catch (e) {
  console.log('error', e.constructor.name, e.kind, e.action, e.errcode, e.code);
}
db.prepare('INSERT INTO t VALUES (1)').run();
console.log('rows', db.prepare('SELECT count(*) FROM t').pluck().get());
`, { URSULA_VFS_MAX_FRAME_BYTES: '65536' });
  assert.match(out, /error UrsulaWriteRefusedError too_large fix 7178 SQLITE_IOERR_AUTH/, out);
  assert.match(out, /rows 1/, out);
});

test('fenced across processes: commit and reads fail with UrsulaFencedError', () => {
  const url = `${base}/nodebind/fence`;
  const db = ursula.open(url, { path: path.join(tmp, 'fence-1.db') });
  db.exec('CREATE TABLE t(x); INSERT INTO t VALUES (1)');
  const out = child(`const db = ursula.open(${JSON.stringify(url)}, { path: ${JSON.stringify(path.join(tmp, 'fence-2.db'))} });
console.log('other', db.prepare('SELECT count(*) FROM t').pluck().get());`);
  assert.match(out, /other 1/, out);
  const ins = db.prepare('INSERT INTO t VALUES (?)');
  assert.throws(() => db.transaction(() => { ins.run(2); ins.run(3); })(),
    (e) => e instanceof ursula.UrsulaFencedError && e instanceof ursula.UrsulaReplicationError &&
      e.kind === 'fenced' && e.action === 'stop' && e.fenced === true && e.errcode === 7178);
  assert.throws(() => db.prepare('SELECT count(*) FROM t').get(),
    (e) => e instanceof ursula.UrsulaFencedError && e.errcode === 266 && e.message.startsWith('read refused'));
  assert.strictEqual(ursula.status(db.name).fenced, true);
  db.close();
});

test('local file names match the Python binding (and so vfs.DefaultFileName)', () => {
  const urls = ['http://127.0.0.1:4437/demo/notes', 'HTTP://Example.COM:80/a/b/../c/', 'https://h:443/x%2fy/Z%20z',
    'http://user:pw@h:8080/one', 'http://h/', 'http://h/-lead/%E2%9C%93ok', 'http://h/a/./b//c%7e',
    'http://n2:4437,N1:4437,n3:80/db/s', 'https://[::1]:4437,n1:443/db/s'];
  const py = spawnSync('/usr/bin/python3', ['-c',
    `import sys, json; sys.path.insert(0, ${JSON.stringify(path.join(REPO, 'bindings', 'python'))}); import sqlite_ursula as s; print(json.dumps([s.default_file_name(u) for u in json.loads(sys.argv[1])]))`,
    JSON.stringify(urls)], { encoding: 'utf8' });
  if (py.status !== 0) throw new Error(py.stderr);
  assert.deepStrictEqual(urls.map(ursula.defaultFileName), JSON.parse(py.stdout));
  assert.match(ursula.localPath('http://127.0.0.1:4437/demo/notes', { dir: tmp }), /demo-notes-[0-9a-f]{32}\.db$/);
});

// checklist-vfs T58 (W198, W206, W207): after an UrsulaError a helper's cleanup ROLLBACK
// never replaces it. The failed commit rolled its transaction back; a ROLLBACK prepared and
// run then is a no-op, one through exec rethrows the UrsulaError, and so do ROLLBACK TO and
// RELEASE. code, errcode and errstr are SQLite's, a wrapper's cause chain reaches the
// UrsulaError, and only the connection open returned classifies: a connection the
// application opened itself throws SQLite's own error, with status(file).error saying why.
test('checklist-vfs T58: ROLLBACK after an UrsulaError, copied codes, classification scope', () => {
  const out = child(`
const assert = require('node:assert');
const Database = require('better-sqlite3');
const file = ${JSON.stringify(path.join(tmp, 't58.db'))};
const db = ursula.open(${JSON.stringify(`${base}/nodebind/t58`)}, { path: file });
db.exec('CREATE TABLE t(x)');
const BIG = 'INSERT INTO t SELECT randomblob(4000) FROM (WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i<200) SELECT i FROM n)';
const failCommit = (commit) => {
  db.exec('BEGIN');
  db.prepare(BIG).run();
  try { commit(); } catch (e) { return e; }
  throw new Error('the commit did not fail');
};
const noTx = /no transaction is active/;

// Without an UrsulaError before it, a stray ROLLBACK fails as SQLite says.
assert.throws(() => db.prepare('ROLLBACK').run(), (e) => !(e instanceof ursula.UrsulaError) && noTx.test(e.message));

// A prepared ROLLBACK after a failed commit: a no-op, once.
let e1 = failCommit(() => db.prepare('COMMIT').run());
assert.ok(e1 instanceof ursula.UrsulaWriteRefusedError, String(e1));
assert.strictEqual(e1.kind, 'too_large');
assert.strictEqual(e1.code, 'SQLITE_IOERR_AUTH');
assert.strictEqual(e1.errcode, 7178);
assert.ok(e1.cause instanceof Database.SqliteError, 'cause is the SQLite error');
assert.strictEqual(e1.errstr, e1.cause.message);
assert.strictEqual(db.inTransaction, false);
assert.deepStrictEqual(db.prepare('ROLLBACK').run(), { changes: 0, lastInsertRowid: 0 });
assert.throws(() => db.prepare('ROLLBACK').run(), (e) => !(e instanceof ursula.UrsulaError) && noTx.test(e.message));

// A drizzle-style wrapper keeps the UrsulaError as its cause.
class DrizzleQueryError extends Error { constructor(q, cause) { super('Failed query: ' + q, { cause }); } }
const wrapped = new DrizzleQueryError('COMMIT', e1);
let c = wrapped; while (c && !(c instanceof ursula.UrsulaError)) c = c.cause;
assert.strictEqual(c, e1);

// Through exec the ROLLBACK rethrows the UrsulaError itself.
let e2 = failCommit(() => db.exec('COMMIT'));
assert.ok(e2 instanceof ursula.UrsulaWriteRefusedError, String(e2));
assert.throws(() => db.exec('ROLLBACK'), (e) => e === e2);

// A nested transaction's savepoint went with the failed commit: ROLLBACK TO and RELEASE
// of it rethrow the UrsulaError.
const failNested = (commit) => {
  db.exec('BEGIN; SAVEPOINT sp');
  db.prepare(BIG).run();
  try { commit(); } catch (e) { return e; }
  throw new Error('the commit did not fail');
};
let e3 = failNested(() => db.exec('COMMIT'));
assert.ok(e3 instanceof ursula.UrsulaWriteRefusedError, String(e3));
assert.throws(() => db.exec('ROLLBACK TO sp'), (e) => e === e3);
let e4 = failNested(() => db.prepare('COMMIT').run());
assert.ok(e4 instanceof ursula.UrsulaWriteRefusedError, String(e4));
assert.throws(() => db.prepare('RELEASE sp').run(), (e) => e === e4);
let e6 = failNested(() => db.prepare('COMMIT').run());
assert.throws(() => db.prepare('ROLLBACK TO sp').run(), (e) => e === e6);

// Classification scope: a connection the application opened itself throws SQLite's error.
const raw = new Database(file);
let e5;
try { raw.prepare(BIG).run(); } catch (e) { e5 = e; }
assert.ok(e5 && !(e5 instanceof ursula.UrsulaError) && e5.code === 'SQLITE_IOERR_AUTH', String(e5));
assert.strictEqual(ursula.status(file).error.kind, 'too_large');
raw.close();

db.prepare('INSERT INTO t VALUES (1)').run();
assert.strictEqual(db.prepare('SELECT count(*) FROM t').pluck().get(), 1);
db.close();
console.log('T58 ok');
`, { URSULA_VFS_MAX_FRAME_BYTES: '65536' });
  assert.match(out, /^T58 ok$/m, out);
});
