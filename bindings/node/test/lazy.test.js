'use strict';
// openLazy against a real server (URSULA_BIN or bin/ursula, memory engine) and the
// extension (URSULA_VFS_EXTENSION or bin/libursula_vfs.so). Run: node --test test/.

const { test, before, after } = require('node:test');
const assert = require('node:assert');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
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
  for (let i = 0; i < 600; i++) {
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
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'ursula-sqlite-lazy'));
  const port = await freePort();
  server = spawn(URSULA, ['server', '--engine', 'memory', '--listen', `127.0.0.1:${port}`, '--admin-listen', '127.0.0.1:0', '--data', path.join(tmp, 'data')], { stdio: 'ignore' });
  await waitPort(port);
  base = `http://127.0.0.1:${port}`;
});

after(() => {
  if (server) server.kill();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const QUERIES = [
  'SELECT body FROM notes WHERE id = 7',
  'SELECT id, body FROM notes WHERE id BETWEEN 300 AND 330 ORDER BY id',
  'SELECT count(*) AS n, sum(length(body)) AS b, sum(length(blob)) AS l FROM notes',
  "SELECT n.id, t.tag FROM notes n JOIN tags t ON t.note = n.id WHERE t.tag = 'tag 3' ORDER BY n.id",
];
const answers = (db) => QUERIES.map((q) => db.prepare(q).all());

test('openLazy answers as the owner at the tail and at a past offset, and refuses writes', async () => {
  const url = `${base}/nodelazy/notes`;
  const owner = ursula.open(url, { path: path.join(tmp, 'owner.db') });
  owner.exec('CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT, blob BLOB); CREATE TABLE tags(note INTEGER, tag TEXT)');
  const add = (from, n) => {
    const series = 'WITH RECURSIVE s(value) AS (SELECT ? UNION ALL SELECT value + 1 FROM s WHERE value < ?)';
    owner.prepare(`${series} INSERT INTO notes(id, body, blob) SELECT value, 'note ' || value, randomblob(200 + value % 300) FROM s`).run(from, from + n - 1);
    owner.prepare(`${series} INSERT INTO tags(note, tag) SELECT value, 'tag ' || (value % 17) FROM s`).run(from, from + n - 1);
  };
  add(1, 1000);
  const past = ursula.status(path.join(tmp, 'owner.db')).offset;
  const atPast = answers(owner);
  owner.exec("DELETE FROM notes WHERE id % 5 = 0; UPDATE notes SET body = 'changed ' || id WHERE id BETWEEN 300 AND 310");
  add(3000, 200);
  const atTail = answers(owner);
  assert.notDeepStrictEqual(atTail, atPast);

  const tail = ursula.openLazy(url);
  assert.deepStrictEqual(answers(tail), atTail);
  assert.strictEqual(tail.ursulaOffset, ursula.status(path.join(tmp, 'owner.db')).offset);
  const old = ursula.openLazy(url, { at: past, cacheMb: 8 });
  assert.deepStrictEqual(answers(old), atPast);
  assert.strictEqual(old.ursulaOffset, past);
  // No local copy: the name the connection opened does not exist.
  assert.strictEqual(fs.existsSync(tail.name), false);

  assert.throws(() => tail.exec('INSERT INTO notes(id) VALUES (99999)'), (e) => e.code === 'SQLITE_READONLY');
  const rw = ursula.openLazy(url, { readonly: false });
  assert.throws(() => rw.exec('DELETE FROM notes'), (e) => e.code === 'SQLITE_READONLY');
  rw.close();
  // A fixed view stays at its offset while the owner commits; a following one catches up,
  // and an open after the fixed ones closed reads the new tail.
  const live = ursula.openLazy(url, { follow: true });
  owner.exec("INSERT INTO notes(id, body) VALUES (9999, 'late')");
  assert.deepStrictEqual(answers(tail), atTail);
  const late = (db) => db.prepare('SELECT body FROM notes WHERE id = 9999').pluck().get();
  for (let i = 0; late(live) !== 'late'; i++) {
    assert.ok(i < 600, 'the following open never saw the new commit');
    await new Promise((r) => setTimeout(r, 50));
  }
  live.close();
  tail.close();
  old.close();
  const fresh = ursula.openLazy(url);
  assert.strictEqual(late(fresh), 'late');
  fresh.close();
  owner.close();
});

test('openLazy of a bad URL, a missing stream or a bad offset throws a clear setup error', () => {
  const cases = [
    [`${base}/nodelazy/absent`, {}, 'not_found'],
    ['nohost', {}, 'invalid_url'],
    [`${base}/nodelazy/notes`, { at: 'soon' }, 'invalid_argument'],
    [`${base}/nodelazy/notes`, { at: 5, follow: true }, 'invalid_argument'],
  ];
  for (const [url, opts, kind] of cases) {
    assert.throws(() => ursula.openLazy(url, opts), (e) => {
      assert.ok(e instanceof ursula.UrsulaSetupError, `${url}: ${e}`);
      assert.strictEqual(e.kind, kind, `${url}: ${e.message}`);
      assert.match(e.message, /^ursula_lazy_open: /);
      return true;
    });
  }
});
