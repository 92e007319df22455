// Package sidecar reads and writes the sidecar file <db>-ursula beside an attached
// database: what the local files reflect, and the facts (boot id, inode) that decide
// whether they can be trusted after a restart.
package sidecar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
)

// sidecarFormat versions the sidecar file; any other value means "do not trust it".
const sidecarFormat = 1

// File is the content of the sidecar <db>-ursula beside an attached database: what the local files
// reflect, and the facts that decide whether they can be trusted after a restart. It is
// replaced atomically (write to a temporary file, rename) and never fsynced: a power loss
// changes the boot id, and a new boot rebuilds from the stream anyway.
type File struct {
	Format      int    `json:"format"`
	URL         string `json:"url"`         // the stream URL exactly as attached
	Incarnation string `json:"incarnation"` // Stream-Incarnation of the stream
	Offset      uint64 `json:"offset"`      // the local files reflect at least the stream up to here
	Epoch       uint64 `json:"epoch"`       // the epoch this owner claimed (0: read-only)
	BootID      string `json:"boot_id"`     // /proc/sys/kernel/random/boot_id when written
	Inode       uint64 `json:"inode"`       // inode of the database file
	// Damaged says why the local files no longer reflect Offset (they lost a write the
	// stream holds); the next attach rebuilds them. Empty when they are sound.
	Damaged string `json:"damaged,omitempty"`
}

// Path is where the sidecar of the database at path lives.
func Path(path string) string { return path + "-ursula" }

// Read reads the sidecar of path. A missing sidecar is (nil, nil); an unreadable
// or damaged one is an error.
func Read(path string) (*File, error) {
	b, err := os.ReadFile(Path(path))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var sc File
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sc); err != nil {
		return nil, fmt.Errorf("sidecar %s is damaged: %w", Path(path), err)
	}
	if sc.Format != sidecarFormat {
		return nil, fmt.Errorf("sidecar %s has format %d, this build writes %d", Path(path), sc.Format, sidecarFormat)
	}
	return &sc, nil
}

// Write replaces the sidecar of path atomically.
func Write(path string, sc *File) error {
	sc.Format = sidecarFormat
	b, err := json.Marshal(sc)
	if err != nil {
		return err
	}
	tmp := Path(path) + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, Path(path))
}

// BootID is the kernel's boot id: it changes on every boot, so a sidecar written on
// another boot (a reboot, a power loss, another host) is never resumed from.
func BootID() string { return bootID() }

var bootID = sync.OnceValue(func() string {
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		return string(bytes.TrimSpace(b))
	}
	return "" // never resume
})

// Inode of the file at path (0 when it does not exist).
func Inode(path string) uint64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return s.Ino
	}
	return 0
}
