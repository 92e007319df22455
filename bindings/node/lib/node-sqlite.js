'use strict';
// ursula-sqlite/node-sqlite: the same replication on Node's built-in node:sqlite, for a Node
// that has it with extension loading (node:sqlite appeared in 22.5; loading an extension
// needs DatabaseSync's allowExtension option and loadExtension). node:sqlite links its own
// SQLite, so the extension is loaded into it here, apart from the better-sqlite3 entry's.
// Where the running Node lacks it, every call throws UrsulaSetupError (kind unsupported).

const fs = require('node:fs');
const root = require('./index.js');

const { UrsulaSetupError, extensionPath, localPath } = root;
const { absPath, fromFunctionError } = root.internal;

// nodeSqlite returns node:sqlite when this Node has it with extension loading, else null.
function nodeSqlite() {
  const [major, minor] = process.versions.node.split('.').map(Number);
  if (major < 22 || (major === 22 && minor < 5)) return null;
  let mod;
  try {
    mod = require('node:sqlite');
  } catch {
    return null;
  }
  if (!mod || typeof mod.DatabaseSync !== 'function' || typeof mod.DatabaseSync.prototype.loadExtension !== 'function') return null;
  return mod;
}

function available() {
  return nodeSqlite() !== null;
}

function need() {
  const mod = nodeSqlite();
  if (!mod) {
    throw new UrsulaSetupError(`node:sqlite with extension loading is not available in Node ${process.versions.node} ` +
      '(it needs 22.5 or later with DatabaseSync.loadExtension): use the root entry, on better-sqlite3', { kind: 'unsupported' });
  }
  return mod;
}

let loader = null;
// loadUrsulaVfs loads the extension into node:sqlite once per process and returns the
// DatabaseSync that loaded it (the SQL functions live there).
function loadUrsulaVfs() {
  if (loader) return loader;
  const { DatabaseSync } = need();
  const p = extensionPath();
  if (!fs.existsSync(p)) {
    throw new UrsulaSetupError(`the Ursula SQLite extension is not at ${p}: run \`make extension\` or set SQLITE_URSULA_VFS`, { kind: 'local_setup' });
  }
  const db = new DatabaseSync(':memory:', { allowExtension: true });
  db.loadExtension(p);
  loader = db;
  return db;
}

function call(sql, ...args) {
  const db = loadUrsulaVfs();
  try {
    const row = db.prepare(sql).get(...args);
    return row === undefined ? undefined : Object.values(row)[0];
  } catch (e) {
    throw fromFunctionError(e);
  }
}

function attach(file, url, { readOnly = false } = {}) {
  const p = absPath(file);
  return readOnly ? call('SELECT ursula_attach(?, ?, ?)', p, url, 'read_only') : call('SELECT ursula_attach(?, ?)', p, url);
}

function status(file) {
  const st = JSON.parse(call('SELECT ursula_status(?)', absPath(file)));
  if (st.error === undefined) st.error = null;
  return st;
}

// open attaches a local file to the stream at url and returns a node:sqlite DatabaseSync
// on it. options: path, dir, readOnly, and DatabaseSync's own options. Its errors are
// SQLite's own; status(file).error names a replication failure.
function open(url, options = {}) {
  const { path: file, dir, readOnly = false, ...dbOptions } = options;
  const { DatabaseSync } = need();
  loadUrsulaVfs();
  const p = file === undefined ? localPath(url, { dir }) : absPath(file);
  attach(p, url, { readOnly });
  return new DatabaseSync(p, { ...dbOptions, readOnly });
}

module.exports = { available, loadUrsulaVfs, attach, status, open };
