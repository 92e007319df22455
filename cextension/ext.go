package main

/*
#cgo CFLAGS: -O2 -Wall -Wno-unused-function
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime/cgo"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/sqlitewal"
	"github.com/ursula-go/ursula/streamcore"
)

func main() {}

// dbState is one database attached through the extension.
type dbState struct {
	db       *sqlitewal.Database
	path     string
	fence    *C.int // C memory; never freed (an open file may still point at it)
	opens    int    // open main and -wal handles of this attachment
	readOnly bool
	stop     chan struct{}
}

// watch sets the fence flag if the replica turns unusable outside a -wal write (today
// every transition happens inside one, where ursulaWalWrite sets the flag at once; this
// bounds the delay for any later path, such as a background task meeting a fence).
func (st *dbState) watch() {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-st.stop:
			return
		case <-t.C:
			if st.db.Usable() != nil {
				C.ursula_flag_set(st.fence, 1)
				return
			}
		}
	}
}

// fileHandle is what a wrapped C file holds (as a cgo.Handle).
type fileHandle struct {
	st  *dbState
	wal *sqlitewal.WAL // owner -wal only
}

var (
	attachMu sync.Mutex // serializes ursula_attach
	mu       sync.Mutex // guards states and failed; never held across network calls
	states   = map[string]*dbState{}
	failed   = map[string]string{} // path -> why its last attach failed (open is locked out)
)

// cWAL is the unix VFS's -wal file under the interception: sqlitewal.WALFile over C.
type cWAL struct{ f *C.sqlite3_file }

func (w cWAL) ReadAt(p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if rc := C.ursula_real_read(w.f, unsafe.Pointer(&p[0]), C.int(len(p)), C.int64_t(off)); rc != 0 {
		return 0, fmt.Errorf("xRead of the WAL failed with SQLite code %d", int(rc))
	}
	return len(p), nil
}

func (w cWAL) WriteAt(p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if rc := C.ursula_real_write(w.f, unsafe.Pointer(&p[0]), C.int(len(p)), C.int64_t(off)); rc != 0 {
		return 0, fmt.Errorf("xWrite of the WAL failed with SQLite code %d", int(rc))
	}
	return len(p), nil
}

func logEvent(level, event, format string, args ...any) {
	fmt.Fprintf(os.Stderr, "sqlite-ursula-vfs level=%s event=%s %s\n", level, event, fmt.Sprintf(format, args...))
}

// testPanicEntry is URSULA_VFS_TEST_PANIC, read once: this package's tests name an entry
// point (xOpen, x_write, ursula_attach, ursula_status) that then panics once, to check that
// a panic fails the call alone and the process goes on (checklist-vfs T52). Unset in use.
var (
	testPanicOnce  sync.Once
	testPanicEntry string
	testPanicked   sync.Map
)

func injectPanic(entry string) {
	testPanicOnce.Do(func() { testPanicEntry = os.Getenv("URSULA_VFS_TEST_PANIC") })
	if testPanicEntry == entry {
		if _, done := testPanicked.LoadOrStore(entry, true); !done {
			panic("injected panic in " + entry)
		}
	}
}

// ursulaOpen is called by xOpen for main databases, -wal files and rollback journals. It
// returns a URSULA_FILE_* kind, or minus an SQLite code to refuse the open.
//
//export ursulaOpen
func ursulaOpen(cpath *C.char, flags C.int, real *C.sqlite3_file, fence **C.int, h *C.uintptr_t) (kind C.int) {
	defer func() {
		if r := recover(); r != nil {
			logEvent("error", "panic", "entry=xOpen message=%q", fmt.Sprint(r))
			kind = -C.URSULA_CANTOPEN
		}
	}()
	path := C.GoString(cpath)
	if k, ok := lazyOpenNamed(path, flags, h); ok {
		return k
	}
	mu.Lock()
	defer mu.Unlock()
	switch {
	case flags&0x00080000 != 0: // SQLITE_OPEN_WAL
		st := states[strings.TrimSuffix(path, "-wal")]
		if st == nil {
			return C.URSULA_FILE_PLAIN
		}
		fh := &fileHandle{st: st}
		kind = C.URSULA_FILE_WAL_RO
		if !st.readOnly {
			fh.wal = st.db.NewWAL(cWAL{real})
			kind = C.URSULA_FILE_WAL
		}
		st.opens++
		*fence, *h = st.fence, C.uintptr_t(cgo.NewHandle(fh))
		return kind
	case flags&0x00000100 != 0: // SQLITE_OPEN_MAIN_DB
		st := states[path]
		if st == nil {
			if why, ok := failed[path]; ok {
				logEvent("warn", "open_refused", "file=%q reason=%q", path, "its last attach failed: "+why)
				return -C.URSULA_CANTOPEN
			}
			if _, err := os.Stat(replicator.SidecarPath(path)); err == nil {
				logEvent("warn", "open_refused", "file=%q reason=%q", path, "a replicated file opens only after ursula_attach succeeded in this process")
				return -C.URSULA_CANTOPEN
			}
			return C.URSULA_FILE_PLAIN
		}
		injectPanic("xOpen")
		st.opens++
		*fence, *h = st.fence, C.uintptr_t(cgo.NewHandle(&fileHandle{st: st}))
		if st.readOnly {
			return C.URSULA_FILE_MAIN_RO
		}
		return C.URSULA_FILE_MAIN
	case flags&0x00000800 != 0: // SQLITE_OPEN_MAIN_JOURNAL
		db := strings.TrimSuffix(path, "-journal")
		if st := states[db]; st != nil && !st.readOnly {
			if fi, err := os.Stat(db); err == nil && fi.Size() > 0 {
				// Rollback-journal writes go straight to the database file, past the WAL.
				logEvent("warn", "journal_refused", "file=%q reason=%q", db, "a replicated database must stay in WAL mode")
				return -C.URSULA_CANTOPEN
			}
		}
	}
	return C.URSULA_FILE_PLAIN
}

//export ursulaClose
func ursulaClose(h C.uintptr_t) {
	handle := cgo.Handle(h)
	fh := handle.Value().(*fileHandle)
	mu.Lock()
	fh.st.opens--
	mu.Unlock()
	handle.Delete()
}

// ursulaWalWrite is xWrite of an owner's -wal: the Go core's interception.
//
//export ursulaWalWrite
func ursulaWalWrite(h C.uintptr_t, buf unsafe.Pointer, n C.int, off C.int64_t) (rc C.int) {
	fh := cgo.Handle(h).Value().(*fileHandle)
	defer func() {
		if r := recover(); r != nil {
			logEvent("error", "panic", "entry=x_write message=%q", fmt.Sprint(r))
			fh.st.db.Replica().Poison(fmt.Sprintf("panic in x_write: %v", r))
			C.ursula_flag_set((*C.int)(fh.st.fence), 1)
			rc = C.URSULA_IOERR_WRITE
		}
	}()
	injectPanic("x_write")
	_, err := fh.wal.WriteAt(unsafe.Slice((*byte)(buf), int(n)), int64(off))
	if err == nil {
		return C.URSULA_OK
	}
	if fh.st.db.Usable() != nil {
		// Fenced or poisoned: from now on the C read path refuses without asking Go.
		C.ursula_flag_set(fh.st.fence, 1)
	}
	return C.int(sqlitewal.ResultCode(err))
}

//export ursulaWalTruncate
func ursulaWalTruncate(h C.uintptr_t) {
	fh := cgo.Handle(h).Value().(*fileHandle)
	fh.wal.Truncate()
}

// ---- SQL functions ----------------------------------------------------------------------

// fnError formats an error as "<function>: <kind>: <message>" with its SQLite code.
func fnError(fn string, err error) (string, C.int) {
	e, ok := replicator.AsError(err)
	if !ok {
		return fmt.Sprintf("%s: internal: %v", fn, err), C.URSULA_ERROR
	}
	msg, kind, code := e.Message, string(e.Kind), C.int(C.URSULA_ERROR)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	var ce *client.Error
	if errors.As(err, &ce) && e.Kind == replicator.KindNotApplied {
		switch ce.Status {
		case http.StatusPaymentRequired:
			kind, code = "payment_required", C.URSULA_AUTH
		case http.StatusUnauthorized:
			kind, code = "unauthorized", C.URSULA_IOERR_AUTH
		case http.StatusForbidden:
			kind, code = "forbidden", C.URSULA_IOERR_AUTH
		case http.StatusTooManyRequests:
			kind, code = "rate_limited", C.URSULA_IOERR_AUTH
		default:
			code = C.URSULA_IOERR_AUTH
		}
	}
	return fmt.Sprintf("%s: %s: %s", fn, kind, msg), code
}

func answer(s string, rc C.int, out *C.int) *C.char {
	*out = rc
	return C.CString(s)
}

// canonical makes path absolute with symlinks resolved, as SQLite's unix xFullPathname
// names it.
func canonical(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if p, err := filepath.EvalSymlinks(abs); err == nil {
		return p, nil
	}
	if d, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		return filepath.Join(d, filepath.Base(abs)), nil
	}
	return abs, nil
}

// openElsewhere reports whether this process has the database or its -wal, -shm or
// -journal open (another VFS, or a connection opened before the attach).
func openElsewhere(path string) bool {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return false
	}
	for _, e := range ents {
		t, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil {
			continue
		}
		switch t {
		case path, path + "-wal", path + "-shm", path + "-journal":
			return true
		}
	}
	return false
}

func setupErr(kind replicator.Kind, format string, args ...any) error {
	return &replicator.Error{Kind: kind, Action: replicator.ActionFix, Message: fmt.Sprintf(format, args...)}
}

// ursulaAttach is ursula_attach(path, url [, 'read_only']).
//
//export ursulaAttach
func ursulaAttach(cpath, curl *C.char, readOnly C.int, rc *C.int) (out *C.char) {
	defer func() {
		if r := recover(); r != nil {
			logEvent("error", "panic", "entry=ursula_attach message=%q", fmt.Sprint(r))
			out = answer(fmt.Sprintf("ursula_attach: internal: panic: %v", r), C.URSULA_ERROR, rc)
		}
	}()
	off, err := attach(C.GoString(cpath), C.GoString(curl), readOnly != 0)
	if err != nil {
		s, code := fnError("ursula_attach", err)
		return answer(s, code, rc)
	}
	return answer(streamcore.FormatOffset(off), C.URSULA_OK, rc)
}

func attach(path, url string, readOnly bool) (uint64, error) {
	injectPanic("ursula_attach")
	if path == "" || path == ":memory:" || strings.HasPrefix(path, "file:") {
		return 0, setupErr(replicator.KindInvalidArg, "the file must be a plain file path (not %q)", path)
	}
	if err := replicator.CheckURL(url); err != nil {
		return 0, err
	}
	abs, err := canonical(path)
	if err != nil {
		return 0, setupErr(replicator.KindLocalSetup, "cannot resolve %s: %v", path, err)
	}
	if lazyNamed(abs) {
		return 0, setupErr(replicator.KindInUse, "%s is a lazy name (ursula_lazy_open) in this process; attach another path", abs)
	}
	attachMu.Lock()
	defer attachMu.Unlock()

	mu.Lock()
	st := states[abs]
	mu.Unlock()
	if st != nil {
		switch {
		case !client.SameStream(st.db.URL(), url):
			return 0, setupErr(replicator.KindOtherStream, "%s is attached to %s in this process, not %s", abs, st.db.URL(), url)
		case st.readOnly != readOnly:
			return 0, setupErr(replicator.KindInUse, "%s is already attached in this process in the other mode (read-only vs owner)", abs)
		case st.db.Usable() == nil && !readOnly:
			return st.db.Offset(), nil
		}
		// Fenced, poisoned, or a read-only file to catch up: attach again, which needs
		// every connection to it closed.
		mu.Lock()
		opens := st.opens
		if opens == 0 {
			delete(states, abs)
		}
		mu.Unlock()
		if opens > 0 {
			if readOnly {
				return st.db.Offset(), nil
			}
			return 0, setupErr(replicator.KindInUse, "%s is fenced or poisoned and still open here (%d file handles): close every connection to it, then attach again", abs, opens)
		}
		close(st.stop)
		st.db.Detach()
	} else if openElsewhere(abs) {
		return 0, setupErr(replicator.KindInUse, "%s is open in this process outside the ursula VFS (or was opened before ursula_attach): close it first", abs)
	}

	db, err := sqlitewal.Attach(abs, url, sqlitewal.AttachOptions{ReadOnly: readOnly})
	if err != nil {
		if e, ok := replicator.AsError(err); !ok || !refusalChangesNothing(e.Kind) {
			mu.Lock()
			failed[abs] = err.Error()
			mu.Unlock()
		}
		return 0, err
	}
	fence := (*C.int)(C.calloc(1, C.size_t(unsafe.Sizeof(C.int(0)))))
	nst := &dbState{db: db, path: abs, fence: fence, readOnly: readOnly, stop: make(chan struct{})}
	mu.Lock()
	states[abs] = nst
	delete(failed, abs)
	mu.Unlock()
	if !readOnly {
		go nst.watch()
	}
	if fi, err := os.Stat(abs); !readOnly && (err != nil || fi.Size() == 0) {
		// A new database: make it WAL with 4 KiB pages before anyone writes to it.
		cp := C.CString(abs)
		var cerr *C.char
		r := C.ursula_init_wal(cp, &cerr)
		C.free(unsafe.Pointer(cp))
		if r != 0 {
			msg := C.GoString(cerr)
			C.free(unsafe.Pointer(cerr))
			mu.Lock()
			delete(states, abs)
			mu.Unlock()
			close(nst.stop)
			db.Detach()
			return 0, setupErr(replicator.KindLocalSetup, "cannot put %s in WAL mode: %s", abs, msg)
		}
	}
	return db.Offset(), nil
}

// refusalChangesNothing reports the attach refusals that leave the files untouched and
// so do not lock the file out (checklist-vfs C).
func refusalChangesNothing(k replicator.Kind) bool {
	switch k {
	case replicator.KindInvalidURL, replicator.KindInUse, replicator.KindUnreplicated,
		replicator.KindOtherStream, replicator.KindNotFound, replicator.KindInvalidArg:
		return true
	}
	return false
}

// statusJSON is ursula_status's answer: the replicator's Status plus the file and the
// attach mode, with the offset as the opaque 20-digit string ursula_attach returns (like
// snapshot and retained; checklist-vfs Q).
type statusJSON struct {
	replicator.Status
	Offset   string `json:"offset"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only"`
}

// statsJSON is ursula_stats's answer: the measurements drained from the replica
// (replicator.Stats: commit, checkpoint and snapshot lists, dropped, and the commits,
// bytes and retries since the last drain), plus the file, its log bytes and its offset.
type statsJSON struct {
	replicator.Stats
	Path     string `json:"path"`
	LogBytes uint64 `json:"log_bytes"`
	Offset   string `json:"offset"`
}

// ursulaStatus is ursula_status(path) (stats == 0) and ursula_stats(path) (stats != 0).
//
//export ursulaStatus
func ursulaStatus(cpath *C.char, stats C.int, rc *C.int) (out *C.char) {
	fn := "ursula_status"
	if stats != 0 {
		fn = "ursula_stats"
	}
	defer func() {
		if r := recover(); r != nil {
			logEvent("error", "panic", "entry=%s message=%q", fn, fmt.Sprint(r))
			out = answer(fmt.Sprintf("%s: internal: panic: %v", fn, r), C.URSULA_ERROR, rc)
		}
	}()
	injectPanic(fn)
	path := C.GoString(cpath)
	abs, err := canonical(path)
	if err != nil {
		abs = path
	}
	mu.Lock()
	st, why := states[abs], failed[abs]
	mu.Unlock()
	if st == nil {
		if why != "" {
			return answer(fmt.Sprintf("%s: attach_failed: %s is not attached: its last attach failed (%s)", fn, abs, why), C.URSULA_ERROR, rc)
		}
		return answer(fmt.Sprintf("%s: not_attached: %s is not attached in this process", fn, abs), C.URSULA_ERROR, rc)
	}
	var s replicator.Status
	var drained replicator.Stats
	if r := st.db.Replica(); r != nil {
		s = r.Status()
		if stats != 0 {
			drained = r.DrainStats()
		}
		if st.db.Usable() != nil {
			C.ursula_flag_set(st.fence, 1)
		}
	} else {
		s = replicator.Status{URL: st.db.URL(), Offset: st.db.Offset()}
	}
	var b []byte
	if stats != 0 {
		if drained.Commit == nil { // read-only: nothing measured; lists stay [] in JSON
			drained.Commit, drained.Checkpoint, drained.Snapshot = []replicator.CommitMeasurement{}, []replicator.CheckpointMeasurement{}, []replicator.SnapshotMeasurement{}
		}
		b, err = json.Marshal(statsJSON{Stats: drained, Path: abs, LogBytes: s.LogBytes, Offset: streamcore.FormatOffset(s.Offset)})
	} else {
		b, err = json.Marshal(statusJSON{Status: s, Offset: streamcore.FormatOffset(s.Offset), Path: abs, ReadOnly: st.readOnly})
	}
	if err != nil {
		return answer(fmt.Sprintf("%s: internal: %v", fn, err), C.URSULA_ERROR, rc)
	}
	return answer(string(b), C.URSULA_OK, rc)
}

// ursulaSetToken is ursula_set_token(token): "" (SQL NULL) clears it.
//
//export ursulaSetToken
func ursulaSetToken(ctok *C.char) {
	replicator.SetToken(C.GoString(ctok))
}
