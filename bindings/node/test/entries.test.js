'use strict';
// The package's entries and loading, without a server: the extension path variables, the
// connection loadUrsulaVfs returns, the node:sqlite entry's feature detection and the Pi
// Durable adapter's argument checks. Run: node --test test/ (from bindings/node).

const { test } = require('node:test');
const assert = require('node:assert');
const { spawnSync } = require('node:child_process');
const path = require('node:path');

const PKG = path.resolve(__dirname, '..');
const REPO = path.resolve(PKG, '..', '..');
const EXT = process.env.SQLITE_URSULA_VFS || process.env.URSULA_VFS_EXTENSION || path.join(REPO, 'bin', 'libursula_vfs.so');

function child(code, env) {
  const clean = { ...process.env };
  delete clean.SQLITE_URSULA_VFS;
  delete clean.URSULA_VFS_EXTENSION;
  const r = spawnSync(process.execPath, ['-e', `const ursula = require(${JSON.stringify(PKG)});\n${code}`],
    { env: { ...clean, ...env }, encoding: 'utf8', timeout: 60000 });
  return (r.stdout + r.stderr).trim();
}

// SQLITE_URSULA_VFS names the extension to load, as URSULA_VFS_EXTENSION does; it wins when
// both are set (vfs A4).
test('SQLITE_URSULA_VFS is an alias of URSULA_VFS_EXTENSION', () => {
  const code = 'ursula.loadUrsulaVfs(); console.log(ursula.extensionPath())';
  assert.strictEqual(child(code, { SQLITE_URSULA_VFS: EXT }), EXT);
  assert.strictEqual(child(code, { URSULA_VFS_EXTENSION: EXT }), EXT);
  assert.strictEqual(child('console.log(ursula.extensionPath())', { SQLITE_URSULA_VFS: EXT, URSULA_VFS_EXTENSION: '/nowhere.so' }), EXT);
  assert.match(child('try { ursula.loadUrsulaVfs() } catch (e) { console.log(e.name, e.kind) }', { SQLITE_URSULA_VFS: '/nowhere.so' }),
    /UrsulaSetupError local_setup/);
});

// loadUrsulaVfs loads the extension once and returns the connection that loaded it, where
// the SQL functions live (vfs A5).
test('loadUrsulaVfs returns the loading connection', () => {
  const out = child(`const a = ursula.loadUrsulaVfs(); const b = ursula.loadUrsulaVfs();
console.log(a === b, a.prepare("SELECT ursula_set_token(NULL) IS NULL").pluck().get());`, { SQLITE_URSULA_VFS: EXT });
  assert.strictEqual(out, 'true 1');
});

// The node:sqlite entry is offered where the running Node has node:sqlite with extension
// loading (22.5 and later, DatabaseSync.loadExtension), detected at run time; elsewhere it
// refuses with UrsulaSetupError (kind unsupported). On this machine's Node only the
// detection and the refusal can run.
test('node:sqlite entry is feature-detected', () => {
  const ns = require('../lib/node-sqlite.js');
  const [major, minor] = process.versions.node.split('.').map(Number);
  let has = false;
  if (major > 22 || (major === 22 && minor >= 5)) {
    try {
      has = typeof require('node:sqlite').DatabaseSync.prototype.loadExtension === 'function';
    } catch { /* absent */ }
  }
  assert.strictEqual(ns.available(), has);
  if (!has) {
    assert.throws(() => ns.open('http://127.0.0.1:1/b/s', { path: '/tmp/never.db' }), (e) => e.name === 'UrsulaSetupError' && e.kind === 'unsupported');
  }
});

// openUrsulaPiStorage (the ./pi entry) is async and refuses, before anything else, a file
// that is no plain path (invalid_argument) and a stream URL with a query or fragment
// (invalid_url); without Pi Durable installed it rejects with UrsulaSetupError (vfs AC).
test('openUrsulaPiStorage argument checks', async () => {
  const { openUrsulaPiStorage } = require('../lib/pi.js');
  for (const f of [':memory:', '', 'file:x.db']) {
    await assert.rejects(openUrsulaPiStorage(f, 'http://127.0.0.1:1/b/s'), (e) => e.name === 'UrsulaSetupError' && e.kind === 'invalid_argument');
  }
  for (const u of ['http://127.0.0.1:1/b/s?x=1', 'http://127.0.0.1:1/b/s#f', 'not a url']) {
    await assert.rejects(openUrsulaPiStorage('/tmp/pi.db', u), (e) => e.name === 'UrsulaSetupError' && e.kind === 'invalid_url');
  }
  let pi = true;
  try {
    require.resolve('@earendil-works/pi-durable');
  } catch {
    pi = false;
  }
  if (!pi) {
    await assert.rejects(openUrsulaPiStorage('/tmp/pi.db', 'http://127.0.0.1:1/b/s'), (e) => e.name === 'UrsulaSetupError' && e.kind === 'local_setup');
  }
});
