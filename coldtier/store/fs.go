package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ursula-go/ursula/internal/pagecache"
)

// FS is a Store on a local directory. Writes go to a temporary file in the same
// directory, are fsynced and renamed into place, so a crash never leaves a torn object;
// their page-cache pages are then given back (internal/pagecache).
type FS struct {
	dir string
}

// NewFS returns a store rooted at dir, creating it if needed.
func NewFS(dir string) (*FS, error) {
	if dir == "" {
		return nil, errors.New("coldstore fs: a directory is required (storage.cold.dir)")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("coldstore fs: %w", err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	return &FS{dir: abs}, nil
}

// Name implements Store.
func (f *FS) Name() string { return "fs" }

const tmpSuffix = ".ursula-tmp"

func (f *FS) path(key string) (string, error) {
	if key == "" || strings.HasPrefix(key, "/") || strings.Contains(key, "\\") || strings.HasSuffix(key, tmpSuffix) {
		return "", fmt.Errorf("coldstore fs: invalid key %q", key)
	}
	for _, seg := range strings.Split(key, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return "", fmt.Errorf("coldstore fs: invalid key %q", key)
		}
	}
	return filepath.Join(f.dir, filepath.FromSlash(key)), nil
}

// Put implements Store.
func (f *FS) Put(ctx context.Context, key string, body io.Reader, size int64) error {
	p, err := f.path(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := p + "." + hex.EncodeToString(rnd[:]) + tmpSuffix
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			out.Close()
			os.Remove(tmp)
		}
	}()
	var n int64
	if wt, isWT := body.(io.WriterTo); isWT {
		// The body writes its own pieces (the flusher's chunk: whole stream blocks), one
		// write each, without a copy through io.Copy's 32 KiB buffer.
		n, err = wt.WriteTo(&ctxWriter{ctx: ctx, w: out})
	} else {
		n, err = io.Copy(out, &ctxReader{ctx: ctx, r: body})
	}
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("coldstore fs: put %s: body has %d bytes, expected %d", key, n, size)
	}
	if err := out.Sync(); err != nil {
		return err
	}
	pagecache.Drop(out)
	if err := out.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		return err
	}
	ok = true
	if d, err := os.Open(filepath.Dir(p)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// ctxWriter stops a WriteTo between writes once ctx is done.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c *ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// GetRange implements Store.
func (f *FS) GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	p, err := f.path(key)
	if err != nil {
		return nil, err
	}
	file, err := os.Open(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, key)
		}
		return nil, err
	}
	if n < 0 {
		n = 1<<62 - off
	}
	return &sectionCloser{Reader: io.NewSectionReader(file, off, n), f: file}, nil
}

type sectionCloser struct {
	io.Reader
	f *os.File
}

func (s *sectionCloser) Close() error { return s.f.Close() }

// Head implements Store.
func (f *FS) Head(ctx context.Context, key string) (ObjectInfo, error) {
	p, err := f.path(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	st, err := os.Stat(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return ObjectInfo{}, fmt.Errorf("%w: %s", ErrNotFound, key)
		}
		return ObjectInfo{}, err
	}
	return ObjectInfo{Key: key, Size: st.Size(), ModTime: st.ModTime()}, nil
}

// Delete implements Store.
func (f *FS) Delete(ctx context.Context, key string) error {
	p, err := f.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	// Remove emptied parent directories up to the root (best effort).
	for d := filepath.Dir(p); d != f.dir && strings.HasPrefix(d, f.dir); d = filepath.Dir(d) {
		if os.Remove(d) != nil {
			break
		}
	}
	return nil
}

// List implements Store.
func (f *FS) List(ctx context.Context, prefix string, fn func(ObjectInfo) bool) error {
	var keys []ObjectInfo
	err := filepath.WalkDir(f.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(f.dir, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if strings.HasSuffix(key, tmpSuffix) || !strings.HasPrefix(key, prefix) {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil // removed meanwhile
		}
		keys = append(keys, ObjectInfo{Key: key, Size: info.Size(), ModTime: info.ModTime()})
		return nil
	})
	if err != nil {
		return err
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].Key < keys[j].Key })
	for _, k := range keys {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !fn(k) {
			return nil
		}
	}
	return nil
}
