/*
 * The loadable SQLite extension's C side: a thin VFS named "ursula" over SQLite's own
 * "unix" VFS, registered as the default, plus the SQL functions.
 *
 * Every file the ursula VFS opens is the unix VFS's file, wrapped. For files of a database
 * attached in this process (the Go side answers at xOpen, never later):
 *   - xWrite/xTruncate of the owner's -wal go to the Go core (sqlitewal.WAL), which writes
 *     through the unix file (ursula_real_write) and holds the commit frame until the
 *     server acknowledged the transaction;
 *   - xRead, locks and shared memory stay here: a read checks a per-database fence flag
 *     (C memory the Go side sets once the database is fenced or poisoned) and then calls
 *     the unix file. Reads never call Go. xShmLock refuses new read marks of a fenced
 *     database too, so a connection with a warm page cache cannot read past the fence.
 *   - PRAGMA journal_mode other than WAL, page_size other than 4096 and
 *     locking_mode=EXCLUSIVE are refused (SQLITE_FCNTL_PRAGMA), and a rollback journal is
 *     refused once the file holds data (it would bypass the replication).
 *   - no memory mapping (xFetch hands out nothing), so every read passes the check.
 *
 * A second VFS, "ursula-lazy" (not the default), opens a stream lazily and read-only:
 * file:NAME?vfs=ursula-lazy&url=STREAM_URL reads pages on demand through the Go side.
 * ursula_lazy_open(path, url, ...) registers a plain path as such a database, so that the
 * default VFS serves it lazily too (for programs that cannot name a VFS in a URI).
 *
 * The extension uses the host's SQLite only, through the extension API routines.
 */
#include <sqlite3ext.h>
SQLITE_EXTENSION_INIT1

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"
#include "_cgo_export.h"

typedef struct UFile {
  sqlite3_file base;
  int kind;             /* URSULA_FILE_* */
  volatile int *fence;  /* the database's fence flag; NULL for plain files */
  uintptr_t h;          /* Go handle (cgo.Handle); 0 for plain files */
  sqlite3_file *real;   /* the unix file, allocated right after this struct */
} UFile;

static sqlite3_vfs *unixVfs;
static sqlite3_vfs ursulaVfs;
static pthread_mutex_t initMu = PTHREAD_MUTEX_INITIALIZER;
static int initialized;

void ursula_flag_set(volatile int *flag, int v) { __atomic_store_n(flag, v, __ATOMIC_SEQ_CST); }
int ursula_flag_get(volatile int *flag) { return __atomic_load_n(flag, __ATOMIC_SEQ_CST); }

static int fenced(UFile *u) { return u->fence && ursula_flag_get(u->fence); }

int ursula_real_read(sqlite3_file *real, void *buf, int n, int64_t off) {
  return real->pMethods->xRead(real, buf, n, off);
}

int ursula_real_write(sqlite3_file *real, const void *buf, int n, int64_t off) {
  return real->pMethods->xWrite(real, buf, n, off);
}

/* ---- io methods ---------------------------------------------------------------------- */

static int uClose(sqlite3_file *f) {
  UFile *u = (UFile *)f;
  int rc = u->real->pMethods ? u->real->pMethods->xClose(u->real) : SQLITE_OK;
  if (u->h) {
    ursulaClose(u->h);
    u->h = 0;
  }
  return rc;
}

static int uRead(sqlite3_file *f, void *buf, int n, sqlite3_int64 off) {
  UFile *u = (UFile *)f;
  if (fenced(u)) return SQLITE_IOERR_READ;
  return u->real->pMethods->xRead(u->real, buf, n, off);
}

static int uWrite(sqlite3_file *f, const void *buf, int n, sqlite3_int64 off) {
  UFile *u = (UFile *)f;
  switch (u->kind) {
    case URSULA_FILE_WAL:
      return ursulaWalWrite(u->h, (void *)buf, n, off);
    case URSULA_FILE_MAIN_RO:
    case URSULA_FILE_WAL_RO:
      return SQLITE_READONLY;
    case URSULA_FILE_MAIN:
      if (fenced(u)) return SQLITE_IOERR_WRITE;
  }
  return u->real->pMethods->xWrite(u->real, buf, n, off);
}

static int uTruncate(sqlite3_file *f, sqlite3_int64 size) {
  UFile *u = (UFile *)f;
  switch (u->kind) {
    case URSULA_FILE_WAL:
      ursulaWalTruncate(u->h);
      break;
    case URSULA_FILE_MAIN_RO:
    case URSULA_FILE_WAL_RO:
      return SQLITE_READONLY;
    case URSULA_FILE_MAIN:
      if (fenced(u)) return SQLITE_IOERR_TRUNCATE;
  }
  return u->real->pMethods->xTruncate(u->real, size);
}

static int uSync(sqlite3_file *f, int flags) {
  UFile *u = (UFile *)f;
  /* The stream, not the -wal file, makes a commit durable (see walFile.Sync in vfs):
     under synchronous=FULL, the default of most SQLite builds, SQLite would sync the
     WAL on every commit (Python, one-row commits: p50 503-548 us before, 293-318 after). */
  if (u->kind == URSULA_FILE_WAL) return SQLITE_OK;
  return u->real->pMethods->xSync(u->real, flags);
}

static int uFileSize(sqlite3_file *f, sqlite3_int64 *size) {
  UFile *u = (UFile *)f;
  return u->real->pMethods->xFileSize(u->real, size);
}

static int uLock(sqlite3_file *f, int level) {
  UFile *u = (UFile *)f;
  return u->real->pMethods->xLock(u->real, level);
}

static int uUnlock(sqlite3_file *f, int level) {
  UFile *u = (UFile *)f;
  return u->real->pMethods->xUnlock(u->real, level);
}

static int uCheckReservedLock(sqlite3_file *f, int *out) {
  UFile *u = (UFile *)f;
  return u->real->pMethods->xCheckReservedLock(u->real, out);
}

/* refusePragma answers SQLITE_FCNTL_PRAGMA for an attached database: a = {err, name, value}. */
static int refusePragma(char **a) {
  const char *name = a[1], *val = a[2];
  const char *why = 0;
  if (!name || !val) return SQLITE_NOTFOUND;
  if (sqlite3_stricmp(name, "journal_mode") == 0 && sqlite3_stricmp(val, "wal") != 0) {
    why = "a replicated database stays in WAL mode";
  } else if (sqlite3_stricmp(name, "page_size") == 0 && atoi(val) != 4096) {
    why = "a replicated database has 4096-byte pages";
  } else if (sqlite3_stricmp(name, "locking_mode") == 0 && sqlite3_stricmp(val, "exclusive") == 0) {
    why = "a replicated database is shared through the WAL index, not exclusive locking";
  }
  if (!why) return SQLITE_NOTFOUND;
  fprintf(stderr, "sqlite-ursula-vfs level=warn event=journal_refused pragma=%s value=%s\n", name, val);
  a[0] = sqlite3_mprintf("ursula: PRAGMA %s=%s refused: %s (unsupported)", name, val, why);
  return SQLITE_ERROR;
}

static int uFileControl(sqlite3_file *f, int op, void *arg) {
  UFile *u = (UFile *)f;
  if (op == SQLITE_FCNTL_PRAGMA && (u->kind == URSULA_FILE_MAIN || u->kind == URSULA_FILE_MAIN_RO)) {
    int rc = refusePragma((char **)arg);
    if (rc != SQLITE_NOTFOUND) return rc;
  }
  return u->real->pMethods->xFileControl(u->real, op, arg);
}

static int uSectorSize(sqlite3_file *f) {
  UFile *u = (UFile *)f;
  return u->real->pMethods->xSectorSize(u->real);
}

static int uDeviceCharacteristics(sqlite3_file *f) {
  UFile *u = (UFile *)f;
  return u->real->pMethods->xDeviceCharacteristics(u->real);
}

static int uShmMap(sqlite3_file *f, int pg, int pgsz, int extend, void volatile **pp) {
  UFile *u = (UFile *)f;
  return u->real->pMethods->xShmMap(u->real, pg, pgsz, extend, pp);
}

static int uShmLock(sqlite3_file *f, int offset, int n, int flags) {
  UFile *u = (UFile *)f;
  /* A shared lock here is a WAL read mark: a new read transaction. */
  if ((flags & SQLITE_SHM_LOCK) && (flags & SQLITE_SHM_SHARED) && fenced(u)) return SQLITE_IOERR_READ;
  return u->real->pMethods->xShmLock(u->real, offset, n, flags);
}

static void uShmBarrier(sqlite3_file *f) {
  UFile *u = (UFile *)f;
  u->real->pMethods->xShmBarrier(u->real);
}

static int uShmUnmap(sqlite3_file *f, int deleteFlag) {
  UFile *u = (UFile *)f;
  return u->real->pMethods->xShmUnmap(u->real, deleteFlag);
}

static int uFetch(sqlite3_file *f, sqlite3_int64 off, int n, void **pp) {
  UFile *u = (UFile *)f;
  if (u->kind != URSULA_FILE_PLAIN || u->real->pMethods->iVersion < 3) {
    *pp = 0; /* no memory mapping: every read goes through uRead */
    return SQLITE_OK;
  }
  return u->real->pMethods->xFetch(u->real, off, n, pp);
}

static int uUnfetch(sqlite3_file *f, sqlite3_int64 off, void *p) {
  UFile *u = (UFile *)f;
  if (u->kind != URSULA_FILE_PLAIN || u->real->pMethods->iVersion < 3) return SQLITE_OK;
  return u->real->pMethods->xUnfetch(u->real, off, p);
}

static const sqlite3_io_methods uMethods = {
    3,
    uClose, uRead, uWrite, uTruncate, uSync, uFileSize, uLock, uUnlock, uCheckReservedLock,
    uFileControl, uSectorSize, uDeviceCharacteristics,
    uShmMap, uShmLock, uShmBarrier, uShmUnmap,
    uFetch, uUnfetch,
};

/* ---- vfs methods --------------------------------------------------------------------- */

static int lazyNamedOpen(sqlite3_file *f, uintptr_t h, int flags, int *outFlags);

static int uOpen(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *outFlags) {
  UFile *u = (UFile *)f;
  int kind = URSULA_FILE_PLAIN, rc;
  memset(u, 0, sizeof(*u));
  u->real = (sqlite3_file *)&u[1];
  if (name && (flags & (SQLITE_OPEN_MAIN_DB | SQLITE_OPEN_WAL | SQLITE_OPEN_MAIN_JOURNAL))) {
    int *fence = 0;
    uintptr_t h = 0;
    kind = ursulaOpen((char *)name, flags, u->real, &fence, &h);
    if (kind < 0) return -kind; /* refused (SQLITE_CANTOPEN) */
    if (kind == URSULA_FILE_LAZY) return lazyNamedOpen(f, h, flags, outFlags);
    u->fence = fence;
    u->h = h;
  }
  if (kind == URSULA_FILE_MAIN_RO) {
    /* A read-only attach: SQLite itself answers writes with SQLITE_READONLY. */
    flags = (flags & ~(SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE)) | SQLITE_OPEN_READONLY;
  }
  rc = unixVfs->xOpen(unixVfs, name, u->real, flags, outFlags);
  if (rc != SQLITE_OK) {
    if (u->h) ursulaClose(u->h);
    u->h = 0;
    u->base.pMethods = 0;
    return rc;
  }
  u->kind = kind;
  u->base.pMethods = &uMethods;
  return SQLITE_OK;
}

static int uDelete(sqlite3_vfs *v, const char *name, int syncDir) {
  return unixVfs->xDelete(unixVfs, name, syncDir);
}
static int uAccess(sqlite3_vfs *v, const char *name, int flags, int *out) {
  return unixVfs->xAccess(unixVfs, name, flags, out);
}
static int uFullPathname(sqlite3_vfs *v, const char *name, int n, char *out) {
  return unixVfs->xFullPathname(unixVfs, name, n, out);
}
static void *uDlOpen(sqlite3_vfs *v, const char *name) { return unixVfs->xDlOpen(unixVfs, name); }
static void uDlError(sqlite3_vfs *v, int n, char *msg) { unixVfs->xDlError(unixVfs, n, msg); }
static void (*uDlSym(sqlite3_vfs *v, void *h, const char *sym))(void) {
  return unixVfs->xDlSym(unixVfs, h, sym);
}
static void uDlClose(sqlite3_vfs *v, void *h) { unixVfs->xDlClose(unixVfs, h); }
static int uRandomness(sqlite3_vfs *v, int n, char *out) { return unixVfs->xRandomness(unixVfs, n, out); }
static int uSleep(sqlite3_vfs *v, int us) { return unixVfs->xSleep(unixVfs, us); }
static int uCurrentTime(sqlite3_vfs *v, double *t) { return unixVfs->xCurrentTime(unixVfs, t); }
static int uGetLastError(sqlite3_vfs *v, int n, char *msg) {
  return unixVfs->xGetLastError(unixVfs, n, msg);
}
static int uCurrentTimeInt64(sqlite3_vfs *v, sqlite3_int64 *t) {
  return unixVfs->xCurrentTimeInt64(unixVfs, t);
}
static int uSetSystemCall(sqlite3_vfs *v, const char *name, sqlite3_syscall_ptr p) {
  return unixVfs->xSetSystemCall(unixVfs, name, p);
}
static sqlite3_syscall_ptr uGetSystemCall(sqlite3_vfs *v, const char *name) {
  return unixVfs->xGetSystemCall(unixVfs, name);
}
static const char *uNextSystemCall(sqlite3_vfs *v, const char *name) {
  return unixVfs->xNextSystemCall(unixVfs, name);
}


/* ---- the ursula-lazy VFS ------------------------------------------------------------- */
/*
 * file:NAME?vfs=ursula-lazy&url=STREAM_URL[&at=OFFSET][&follow=1][&cache_mb=N] opens a
 * replicated database lazily, read-only: its main file reads pages on demand from the
 * stream through the Go side (package lazy). No journal or WAL exists beside it; the
 * temporary files of sorts are plain unix files.
 */
typedef struct LFile {
  sqlite3_file base;
  uintptr_t h;  /* Go handle of the lazy file */
  int lock;     /* SQLITE_LOCK_NONE or SQLITE_LOCK_SHARED */
} LFile;

static sqlite3_vfs lazyVfs;

static int lzClose(sqlite3_file *f) {
  LFile *l = (LFile *)f;
  if (l->h) ursulaLazyClose(l->h);
  l->h = 0;
  return SQLITE_OK;
}
static int lzRead(sqlite3_file *f, void *buf, int n, sqlite3_int64 off) {
  return ursulaLazyRead(((LFile *)f)->h, buf, n, off);
}
static int lzWrite(sqlite3_file *f, const void *buf, int n, sqlite3_int64 off) { return SQLITE_READONLY; }
static int lzTruncate(sqlite3_file *f, sqlite3_int64 size) { return SQLITE_READONLY; }
static int lzSync(sqlite3_file *f, int flags) { return SQLITE_OK; }
static int lzFileSize(sqlite3_file *f, sqlite3_int64 *size) {
  *size = ursulaLazySize(((LFile *)f)->h);
  return SQLITE_OK;
}
static int lzLock(sqlite3_file *f, int level) {
  LFile *l = (LFile *)f;
  if (level > SQLITE_LOCK_SHARED) return SQLITE_READONLY;
  if (l->lock == SQLITE_LOCK_NONE && level == SQLITE_LOCK_SHARED) ursulaLazyPin(l->h, 1);
  if (level > l->lock) l->lock = level;
  return SQLITE_OK;
}
static int lzUnlock(sqlite3_file *f, int level) {
  LFile *l = (LFile *)f;
  if (level == SQLITE_LOCK_NONE && l->lock != SQLITE_LOCK_NONE) ursulaLazyPin(l->h, 0);
  if (level < l->lock) l->lock = level;
  return SQLITE_OK;
}
static int lzCheckReservedLock(sqlite3_file *f, int *out) {
  *out = 0;
  return SQLITE_OK;
}
static int lzFileControl(sqlite3_file *f, int op, void *arg) { return SQLITE_NOTFOUND; }
static int lzSectorSize(sqlite3_file *f) { return 4096; }
static int lzDeviceCharacteristics(sqlite3_file *f) {
  /* A fixed view never changes: SQLite may skip re-checking page 1. */
  return ursulaLazyLive(((LFile *)f)->h) ? 0 : SQLITE_IOCAP_IMMUTABLE;
}

static const sqlite3_io_methods lzMethods = {
    1,
    lzClose, lzRead, lzWrite, lzTruncate, lzSync, lzFileSize, lzLock, lzUnlock, lzCheckReservedLock,
    lzFileControl, lzSectorSize, lzDeviceCharacteristics,
};

static const char *uriParam(const char *name, const char *key) {
  const char *v = sqlite3_uri_parameter(name, key);
  return v ? v : "";
}

static int lzOpen(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *outFlags) {
  LFile *l = (LFile *)f;
  uintptr_t h = 0;
  char *err = 0;
  int rc;
  if (!name || !(flags & SQLITE_OPEN_MAIN_DB)) {
    if (flags & (SQLITE_OPEN_MAIN_JOURNAL | SQLITE_OPEN_WAL | SQLITE_OPEN_SUPER_JOURNAL)) {
      f->pMethods = 0;
      return SQLITE_CANTOPEN; /* a lazy database has no journal and writes none */
    }
    return unixVfs->xOpen(unixVfs, name, f, flags, outFlags);
  }
  memset(l, 0, sizeof(*l));
  rc = ursulaLazyOpen((char *)uriParam(name, "url"), (char *)uriParam(name, "at"), (char *)uriParam(name, "follow"),
                      (char *)uriParam(name, "cache_mb"), &h, &err);
  if (rc != SQLITE_OK) {
    fprintf(stderr, "sqlite-ursula-vfs level=warn event=lazy_open_failed reason=\"%s\"\n", err ? err : "unknown");
    free(err);
    return rc;
  }
  l->h = h;
  l->base.pMethods = &lzMethods;
  /* Read-only whatever was asked: SQLite refuses writes itself. */
  if (outFlags) *outFlags = (flags & ~(SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE)) | SQLITE_OPEN_READONLY;
  return SQLITE_OK;
}

/* lazyNamedOpen makes f (sized for a UFile, larger than an LFile) the lazy file of a name
 * ursula_lazy_open registered: the default VFS serves it as ursula-lazy would. */
static int lazyNamedOpen(sqlite3_file *f, uintptr_t h, int flags, int *outFlags) {
  LFile *l = (LFile *)f;
  memset(l, 0, sizeof(*l));
  l->h = h;
  l->base.pMethods = &lzMethods;
  if (outFlags) *outFlags = (flags & ~(SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE)) | SQLITE_OPEN_READONLY;
  return SQLITE_OK;
}

static int lzAccess(sqlite3_vfs *v, const char *name, int flags, int *out) {
  *out = 0; /* no journal, no WAL, no hot anything */
  return SQLITE_OK;
}

static void initLazyVfs(void) {
  lazyVfs = ursulaVfs; /* the unix pass-throughs, then the lazy parts */
  lazyVfs.zName = "ursula-lazy";
  lazyVfs.szOsFile = unixVfs->szOsFile > (int)sizeof(LFile) ? unixVfs->szOsFile : (int)sizeof(LFile);
  lazyVfs.xOpen = lzOpen;
  lazyVfs.xAccess = lzAccess;
}

/* ---- SQL functions ------------------------------------------------------------------- */

/* finish sets a function's result from a Go answer: a malloc'd string and a result code. */
static void finish(sqlite3_context *ctx, char *s, int rc) {
  if (rc == SQLITE_OK) {
    if (s) {
      sqlite3_result_text(ctx, s, -1, SQLITE_TRANSIENT);
    } else {
      sqlite3_result_null(ctx);
    }
  } else {
    sqlite3_result_error(ctx, s ? s : "ursula: unknown error", -1);
    if (rc != SQLITE_ERROR) sqlite3_result_error_code(ctx, rc);
  }
  free(s);
}

static const char *textArg(sqlite3_value *v) {
  return sqlite3_value_type(v) == SQLITE_NULL ? 0 : (const char *)sqlite3_value_text(v);
}

static void fnAttach(sqlite3_context *ctx, int argc, sqlite3_value **argv) {
  int rc = SQLITE_OK, ro = 0;
  char *s;
  const char *path = textArg(argv[0]), *url = textArg(argv[1]);
  if (argc == 3) {
    const char *mode = textArg(argv[2]);
    if (!mode || strcmp(mode, "read_only") != 0) {
      sqlite3_result_error(ctx, "ursula_attach: invalid_argument: the third argument must be 'read_only'", -1);
      return;
    }
    ro = 1;
  }
  if (!path || !url) {
    sqlite3_result_error(ctx, "ursula_attach: invalid_argument: path and url must be text", -1);
    return;
  }
  s = ursulaAttach((char *)path, (char *)url, ro, &rc);
  finish(ctx, s, rc);
}

static void fnStatus(sqlite3_context *ctx, int argc, sqlite3_value **argv) {
  int rc = SQLITE_OK;
  const char *path = textArg(argv[0]);
  char *s = ursulaStatus((char *)(path ? path : ""), 0, &rc);
  finish(ctx, s, rc);
}

static void fnStats(sqlite3_context *ctx, int argc, sqlite3_value **argv) {
  int rc = SQLITE_OK;
  const char *path = textArg(argv[0]);
  char *s = ursulaStatus((char *)(path ? path : ""), 1, &rc);
  finish(ctx, s, rc);
}

/* ursula_lazy_open(path, url [, at [, follow [, cache_mb]]]): NULL or '' for a default. */
static void fnLazyOpen(sqlite3_context *ctx, int argc, sqlite3_value **argv) {
  int rc = SQLITE_OK, i;
  const char *a[5] = {0, 0, "", "", ""};
  char *s;
  if (argc < 2 || argc > 5) {
    sqlite3_result_error(ctx, "ursula_lazy_open: invalid_argument: want (path, url [, at [, follow [, cache_mb]]])", -1);
    return;
  }
  for (i = 0; i < argc; i++) {
    const char *v = textArg(argv[i]);
    if (v) a[i] = v;
  }
  if (!a[0] || !a[1]) {
    sqlite3_result_error(ctx, "ursula_lazy_open: invalid_argument: path and url must be text", -1);
    return;
  }
  s = ursulaLazyRegister((char *)a[0], (char *)a[1], (char *)a[2], (char *)a[3], (char *)a[4], &rc);
  finish(ctx, s, rc);
}

static void fnSetToken(sqlite3_context *ctx, int argc, sqlite3_value **argv) {
  const char *tok = textArg(argv[0]);
  ursulaSetToken((char *)(tok ? tok : ""));
  sqlite3_result_null(ctx);
}

static int registerFunctions(sqlite3 *db) {
  /* DIRECTONLY: top-level SQL only, never from a trigger or a view (checklist U). */
  int fl = SQLITE_UTF8 | SQLITE_DIRECTONLY;
  int rc = sqlite3_create_function(db, "ursula_attach", 2, fl, 0, fnAttach, 0, 0);
  if (rc == SQLITE_OK) rc = sqlite3_create_function(db, "ursula_attach", 3, fl, 0, fnAttach, 0, 0);
  if (rc == SQLITE_OK) rc = sqlite3_create_function(db, "ursula_status", 1, fl, 0, fnStatus, 0, 0);
  if (rc == SQLITE_OK) rc = sqlite3_create_function(db, "ursula_stats", 1, fl, 0, fnStats, 0, 0);
  if (rc == SQLITE_OK) rc = sqlite3_create_function(db, "ursula_set_token", 1, fl, 0, fnSetToken, 0, 0);
  if (rc == SQLITE_OK) rc = sqlite3_create_function(db, "ursula_lazy_open", -1, fl, 0, fnLazyOpen, 0, 0);
  return rc;
}

int ursula_init_wal(const char *path, char **err) {
  sqlite3 *db = 0;
  sqlite3_stmt *st = 0;
  int rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, "ursula");
  if (rc == SQLITE_OK) rc = sqlite3_exec(db, "PRAGMA page_size=4096", 0, 0, 0);
  if (rc == SQLITE_OK) rc = sqlite3_prepare_v2(db, "PRAGMA journal_mode=WAL", -1, &st, 0);
  if (rc == SQLITE_OK) {
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW && sqlite3_stricmp((const char *)sqlite3_column_text(st, 0), "wal") == 0) {
      rc = SQLITE_OK;
    } else if (rc == SQLITE_ROW || rc == SQLITE_DONE) {
      rc = SQLITE_ERROR;
    }
  }
  if (rc != SQLITE_OK && err) {
    *err = strdup(db ? sqlite3_errmsg(db) : "out of memory");
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return rc;
}

/* autoInit registers the SQL functions on every connection opened after the load. */
static int autoInit(sqlite3 *db, const char **err, const sqlite3_api_routines *api) {
  SQLITE_EXTENSION_INIT2(api);
  registerFunctions(db);
  return SQLITE_OK;
}

#ifdef _WIN32
__declspec(dllexport)
#endif
int sqlite3_ursulavfs_init(sqlite3 *db, char **err, const sqlite3_api_routines *api) {
  int rc = SQLITE_OK;
  SQLITE_EXTENSION_INIT2(api);
  pthread_mutex_lock(&initMu);
  if (!initialized) {
    unixVfs = sqlite3_vfs_find("unix");
    if (!unixVfs) {
      pthread_mutex_unlock(&initMu);
      if (err) *err = sqlite3_mprintf("ursula: SQLite has no \"unix\" VFS to build on");
      return SQLITE_ERROR;
    }
    ursulaVfs.iVersion = 3;
    ursulaVfs.szOsFile = (int)sizeof(UFile) + unixVfs->szOsFile;
    ursulaVfs.mxPathname = unixVfs->mxPathname;
    ursulaVfs.zName = "ursula";
    ursulaVfs.xOpen = uOpen;
    ursulaVfs.xDelete = uDelete;
    ursulaVfs.xAccess = uAccess;
    ursulaVfs.xFullPathname = uFullPathname;
    ursulaVfs.xDlOpen = uDlOpen;
    ursulaVfs.xDlError = uDlError;
    ursulaVfs.xDlSym = uDlSym;
    ursulaVfs.xDlClose = uDlClose;
    ursulaVfs.xRandomness = uRandomness;
    ursulaVfs.xSleep = uSleep;
    ursulaVfs.xCurrentTime = uCurrentTime;
    ursulaVfs.xGetLastError = uGetLastError;
    ursulaVfs.xCurrentTimeInt64 = uCurrentTimeInt64;
    ursulaVfs.xSetSystemCall = uSetSystemCall;
    ursulaVfs.xGetSystemCall = uGetSystemCall;
    ursulaVfs.xNextSystemCall = uNextSystemCall;
    rc = sqlite3_vfs_register(&ursulaVfs, 1);
    if (rc == SQLITE_OK) {
      initLazyVfs();
      rc = sqlite3_vfs_register(&lazyVfs, 0);
    }
    if (rc == SQLITE_OK) rc = sqlite3_auto_extension((void (*)(void))autoInit);
    if (rc == SQLITE_OK) initialized = 1;
  }
  pthread_mutex_unlock(&initMu);
  if (rc == SQLITE_OK) rc = registerFunctions(db);
  /* A Go runtime can never be unloaded. */
  return rc == SQLITE_OK ? SQLITE_OK_LOAD_PERMANENTLY : rc;
}
