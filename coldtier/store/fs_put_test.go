package store

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
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
