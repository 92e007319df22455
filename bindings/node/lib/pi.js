'use strict';
// ursula-sqlite/pi: the Pi Durable adapter. openUrsulaPiStorage attaches a local file to a
// stream and opens it with Pi Durable's node driver (SqliteStorage, on node:sqlite); the
// caller shuts it down with storage.close(ctx). Pi Durable (@earendil-works/pi-durable,
// >=1.0.0 <1.2.0) is the application's own dependency, and node:sqlite with extension
// loading must be present (see ./node-sqlite). Failures of the storage's methods surface
// as the root entry's UrsulaError classes, never as Pi's own rejections.

const root = require('./index.js');
const nodeSqlite = require('./node-sqlite.js');

const { UrsulaError, UrsulaSetupError } = root;
const { absPath, errorClass, actionFor } = root.internal;

// checkURL refuses a stream URL with a query or a fragment: the extension adds its own query.
function checkURL(url) {
  if (typeof url !== 'string' || !/^[A-Za-z][A-Za-z0-9+.-]*:\/\/[^/?#]/.test(url)) {
    throw new UrsulaSetupError(`stream URL ${JSON.stringify(url)} does not parse`, { kind: 'invalid_url' });
  }
  if (/[?#]/.test(url)) {
    throw new UrsulaSetupError(`stream URL ${url} has a query or a fragment: name the stream alone`, { kind: 'invalid_url' });
  }
}

async function loadPi() {
  try {
    return await import('@earendil-works/pi-durable');
  } catch (e) {
    throw new UrsulaSetupError('openUrsulaPiStorage needs @earendil-works/pi-durable (>=1.0.0 <1.2.0) installed next to this package',
      { kind: 'local_setup', cause: e });
  }
}

// translate maps a failure of the storage to the replication error status(file) names.
function translate(file, e) {
  if (e instanceof UrsulaError) return e;
  let st;
  try {
    st = nodeSqlite.status(file);
  } catch {
    return e;
  }
  if (!st.error) return e;
  const err = st.error;
  const cls = errorClass(err.kind);
  const what = st.fenced && /read/i.test(String(e && e.message)) ? 'read refused, the file is fenced' : 'commit not replicated';
  return new cls(`${what}: ${err.message}`, { kind: err.kind, action: err.action || actionFor(cls, err.kind), reason: err.message, fenced: !!st.fenced });
}

function wrap(file, storage) {
  return new Proxy(storage, {
    get(target, prop) {
      const v = target[prop];
      if (typeof v !== 'function') return v;
      return (...args) => {
        let r;
        try {
          r = v.apply(target, args);
        } catch (e) {
          throw translate(file, e);
        }
        return r && typeof r.then === 'function' ? r.catch((e) => { throw translate(file, e); }) : r;
      };
    },
  });
}

// openUrsulaPiStorage(file, url, { readOnly }) resolves to Pi's storage on the attached file.
async function openUrsulaPiStorage(file, url, { readOnly = false } = {}) {
  const p = absPath(file);
  checkURL(url);
  const pi = await loadPi();
  const SqliteStorage = pi.SqliteStorage || (pi.default && pi.default.SqliteStorage);
  if (typeof SqliteStorage !== 'function') {
    throw new UrsulaSetupError('@earendil-works/pi-durable has no SqliteStorage export: use a version >=1.0.0 <1.2.0', { kind: 'local_setup' });
  }
  nodeSqlite.attach(p, url, { readOnly });
  const storage = typeof SqliteStorage.open === 'function'
    ? await SqliteStorage.open(p, { readOnly })
    : new SqliteStorage(p, { readOnly });
  return wrap(p, storage);
}

module.exports = { openUrsulaPiStorage };
