package main

/*
#include <stdlib.h>
#include <string.h>
#include "shim.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/cgo"
	"strings"
	"sync"
	"unsafe"

	"github.com/ursula-go/ursula/lazy"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
)

// The ursula-lazy VFS (shim.c): file:NAME?vfs=ursula-lazy&url=STREAM_URL opens a
// replicated database lazily, read-only, through package lazy. The C side keeps the
// lock level and calls here to open, read, size, pin and unpin a view, and close.

// lazyPool shares one lazy source among the connections of this process that open the
// same stream with the same parameters.
var (
	lazyPool     = &lazy.Pool{}
	lazyPoolOnce sync.Once
	lazyPoolErr  error // the client could not be made (URSULA_VFS_CA_FILE)
)

type lazyHandle struct {
	f   *lazy.File
	src *lazy.Source
}

// ursulaLazyOpen opens the main file of a lazy database from its URI parameters. It
// returns a SQLite result code; on failure *errOut gets a malloc'd reason.
//
//export ursulaLazyOpen
func ursulaLazyOpen(curl, cat, cfollow, ccache *C.char, h *C.uintptr_t, errOut **C.char) (rc C.int) {
	defer func() {
		if r := recover(); r != nil {
			*errOut = C.CString(fmt.Sprintf("panic: %v", r))
			rc = C.URSULA_CANTOPEN
		}
	}()
	params := map[string]string{"url": C.GoString(curl), "at": C.GoString(cat), "follow": C.GoString(cfollow), "cache_mb": C.GoString(ccache)}
	url, opts, err := lazy.ParseURI(func(k string) string { return params[k] })
	if err != nil {
		*errOut = C.CString(err.Error())
		return C.URSULA_CANTOPEN
	}
	if err := lazyClient(url); err != nil {
		*errOut = C.CString(fmt.Sprintf("%s: %v", url, err))
		return C.URSULA_CANTOPEN
	}
	src, err := lazyPool.Acquire(context.Background(), url, opts)
	if err != nil {
		*errOut = C.CString(fmt.Sprintf("%s: %v", url, err))
		return C.URSULA_CANTOPEN
	}
	*h = C.uintptr_t(cgo.NewHandle(&lazyHandle{f: src.NewFile(), src: src}))
	return C.URSULA_OK
}

func lazyOf(h C.uintptr_t) *lazyHandle { return cgo.Handle(h).Value().(*lazyHandle) }

// ursulaLazyRead is xRead: SQLITE_IOERR_SHORT_READ (the rest zeroed) past the end.
//
//export ursulaLazyRead
func ursulaLazyRead(h C.uintptr_t, buf unsafe.Pointer, n C.int, off C.int64_t) (rc C.int) {
	defer func() {
		if r := recover(); r != nil {
			logEvent("error", "panic", "entry=lazy_read message=%q", fmt.Sprint(r))
			rc = C.URSULA_IOERR_READ
		}
	}()
	p := unsafe.Slice((*byte)(buf), int(n))
	got, err := lazyOf(h).f.ReadAt(p, int64(off))
	if err != nil && !errors.Is(err, io.EOF) {
		logEvent("warn", "lazy_read_failed", "offset=%d err=%q", int64(off), err.Error())
		return C.URSULA_IOERR_READ
	}
	if got < len(p) {
		clear(p[got:])
		return 522 // SQLITE_IOERR_SHORT_READ
	}
	return C.URSULA_OK
}

//export ursulaLazySize
func ursulaLazySize(h C.uintptr_t) C.int64_t { return C.int64_t(lazyOf(h).f.Size()) }

// ursulaLazyPin pins the latest view when a read transaction begins (pin != 0) and drops
// it when it ends.
//
//export ursulaLazyPin
func ursulaLazyPin(h C.uintptr_t, pin C.int) {
	if pin != 0 {
		lazyOf(h).f.LockShared()
	} else {
		lazyOf(h).f.Unlock()
	}
}

//export ursulaLazyLive
func ursulaLazyLive(h C.uintptr_t) C.int {
	if lazyOf(h).f.Live() {
		return 1
	}
	return 0
}

//export ursulaLazyClose
func ursulaLazyClose(h C.uintptr_t) {
	handle := cgo.Handle(h)
	lh := handle.Value().(*lazyHandle)
	handle.Delete()
	lazyPool.Release(lh.src)
}

// Lazy names: ursula_lazy_open(path, url [, at [, follow [, cache_mb]]]) registers a
// local path (which need not exist) as served by the lazy source of url, so that a
// program that cannot name a VFS or pass a URI (better-sqlite3) opens it lazily through
// the default ursula VFS: its xOpen of the main file hands the open to the lazy side,
// read-only, and refuses a -wal or -journal beside it.

type lazyName struct {
	url  string
	opts lazy.Options
	held *lazy.Source // the registration's hold, until the first open takes its own
}

var (
	lazyMu    sync.Mutex
	lazyNames = map[string]*lazyName{}
)

// ursulaLazyRegister is ursula_lazy_open: it indexes the stream now (a bad URL, a missing
// stream or an unreadable offset is an error here, not at the open) and answers the
// offset the first open of path reads at.
//
//export ursulaLazyRegister
func ursulaLazyRegister(cpath, curl, cat, cfollow, ccache *C.char, rc *C.int) (out *C.char) {
	defer func() {
		if r := recover(); r != nil {
			logEvent("error", "panic", "entry=ursula_lazy_open message=%q", fmt.Sprint(r))
			out = answer(fmt.Sprintf("ursula_lazy_open: internal: panic: %v", r), C.URSULA_ERROR, rc)
		}
	}()
	off, err := lazyRegister(C.GoString(cpath), map[string]string{"url": C.GoString(curl), "at": C.GoString(cat),
		"follow": C.GoString(cfollow), "cache_mb": C.GoString(ccache)})
	if err != nil {
		s, code := fnError("ursula_lazy_open", err)
		return answer(s, code, rc)
	}
	return answer(streamcore.FormatOffset(off), C.URSULA_OK, rc)
}

func lazyRegister(path string, params map[string]string) (uint64, error) {
	if path == "" || path == ":memory:" || strings.HasPrefix(path, "file:") {
		return 0, setupErr(replicator.KindInvalidArg, "the name must be a plain file path (not %q)", path)
	}
	url, opts, err := lazy.ParseURI(func(k string) string { return params[k] })
	if err != nil {
		return 0, setupErr(replicator.KindInvalidArg, "%s", strings.TrimPrefix(err.Error(), "ursula-lazy: "))
	}
	if err := replicator.CheckURL(url); err != nil {
		return 0, err
	}
	abs, err := canonical(path)
	if err != nil {
		return 0, setupErr(replicator.KindLocalSetup, "cannot resolve %s: %v", path, err)
	}
	mu.Lock()
	attached := states[abs] != nil
	mu.Unlock()
	if attached {
		return 0, setupErr(replicator.KindInUse, "%s is attached to a stream in this process; a lazy name must be another path", abs)
	}
	if err := lazyClient(url); err != nil {
		return 0, err
	}
	src, err := lazyPool.Acquire(context.Background(), url, opts)
	if err != nil {
		return 0, err
	}
	lazyMu.Lock()
	old := lazyNames[abs]
	lazyNames[abs] = &lazyName{url: url, opts: opts, held: src}
	lazyMu.Unlock()
	if old != nil && old.held != nil {
		lazyPool.Release(old.held)
	}
	return src.View().Offset(), nil
}

func lazyNamed(path string) bool {
	lazyMu.Lock()
	defer lazyMu.Unlock()
	return lazyNames[path] != nil
}

// lazyOpenNamed answers ursulaOpen for a registered lazy name: ok is false when path is
// none of one. A main file opens lazily (URSULA_FILE_LAZY, *h the lazy handle); a -wal
// or -journal beside it is refused.
func lazyOpenNamed(path string, flags C.int, h *C.uintptr_t) (kind C.int, ok bool) {
	const mainDB, wal, journal = 0x00000100, 0x00080000, 0x00000800
	lazyMu.Lock()
	defer lazyMu.Unlock()
	switch {
	case flags&mainDB != 0:
		n := lazyNames[path]
		if n == nil {
			return 0, false
		}
		src, err := lazyPool.Acquire(context.Background(), n.url, n.opts)
		if err != nil {
			logEvent("warn", "lazy_open_failed", "file=%q url=%q err=%q", path, n.url, err.Error())
			return -C.URSULA_CANTOPEN, true
		}
		if n.held != nil {
			lazyPool.Release(n.held)
			n.held = nil
		}
		*h = C.uintptr_t(cgo.NewHandle(&lazyHandle{f: src.NewFile(), src: src}))
		return C.URSULA_FILE_LAZY, true
	case flags&wal != 0 && lazyNames[strings.TrimSuffix(path, "-wal")] != nil,
		flags&journal != 0 && lazyNames[strings.TrimSuffix(path, "-journal")] != nil:
		return -C.URSULA_CANTOPEN, true // a lazy database has no journal and writes none
	}
	return 0, false
}

// lazyClient gives the lazy pool its client once, with the same settings as an attach
// (URSULA_VFS_CA_FILE, token, idle time); url only names the events it logs.
func lazyClient(url string) error {
	lazyPoolOnce.Do(func() { lazyPool.Client, lazyPoolErr = replicator.NewClient(url, os.Stderr) })
	return lazyPoolErr
}
