/* The C side of the loadable extension: a thin VFS over SQLite's "unix" VFS. See shim.c. */
#ifndef URSULA_SHIM_H
#define URSULA_SHIM_H

#include <stdint.h>

/* Opaque to Go: the underlying unix sqlite3_file. */
typedef struct sqlite3_file sqlite3_file;

/* File kinds Go's ursulaOpen answers with. */
#define URSULA_FILE_PLAIN 0 /* not an attached database: pure pass-through */
#define URSULA_FILE_MAIN 1  /* the main database file of an attached database */
#define URSULA_FILE_WAL 2   /* the -wal of an attached (owner) database: writes go to Go */
#define URSULA_FILE_MAIN_RO 3 /* the main file of a read-only attach: opened read-only */
#define URSULA_FILE_WAL_RO 4  /* the -wal of a read-only attach: writes refused */
#define URSULA_FILE_LAZY 5    /* the main file of a name ursula_lazy_open registered */

/* Result codes Go hands back (copied from sqlite3.h so Go needs no SQLite header). */
#define URSULA_OK 0
#define URSULA_ERROR 1
#define URSULA_AUTH 23
#define URSULA_CANTOPEN 14
#define URSULA_IOERR_READ 266
#define URSULA_IOERR_WRITE 778
#define URSULA_IOERR_AUTH 7178

/* The real (unix) file's xRead/xWrite, for Go's sqlitewal.WALFile. */
int ursula_real_read(sqlite3_file *real, void *buf, int n, int64_t off);
int ursula_real_write(sqlite3_file *real, const void *buf, int n, int64_t off);

/* Atomic access to a fence flag (C memory the Go side allocates and sets). */
void ursula_flag_set(volatile int *flag, int v);
int ursula_flag_get(volatile int *flag);

/* Initializes an empty attached file to WAL mode with 4 KiB pages through the ursula VFS.
 * Returns a SQLite result code; *err gets a malloc'd message on failure. */
int ursula_init_wal(const char *path, char **err);

#endif
