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
	"sync"
	"unsafe"

	"github.com/ursula-go/ursula/lazy"
	"github.com/ursula-go/ursula/replicator"
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
	// The same client settings as an attach (URSULA_VFS_CA_FILE, token, idle time).
	lazyPoolOnce.Do(func() { lazyPool.Client, lazyPoolErr = replicator.NewClient(url, os.Stderr) })
	if lazyPoolErr != nil {
		*errOut = C.CString(fmt.Sprintf("%s: %v", url, lazyPoolErr))
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
