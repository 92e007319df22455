package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	coldstore "github.com/ursula-go/ursula/coldtier/store"
	"github.com/ursula-go/ursula/coldtier/store/s3test"
)

// contract runs the same checks against any Store.
func contract(t *testing.T, st coldstore.Store) {
	ctx := context.Background()
	body := bytes.Repeat([]byte("0123456789abcdef"), 4096+3) // not a power of two
	t.Run("PutGetRange", func(t *testing.T) {
		if err := st.Put(ctx, "a/b/obj1", bytes.NewReader(body), int64(len(body))); err != nil {
			t.Fatal(err)
		}
		for _, r := range [][2]int64{{0, -1}, {0, 10}, {17, 4096}, {int64(len(body)) - 5, 5}, {int64(len(body)) - 5, 100}, {3, 0}} {
			got, err := coldstore.ReadAll(ctx, st, "a/b/obj1", r[0], r[1])
			if err != nil {
				t.Fatalf("range %v: %v", r, err)
			}
			end := int64(len(body))
			if r[1] >= 0 {
				end = min(end, r[0]+r[1])
			}
			if !bytes.Equal(got, body[r[0]:end]) {
				t.Fatalf("range %v: got %d bytes, want %d", r, len(got), end-r[0])
			}
		}
	})
	t.Run("PutNonSeekable", func(t *testing.T) {
		if err := st.Put(ctx, "a/c/obj2", io.MultiReader(strings.NewReader("hello "), strings.NewReader("world")), 11); err != nil {
			t.Fatal(err)
		}
		got, err := coldstore.ReadAll(ctx, st, "a/c/obj2", 0, -1)
		if err != nil || string(got) != "hello world" {
			t.Fatalf("got %q, %v", got, err)
		}
	})
	t.Run("Head", func(t *testing.T) {
		info, err := st.Head(ctx, "a/b/obj1")
		if err != nil || info.Size != int64(len(body)) {
			t.Fatalf("head: %+v, %v", info, err)
		}
		if _, err := st.Head(ctx, "a/b/missing"); !errors.Is(err, coldstore.ErrNotFound) {
			t.Fatalf("head missing: %v", err)
		}
		if _, err := st.GetRange(ctx, "a/b/missing", 0, 1); !errors.Is(err, coldstore.ErrNotFound) {
			t.Fatalf("get missing: %v", err)
		}
	})
	t.Run("List", func(t *testing.T) {
		for i := 0; i < 5; i++ {
			k := fmt.Sprintf("l/x/%02d", i)
			if err := st.Put(ctx, k, strings.NewReader(k), int64(len(k))); err != nil {
				t.Fatal(err)
			}
		}
		st.Put(ctx, "l/y/0", strings.NewReader("y"), 1)
		var keys []string
		if err := st.List(ctx, "l/x/", func(o coldstore.ObjectInfo) bool { keys = append(keys, o.Key); return true }); err != nil {
			t.Fatal(err)
		}
		if strings.Join(keys, ",") != "l/x/00,l/x/01,l/x/02,l/x/03,l/x/04" {
			t.Fatalf("list: %v", keys)
		}
		n := 0
		st.List(ctx, "l/", func(coldstore.ObjectInfo) bool { n++; return n < 2 })
		if n != 2 {
			t.Fatalf("list did not stop: %d", n)
		}
	})
	t.Run("Delete", func(t *testing.T) {
		if err := st.Delete(ctx, "l/x/00"); err != nil {
			t.Fatal(err)
		}
		if err := st.Delete(ctx, "l/x/00"); err != nil {
			t.Fatalf("second delete: %v", err)
		}
		if _, err := st.Head(ctx, "l/x/00"); !errors.Is(err, coldstore.ErrNotFound) {
			t.Fatalf("after delete: %v", err)
		}
	})
	t.Run("Concurrent", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				k := fmt.Sprintf("conc/%d", i)
				b := bytes.Repeat([]byte{byte(i)}, 100000)
				if err := st.Put(ctx, k, bytes.NewReader(b), int64(len(b))); err != nil {
					errs <- err
					return
				}
				got, err := coldstore.ReadAll(ctx, st, k, 0, -1)
				if err != nil || !bytes.Equal(got, b) {
					errs <- fmt.Errorf("%s: %v", k, err)
				}
			}(i)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	})
	t.Run("ShortBody", func(t *testing.T) {
		if err := st.Put(ctx, "short", strings.NewReader("abc"), 10); err == nil {
			t.Fatal("a body shorter than size was stored")
		}
		if _, err := st.Head(ctx, "short"); !errors.Is(err, coldstore.ErrNotFound) {
			t.Fatalf("a failed put left an object: %v", err)
		}
	})
}

// streamedPut: a body that cannot seek and is larger than one S3 multipart piece lands
// whole (the assembled-snapshot path); a body shorter than its size fails and leaves nothing.
func streamedPut(t *testing.T, st coldstore.Store) {
	ctx := context.Background()
	big := make([]byte, 40<<20+3)
	for i := range big {
		big[i] = byte(i*7 + i>>13)
	}
	if err := st.Put(ctx, "streamed/big", io.MultiReader(bytes.NewReader(big)), int64(len(big))); err != nil {
		t.Fatalf("streamed put: %v", err)
	}
	got, err := coldstore.ReadAll(ctx, st, "streamed/big", 0, -1)
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("streamed put read back: %d bytes, %v", len(got), err)
	}
	if err := st.Put(ctx, "streamed/short", io.MultiReader(bytes.NewReader(big[:20<<20])), int64(len(big))); err == nil {
		t.Fatal("a streamed put shorter than its size succeeded")
	}
	if _, err := st.Head(ctx, "streamed/short"); !errors.Is(err, coldstore.ErrNotFound) {
		t.Fatalf("a failed streamed put left an object: %v", err)
	}
}

func TestContractFS(t *testing.T) {
	st, err := coldstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	contract(t, st)
	streamedPut(t, st)
}

func TestContractS3(t *testing.T) {
	g := s3test.Start(t)
	st, err := coldstore.NewS3(context.Background(), g.Config("contract/run1"))
	if err != nil {
		t.Fatal(err)
	}
	contract(t, st)
	streamedPut(t, st)
}

func TestConfigValidate(t *testing.T) {
	yes := true
	cases := []struct {
		cfg  coldstore.Config
		want string
	}{
		{coldstore.Config{}, ""},
		{coldstore.Config{Backend: "none"}, ""},
		{coldstore.Config{Backend: "fs"}, "storage.cold.dir is required"},
		{coldstore.Config{Backend: "s3"}, "storage.cold.s3.bucket is required when cold backend is 's3'"},
		{coldstore.Config{Backend: "gcs"}, `use "none", "fs" or "s3"`},
		{coldstore.Config{Backend: "s3", S3: coldstore.S3Config{Bucket: "b", AccessKeyID: "x"}}, "go together"},
		{coldstore.Config{Backend: "s3", S3: coldstore.S3Config{Bucket: "b", Endpoint: "localhost:9000"}}, "must be an http:// or https:// URL"},
		{coldstore.Config{Backend: "s3", S3: coldstore.S3Config{Bucket: "b", ServerSideEncryption: "des"}}, `use "aes256", "aws-kms" or "none"`},
		{coldstore.Config{Backend: "s3", S3: coldstore.S3Config{Bucket: "b", KMSKeyID: "k"}}, "only valid with"},
		{coldstore.Config{Backend: "s3", S3: coldstore.S3Config{Bucket: "b", Endpoint: "http://127.0.0.1:9000", ForcePathStyle: &yes, ServerSideEncryption: "none"}}, ""},
		{coldstore.Config{Backend: "fs", Dir: "x", FlushSize: 8 << 20, MaxHotSizePerGroup: ptr(coldstore.Size(1 << 20))}, "must be at least storage.cold.flush_size"},
		{coldstore.Config{Backend: "fs", Dir: "x", MaxHotSizePerGroup: ptr(coldstore.Size(0))}, ""},
		{coldstore.Config{Backend: "fs", Dir: "x", BackpressureWait: ptr(coldstore.Duration(2 * time.Minute))}, "storage.cold.backpressure_wait 2m0s must be between 0s"},
		{coldstore.Config{Backend: "fs", Dir: "x", BackpressureWait: ptr(coldstore.Duration(0))}, ""},
	}
	for i, c := range cases {
		err := c.cfg.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("case %d: unexpected %v", i, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("case %d: got %v, want %q", i, err, c.want)
		}
	}
	for in, want := range map[string]int64{"8MiB": 8 << 20, "512": 512, "4 KiB": 4096, "1GB": 1e9, "2g": 2 << 30} {
		if got, err := coldstore.ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v", in, got, err)
		}
	}
	if _, err := coldstore.ParseSize("8 parsecs"); err == nil {
		t.Error("bad unit accepted")
	}
}

func ptr[T any](v T) *T { return &v }
