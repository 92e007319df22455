package store

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestFSPutCanceled: a Put whose context is done writes nothing and leaves no temporary
// file, whether the body writes itself (io.WriterTo) or is read.
func TestFSPutCanceled(t *testing.T) {
	dir := t.TempDir()
	st, err := NewFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for name, body := range map[string]io.Reader{
		"WriterTo": bytes.NewReader([]byte("hello")),
		"Reader":   struct{ io.Reader }{strings.NewReader("hello")}, // hides WriteTo
	} {
		if err := st.Put(ctx, "c/"+name, body, 5); !errors.Is(err, context.Canceled) {
			t.Fatalf("%s: Put with a canceled context: %v", name, err)
		}
	}
	var left []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && !strings.HasSuffix(p, "URSULA_FORMAT_EPOCH") {
			left = append(left, p)
		}
		return nil
	})
	if len(left) != 0 {
		t.Fatalf("files left: %v", left)
	}
}

// TestFSLargePut: objects of sizes that are and are not whole pages, up to a few MiB,
// read back byte for byte at their true size, whether the body writes itself or is read;
// a short body and a canceled Put leave nothing.
func TestFSLargePut(t *testing.T) {
	dir := t.TempDir()
	st, err := NewFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{4095, 4096, 1 << 20, 1<<20 + 1, 3<<20 + 4095} {
		want := make([]byte, size)
		for i := range want {
			want[i] = byte(i*7 + i>>12)
		}
		for name, body := range map[string]io.Reader{
			"WriterTo": bytes.NewReader(want),
			"Reader":   struct{ io.Reader }{bytes.NewReader(want)},
		} {
			key := "d/" + name + "/" + strconv.Itoa(size)
			if err := st.Put(context.Background(), key, body, int64(size)); err != nil {
				t.Fatalf("%s: Put %d bytes: %v", name, size, err)
			}
			info, err := st.Head(context.Background(), key)
			if err != nil || info.Size != int64(size) {
				t.Fatalf("%s: Head %d: %+v %v", name, size, info, err)
			}
			rc, err := st.GetRange(context.Background(), key, 0, -1)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%s: %d bytes read back as %d bytes (equal %v), err %v", name, size, len(got), bytes.Equal(got, want), err)
			}
		}
	}
	if err := st.Put(context.Background(), "d/short", bytes.NewReader(make([]byte, 2<<20)), 2<<20+1); err == nil {
		t.Fatal("short body accepted")
	}
	if _, err := st.Head(context.Background(), "d/short"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("short body left an object: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := st.Put(ctx, "d/canceled", bytes.NewReader(make([]byte, 2<<20)), 2<<20); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled Put: %v", err)
	}
	var left []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, tmpSuffix) {
			left = append(left, p)
		}
		return nil
	})
	if len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}
