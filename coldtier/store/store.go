// Package store is the object store behind the cold tier: a narrow interface with two
// backends, s3 (any S3-compatible endpoint, via aws-sdk-go-v2) and fs (a local directory).
//
// Objects are immutable once written: the cold tier never overwrites a key, so readers
// may cache ranges of an object forever.
package store

import (
	"context"
	"errors"
	"io"
	"time"
)

// ErrNotFound is returned (wrapped) when a key does not exist.
var ErrNotFound = errors.New("coldstore: object not found")

// ObjectInfo describes one stored object.
type ObjectInfo struct {
	Key     string
	Size    int64
	ModTime time.Time
}

// Store is an object store. Keys are '/'-separated paths relative to the store's root
// (prefix or directory); every method is safe for concurrent use.
type Store interface {
	// Put writes body (exactly size bytes) under key, atomically: a reader sees either
	// no object or the whole of it.
	Put(ctx context.Context, key string, body io.Reader, size int64) error
	// GetRange returns the bytes [off, off+n) of key; n < 0 reads to the end. A range
	// beyond the end is cut at the end.
	GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error)
	// Head returns the size and modification time of key (ErrNotFound when missing).
	Head(ctx context.Context, key string) (ObjectInfo, error)
	// Delete removes key; deleting a missing key is not an error.
	Delete(ctx context.Context, key string) error
	// List calls fn for every object whose key starts with prefix, in key order, until
	// fn returns false.
	List(ctx context.Context, prefix string, fn func(ObjectInfo) bool) error
	// Name names the backend for logs ("fs", "s3").
	Name() string
}

// ReadAll reads the bytes [off, off+n) of key into memory.
func ReadAll(ctx context.Context, s Store, key string, off, n int64) ([]byte, error) {
	rc, err := s.GetRange(ctx, key, off, n)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	if n >= 0 {
		buf := make([]byte, n)
		k, err := io.ReadFull(rc, buf)
		if err == io.ErrUnexpectedEOF || err == io.EOF {
			return buf[:k], nil
		}
		return buf[:k], err
	}
	return io.ReadAll(rc)
}
