"""Replicated SQLite databases for Python's standard sqlite3 module.

Dependency-free: it loads Ursula's SQLite extension (libursula_vfs.so) into the process's
SQLite, attaches a local file to a stream with ``ursula_attach`` and opens it with the
``ursula`` VFS. Every commit returns only after the stream acknowledged it.

    import sqlite_ursula
    db = sqlite_ursula.open("http://127.0.0.1:4437/demo/notes")
    db.execute("CREATE TABLE IF NOT EXISTS notes(body TEXT)")
    db.execute("INSERT INTO notes VALUES ('hello')")
    db.commit()

The extension is found through ``SQLITE_URSULA_VFS`` or its alias ``URSULA_VFS_EXTENSION``
(a path) or the repository's build output ``bin/libursula_vfs.so`` (``make extension``).
"""

import fcntl
import hashlib
import itertools
import json
import os
import re
import sqlite3
import tempfile
import threading
import urllib.parse

__all__ = [
    "open", "attach", "status", "stats", "set_token", "load", "extension_path",
    "local_path", "canonical_url", "default_file_name",
    "UrsulaError", "WriteRefusedError", "PaymentRequiredError", "ReplicationError",
    "ReattachError", "FencedError", "SetupError", "Connection", "Cursor",
]

# ---- errors (checklist W) ----------------------------------------------------------------

class UrsulaError(sqlite3.OperationalError):
    """A replicated-database failure. ``kind`` names it, ``action`` says what to do:
    ``retry`` (nothing reached the stream, the database is usable), ``reattach`` (close
    and open again), ``stop`` (another owner took the stream: never reopen in a loop),
    ``fix`` (change the URL, setup, transaction or files)."""

    default_action = "fix"

    def __init__(self, message, kind=None, action=None, reason=None, fenced=False, cause=None):
        super().__init__(message)
        self.kind = kind
        self.action = action or self.default_action
        self.reason = reason if reason is not None else message
        self.fenced = fenced
        self.cause = cause
        code = getattr(cause, "sqlite_errorcode", None)
        self.sqlite_errorcode = code
        self.sqlite_errorname = getattr(cause, "sqlite_errorname", None)


class WriteRefusedError(UrsulaError):
    """Nothing reached the stream (kinds unauthorized, forbidden, rate_limited,
    not_applied, unreachable, refused, unavailable: retry; too_large: fix)."""
    default_action = "retry"


class PaymentRequiredError(WriteRefusedError):
    """402 in front of the stream (kind payment_required)."""
    default_action = "retry"


class ReplicationError(UrsulaError):
    """The file stopped taking commits (fix kinds: unsupported, stream_state,
    local_setup, invalid_url, ...)."""
    default_action = "fix"


class ReattachError(ReplicationError):
    """Close and open again (outcome_unknown, local_damage, local_state, internal)."""
    default_action = "reattach"


class FencedError(ReplicationError):
    """Another owner took the stream over: stop, never reopen in a loop."""
    default_action = "stop"


class SetupError(UrsulaError):
    """Attach or open refused (invalid_argument, invalid_url, not_found, in_use,
    unreplicated_file, other_stream, unsupported, not_attached, local_setup, ...)."""
    default_action = "fix"


_REFUSED = {"unauthorized", "forbidden", "rate_limited", "not_applied", "unreachable",
            "refused", "unavailable"}
_REATTACH = {"outcome_unknown", "local_damage", "local_state", "internal", "poisoned", "damaged"}
_SETUP = {"invalid_argument", "invalid_url", "invalid_name", "not_found", "in_use",
          "unreplicated_file", "other_stream", "unsupported", "stream_state", "not_attached",
          "local_setup", "attach_failed"}


def _error_class(kind, setup=False):
    if kind == "payment_required":
        return PaymentRequiredError
    if kind in _REFUSED or kind == "too_large":
        return WriteRefusedError
    if kind == "fenced":
        return FencedError
    if kind in _REATTACH:
        return ReattachError
    if setup and kind in _SETUP:
        return SetupError
    return ReplicationError


def _action_for(cls, kind):
    if kind == "too_large":
        return "fix"
    return cls.default_action


_FN_ERROR = re.compile(r"^(ursula_\w+): ([a-z_]+): (.*)$", re.S)


def _from_function_error(exc):
    """Maps the extension's '<function>: <kind>: <message>' errors."""
    m = _FN_ERROR.match(str(exc))
    if not m:
        return exc
    fn, kind, msg = m.groups()
    setup = fn in ("ursula_attach", "ursula_lazy_open") or kind in ("not_attached", "attach_failed")
    cls = _error_class(kind, setup=setup)
    err = cls(str(exc), kind=kind, action=_action_for(cls, kind), reason=msg,
              fenced=(kind == "fenced"), cause=exc)
    return err

# ---- the extension -----------------------------------------------------------------------

_lock = threading.RLock()
_loader = None


def extension_path():
    """SQLITE_URSULA_VFS, else its alias URSULA_VFS_EXTENSION, else bin/libursula_vfs.so of
    the repository this package lives in."""
    p = os.environ.get("SQLITE_URSULA_VFS") or os.environ.get("URSULA_VFS_EXTENSION")
    if p:
        return p
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "..", "bin", "libursula_vfs.so"))


def load():
    """Loads the extension once per process and returns the connection that loaded it
    (the SQL functions live there). From then on ``ursula`` is SQLite's default VFS."""
    global _loader
    with _lock:
        if _loader is None:
            path = extension_path()
            if not os.path.exists(path):
                raise SetupError("the Ursula SQLite extension is not at %s: run `make extension` "
                                 "or set SQLITE_URSULA_VFS" % path, kind="local_setup")
            c = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
            c.enable_load_extension(True)
            try:
                c.load_extension(path)
            finally:
                c.enable_load_extension(False)
            _loader = c
        return _loader


def _call(sql, args):
    c = load()
    with _lock:
        try:
            return c.execute(sql, args).fetchone()[0]
        except sqlite3.Error as e:
            raise _from_function_error(e) from e


def _abs(path):
    if path in ("", ":memory:") or str(path).startswith("file:"):
        raise SetupError("the file must be a plain file path (not %r)" % (path,), kind="invalid_argument")
    return os.path.abspath(path)


def attach(path, url, read_only=False):
    """Attaches the file at path to the stream at url (no connection may have it open
    yet) and returns the stream offset the file reflects, as a string."""
    args = (_abs(path), url) + (("read_only",) if read_only else ())
    return _call("SELECT ursula_attach(%s)" % ",".join("?" * len(args)), args)


def status(path):
    """The replication state of an attached file (a dict; ``error`` is None while
    writes go through)."""
    return json.loads(_call("SELECT ursula_status(?)", (_abs(path),)))


def stats(path):
    """Drains the measurements of an attached file (ursula_stats; see the README)."""
    return json.loads(_call("SELECT ursula_stats(?)", (_abs(path),)))


def set_token(token):
    """Sets the process-wide bearer token (None clears it)."""
    _call("SELECT ursula_set_token(?)", (token,))

# ---- local file naming (checklist H; the same bytes as vfs.DefaultFileName) ---------------

_SAFE = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~$&+:=@")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _segments(path):
    out = []
    for s in path.split("/"):
        if s in ("", "."):
            continue
        if s == "..":
            if out:
                out.pop()
            continue
        out.append(s)
    dec = []
    for s in out:
        if _BAD_ESCAPE.search(s):
            dec.append(s.encode("utf-8"))
        else:
            dec.append(urllib.parse.unquote_to_bytes(s))
    return dec


def _escape(b):
    return "".join(chr(c) if c in _SAFE else "%%%02X" % c for c in b)


_NODE_LIST = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*,[^/?#]*)(.*)$", re.S)


def _canonical_node(scheme, node):
    m = re.match(r"^(?:\[([0-9A-Fa-f:.%]+)\]|([A-Za-z0-9._~%-]+))(?::([0-9]+))?$", node)
    if not m or (m.group(3) is not None and not 1 <= int(m.group(3)) <= 65535):
        raise SetupError("stream URL node %r is not host:port" % (node,), kind="invalid_url")
    host = (m.group(1) or m.group(2)).lower()
    if m.group(1):
        host = "[" + host + "]"
    port = m.group(3)
    if port is not None and str(int(port)) != {"http": "80", "https": "443"}.get(scheme):
        host += ":%d" % int(port)
    return host


def canonical_url(url):
    """The one spelling of a stream URL that names its local file (the same bytes as the
    Go vfs package). A URL naming several nodes of a cluster lists them sorted, so the same
    nodes in another order name the same file."""
    nodes = _NODE_LIST.match(url)
    if nodes:
        scheme = nodes.group(1).lower()
        names = sorted(_canonical_node(scheme, n) for n in nodes.group(2).split(","))
        rest = canonical_url(scheme + "://node" + nodes.group(3))
        return scheme + "://" + ",".join(names) + rest[len(scheme) + len("://node"):]
    u = urllib.parse.urlsplit(url)
    scheme = u.scheme.lower()
    host = (u.hostname or "").lower()
    if ":" in host:
        host = "[" + host + "]"
    port = u.port
    if port is not None and not (scheme == "http" and port == 80) and not (scheme == "https" and port == 443):
        host += ":%d" % port
    return scheme + "://" + host + "/" + "/".join(_escape(s) for s in _segments(u.path))


def default_file_name(url):
    canon = canonical_url(url)
    segs = _segments(canon[canon.index("/", canon.index("://") + 3):])[-2:]
    if not segs:
        label = "stream"
    else:
        text = "-".join(s.decode("utf-8", "replace") for s in segs).lower()
        label = re.sub(r"[^a-z0-9_-]+", "_", text)
        if label.startswith("-"):
            label = "_" + label[1:]
        label = label[:64]
    return label + "-" + hashlib.sha256(canon.encode("utf-8")).hexdigest()[:32] + ".db"


def _cache_dir():
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        home = os.environ.get("HOME", "")
        if not os.path.isabs(home):
            try:
                import pwd
                home = pwd.getpwuid(os.getuid()).pw_dir
            except Exception:
                home = ""
        if not os.path.isabs(home):
            raise SetupError("no cache directory (set XDG_CACHE_HOME or HOME), so pass dir= or path=",
                             kind="local_setup")
        base = os.path.join(home, ".cache")
    return os.path.join(base, "sqlite-ursula")


def _held(path):
    """Whether another connection or process holds the file (its lock file is locked)."""
    lock = path + "-ursula.lock"
    if not os.path.exists(lock):
        return False
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def local_path(url, dir=None, read_only=False):
    """The file ``open`` uses without ``path``: <label>-<hash>.db (read-only:
    <label>-<hash>-ro<n>.db, the first of ro1..ro8 not held) in ``dir`` or the user's
    cache directory's sqlite-ursula."""
    d = dir if dir is not None else _cache_dir()
    os.makedirs(d, mode=0o700, exist_ok=True)
    name = default_file_name(url)
    if not read_only:
        return os.path.abspath(os.path.join(d, name))
    for n in range(1, 9):
        p = os.path.abspath(os.path.join(d, name[:-3] + "-ro%d.db" % n))
        if not _held(p):
            return p
    raise SetupError("eight read-only copies of %s are open already: pass dir= or path=" % url, kind="in_use")

# ---- connections -------------------------------------------------------------------------

def _translate(conn, exc):
    """Turns SQLite's I/O error of a commit or read of the attached file into an
    UrsulaError, from the file's status."""
    path = getattr(conn, "ursula_path", None)
    code = getattr(exc, "sqlite_errorcode", None)
    if path is None or code is None or isinstance(exc, UrsulaError) or (code & 0xFF) not in (10, 23, 14):
        return exc
    try:
        st = status(path)
    except UrsulaError as e:
        return e
    err = st.get("error") or {}
    if code == 266 and (st.get("fenced") or st.get("poisoned")):
        kind = "fenced" if st.get("fenced") else err.get("kind", "outcome_unknown")
        cls = _error_class(kind)
        reason = err.get("message", "")
        what = "fenced" if kind == "fenced" else "poisoned"
        return cls("read refused, the file is %s: %s" % (what, reason), kind=kind,
                   action=_action_for(cls, kind), reason=reason, fenced=bool(st.get("fenced")), cause=exc)
    if not err:
        return exc
    kind = err.get("kind")
    cls = _error_class(kind)
    return cls("commit not replicated: %s (%s)" % (err.get("message"), kind), kind=kind,
               action=err.get("action") or _action_for(cls, kind), reason=err.get("message"),
               fenced=bool(st.get("fenced")), cause=exc)


def _wrap(conn, fn, *a, **kw):
    try:
        return fn(*a, **kw)
    except sqlite3.Error as e:
        t = _translate(conn, e)
        if t is e:
            raise
        try:
            raise t from e
        finally:
            # Without this the frame (holding the cursor) and the raised error would keep
            # each other alive until a garbage collection, and with the cursor's
            # statement the file stays open past close(): a reattach after a poisoned
            # read would find it still open.
            t = e = None


class Cursor(sqlite3.Cursor):
    """sqlite3.Cursor whose failures on the attached file are UrsulaErrors."""

    def execute(self, *a, **kw):
        return _wrap(self.connection, super().execute, *a, **kw)

    def executemany(self, *a, **kw):
        return _wrap(self.connection, super().executemany, *a, **kw)

    def executescript(self, *a, **kw):
        return _wrap(self.connection, super().executescript, *a, **kw)

    def fetchone(self):
        return _wrap(self.connection, super().fetchone)

    def fetchmany(self, *a, **kw):
        return _wrap(self.connection, super().fetchmany, *a, **kw)

    def fetchall(self):
        return _wrap(self.connection, super().fetchall)

    def __next__(self):
        return _wrap(self.connection, super().__next__)


class Connection(sqlite3.Connection):
    """sqlite3.Connection of an attached file: ``ursula_path`` is the file, and failed
    commits and reads raise UrsulaError subclasses."""

    ursula_path = None

    def cursor(self, factory=Cursor):
        return super().cursor(factory)

    def execute(self, sql, parameters=()):
        return self.cursor().execute(sql, parameters)

    def executemany(self, sql, parameters):
        return self.cursor().executemany(sql, parameters)

    def executescript(self, script):
        return self.cursor().executescript(script)

    def commit(self):
        return _wrap(self, super().commit)

    def __exit__(self, exc_type, exc, tb):
        # sqlite3's context manager commits without calling commit()
        return _wrap(self, super().__exit__, exc_type, exc, tb)


def open(url, path=None, dir=None, read_only=False, **connect_kwargs):
    """Attaches a local file to the stream at url and opens it: an sqlite3.Connection
    (a Connection subclass) in WAL mode whose commits return only after the stream
    acknowledged them. Without ``path`` the file is <label>-<hash>.db in ``dir`` or the
    user's cache directory. ``read_only`` claims nothing and opens the file read-only."""
    if path is None:
        p = local_path(url, dir=dir, read_only=read_only)
    else:
        p = _abs(path)
    load()
    attach(p, url, read_only=read_only)
    connect_kwargs.setdefault("factory", Connection)
    target = p
    if read_only:
        target = "file:" + urllib.parse.quote(p) + "?mode=ro"
        connect_kwargs["uri"] = True
    try:
        conn = sqlite3.connect(target, **connect_kwargs)
    except sqlite3.Error as e:
        raise SetupError("cannot open %s: %s" % (p, e), kind="local_setup", cause=e) from e
    conn.ursula_path = p
    return conn


_lazy_names = itertools.count(1)


class LazyConnection(sqlite3.Connection):
    """sqlite3.Connection of a lazy open: ``ursula_offset`` is the stream offset it reads."""

    ursula_offset = None


def open_lazy(url, at=None, follow=False, cache_mb=None, **connect_kwargs):
    """Opens the database replicated on the stream at url lazily and read-only: no local
    copy, pages fetched on demand (the extension's ursula-lazy source, registered under a
    name that never exists on disk with ursula_lazy_open). ``at``: a stream offset (the
    database as of it; default the tail now); ``follow``: each new read transaction sees
    the latest commits (not with ``at``); ``cache_mb``: the page cache bound (default 64).
    A bad URL, a missing stream or an unreadable offset raises SetupError here. The
    connection's ``ursula_offset`` is the offset it reads at."""
    load()
    name = os.path.join(tempfile.gettempdir(), "ursula-lazy-%d-%d.db" % (os.getpid(), next(_lazy_names)))
    offset = _call("SELECT ursula_lazy_open(?, ?, ?, ?, ?)",
                   (name, url, None if at is None else str(at), "1" if follow else None,
                    None if cache_mb is None else str(cache_mb)))
    connect_kwargs["uri"] = True
    connect_kwargs.setdefault("factory", LazyConnection)
    try:
        conn = sqlite3.connect("file:" + urllib.parse.quote(name) + "?mode=ro", **connect_kwargs)
    except sqlite3.Error as e:
        raise SetupError("cannot open %s lazily: %s" % (url, e), kind="local_setup", cause=e) from e
    conn.ursula_offset = offset
    return conn
