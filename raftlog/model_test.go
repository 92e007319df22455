package raftlog

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	"github.com/hashicorp/raft"
)

// modelGroup is what one group should hold: terms[i] is the term of index
// first+i, stable the stable-store values.
type modelGroup struct {
	first  uint64
	terms  []uint64
	stable map[string]string
}

type model map[uint64]*modelGroup

func (m model) clone() model {
	c := model{}
	for g, mg := range m {
		n := &modelGroup{first: mg.first, terms: append([]uint64(nil), mg.terms...), stable: map[string]string{}}
		for k, v := range mg.stable {
			n.stable[k] = v
		}
		c[g] = n
	}
	return c
}

// TestCrashPointsMatchModel runs random operations on a few groups with tiny
// segments (so rolls, purges and copy-forwards happen), keeping a model and
// a copy of the files after every acknowledged operation. Then it "crashes"
// at every point: the files as they were (kill -9 after the ack) must
// recover to the model after the operation, and the files with the last
// record torn at a random byte must recover to the model before it.
func TestCrashPointsMatchModel(t *testing.T) {
	seed := int64(7)
	if v, err := strconv.ParseInt(os.Getenv("NODELOG_SEED"), 10, 64); err == nil {
		seed = v
	}
	rng := rand.New(rand.NewSource(seed))
	dir := t.TempDir()
	opt := Options{SegmentBytes: 4 << 10, Logf: func(string, ...any) {}}
	l := openT(t, dir, opt)
	m := model{}
	for g := uint64(1); g <= 3; g++ {
		m[g] = &modelGroup{stable: map[string]string{}}
	}
	type point struct {
		files map[string][]byte
		m     model
	}
	snapshot := func() map[string][]byte {
		files := map[string][]byte{}
		for _, p := range segFiles(t, dir) {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			files[filepath.Base(p)] = b
		}
		return files
	}
	settle(t, l)
	points := []point{{snapshot(), m.clone()}}
	term := uint64(1)
	for op := 0; op < 150; op++ {
		g := uint64(rng.Intn(3) + 1)
		mg, s := m[g], l.Group(g)
		last := mg.first + uint64(len(mg.terms)) - 1
		switch r := rng.Intn(10); {
		case r < 6 || len(mg.terms) == 0: // append, sometimes overwriting a suffix
			from := last + 1
			if len(mg.terms) == 0 {
				from = mg.first + uint64(len(mg.terms))
				if from == 0 {
					from = 1
				}
			} else if rng.Intn(5) == 0 {
				from = mg.first + uint64(rng.Intn(len(mg.terms)))
			} else if rng.Intn(10) == 0 {
				from = last + 2 + uint64(rng.Intn(3)) // a gap, as after a snapshot restore
			}
			if rng.Intn(4) == 0 {
				term++
			}
			n := uint64(rng.Intn(5) + 1)
			var logs []*raft.Log
			for i := from; i < from+n; i++ {
				logs = append(logs, entry(g, i, term))
			}
			if err := s.StoreLogs(logs); err != nil {
				t.Fatal(err)
			}
			if len(mg.terms) == 0 || from <= mg.first || from > last+1 {
				mg.first, mg.terms = from, nil
			} else {
				mg.terms = mg.terms[:from-mg.first]
			}
			for i := uint64(0); i < n; i++ {
				mg.terms = append(mg.terms, term)
			}
		case r < 8: // prefix compaction
			k := mg.first + uint64(rng.Intn(len(mg.terms)))
			if err := s.DeleteRange(0, k); err != nil {
				t.Fatal(err)
			}
			mg.terms = mg.terms[k-mg.first+1:]
			mg.first = k + 1
		case r < 9: // suffix truncation
			k := mg.first + uint64(rng.Intn(len(mg.terms)))
			if err := s.DeleteRange(k, last+10); err != nil {
				t.Fatal(err)
			}
			mg.terms = mg.terms[:k-mg.first]
		default:
			key, val := fmt.Sprintf("k%d", rng.Intn(3)), fmt.Sprintf("v%d", op)
			if err := s.Set([]byte(key), []byte(val)); err != nil {
				t.Fatal(err)
			}
			mg.stable[key] = val
		}
		if len(mg.terms) == 0 {
			// An emptied group starts again wherever its next append says.
			mg.first = last + 1
		}
		settle(t, l)
		points = append(points, point{snapshot(), m.clone()})
	}
	st := l.Stats()
	t.Logf("seed %d: %d segments, %d purged, %d entries copied forward", seed, st.Segments, st.PurgedSegments, st.CopiedEntries)
	l.Close()

	check := func(where string, files map[string][]byte, want model) {
		t.Helper()
		d := t.TempDir()
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(d, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		l, err := Open(d, opt)
		if err != nil {
			t.Fatalf("%s: Open: %v", where, err)
		}
		defer l.Close()
		for g, mg := range want {
			s := l.Group(g)
			fi, _ := s.FirstIndex()
			li, _ := s.LastIndex()
			if len(mg.terms) == 0 {
				if li != 0 {
					t.Fatalf("%s: group %d holds %d..%d, want empty", where, g, fi, li)
				}
			} else if fi != mg.first || li != mg.first+uint64(len(mg.terms))-1 {
				t.Fatalf("%s: group %d holds %d..%d, want %d..%d", where, g, fi, li, mg.first, mg.first+uint64(len(mg.terms))-1)
			}
			for i, term := range mg.terms {
				var e raft.Log
				idx := mg.first + uint64(i)
				if err := s.GetLog(idx, &e); err != nil || !reflect.DeepEqual(&e, entry(g, idx, term)) {
					t.Fatalf("%s: group %d index %d: %v term %d, want term %d", where, g, idx, err, e.Term, term)
				}
			}
			for k, v := range mg.stable {
				if got, err := s.Get([]byte(k)); err != nil || string(got) != v {
					t.Fatalf("%s: group %d %s = %q, want %q", where, g, k, got, v)
				}
			}
		}
	}
	torn := 0
	defer func() { t.Logf("%d crash points, %d torn records checked", len(points)-1, torn) }()
	for i := 1; i < len(points); i++ {
		prev, cur := points[i-1], points[i]
		check(fmt.Sprintf("after op %d", i), cur.files, cur.m)
		// Tear the bytes this operation appended to the last segment.
		var lastName string
		for name := range cur.files {
			lastName = max(lastName, name)
		}
		before, ok := prev.files[lastName]
		after := cur.files[lastName]
		if !ok || len(after) <= len(before) || !bytes.Equal(after[:len(before)], before) {
			continue // the operation rolled to a new segment
		}
		if len(cur.files) < len(prev.files) {
			// The operation purged files, which happens only after its
			// record is synced: a torn record with the files gone is not
			// a state any crash can leave.
			continue
		}
		files := map[string][]byte{}
		for name, b := range cur.files {
			files[name] = b
		}
		cut := len(before) + rng.Intn(len(after)-len(before))
		files[lastName] = after[:cut]
		check(fmt.Sprintf("op %d torn at %d", i, cut), files, prev.m)
		torn++
	}
}
