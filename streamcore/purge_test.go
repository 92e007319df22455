package streamcore

import (
	"net/http"
	"testing"
)

func TestPurgeBucketRemovesStreamsAndFencesTheBucket(t *testing.T) {
	st := NewState()
	now := int64(1_700_000_000_000)
	apply := func(c *Command) Result {
		t.Helper()
		if c.Op == OpCreate && c.TTL == 0 {
			c.TTL = -1
		}
		return st.Apply(c)
	}
	for i, k := range []string{"t/a", "t/b", "keep/c"} {
		if r := apply(&Command{Op: OpCreate, Key: k, Now: now, ContentType: "text/plain", NewIncarnation: uint64(i + 1), Body: []byte("x")}); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	// A fork inside the bucket and one from another bucket that reads through t/b.
	apply(&Command{Op: OpCreate, Key: "t/fork", Now: now, NewIncarnation: 9, Fork: &ForkSpec{Source: "t/a"}})
	if r := apply(&Command{Op: OpCreate, Key: "keep/fork", Now: now, NewIncarnation: 10, Fork: &ForkSpec{Source: "t/b"}}); r.Err != nil {
		t.Fatal(r.Err)
	}

	r := apply(&Command{Op: OpPurgeBucket, Key: "t", Now: now + 1})
	if r.Err != nil || len(r.Purged) != 2 {
		t.Fatalf("purge: %+v", r)
	}
	if st.Streams["t/a"] != nil || st.Streams["t/fork"] != nil || st.Streams["keep/c"] == nil {
		t.Fatal("purge removed the wrong streams")
	}
	if s := st.Streams["t/b"]; s == nil || !s.SoftDeleted || st.HeldByForks("t") != 1 {
		t.Fatal("a stream another bucket's fork reads through must stay, deleted")
	}
	for _, c := range []*Command{
		{Op: OpCreate, Key: "t/a", Now: now + 2, ContentType: "text/plain", NewIncarnation: 20},
		{Op: OpAppend, Key: "t/a", Now: now + 2, ContentType: "text/plain", Body: []byte("y")},
		{Op: OpRestoreStream, Key: "t/z", Now: now + 2, NewIncarnation: 21},
	} {
		if r := apply(c); r.Err == nil || r.Status != http.StatusNotFound || r.Err.Code != CodeBucketErased {
			t.Fatalf("%s after purge: %+v", c.Op, r)
		}
	}
	if e := st.NotFound("t/anything"); e.Code != CodeBucketErased {
		t.Fatalf("not found in an erased bucket: %s", e.Code)
	}
	// The fork's delete releases the held source.
	apply(&Command{Op: OpDelete, Key: "keep/fork", Now: now + 3})
	if st.Streams["t/b"] != nil {
		t.Fatal("the held stream stayed after its last fork went")
	}
	if r := apply(&Command{Op: OpPurgeBucket, Key: "t", Now: now + 4}); r.Err != nil || len(r.Purged) != 0 || r.Status != http.StatusOK {
		t.Fatalf("repeated purge: %+v", r)
	}
	if r := apply(&Command{Op: OpPurgeBucket, Key: "t/x", Now: now + 4}); r.Err == nil {
		t.Fatal("a purge of a stream key must be refused")
	}
}
