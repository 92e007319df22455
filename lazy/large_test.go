package lazy_test

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/internal/racetest"
	"github.com/ursula-go/ursula/internal/testserver"
	"github.com/ursula-go/ursula/lazy"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
)

// TestPagesPast4GiB: a database of more than 4 GiB (a sparse file with a few real pages)
// published as a version 2 snapshot reads lazily: the pages past byte 2^32, page by page
// and through File.ReadAt at 64-bit offsets, are the planted bytes, the gaps are zeros,
// and the reads fetch a few MiB, not the database.
//
// Under the race detector the zeros of the holes cost minutes of shadow-memory writes:
// the test skips there, and make unit runs it again without -race.
func TestPagesPast4GiB(t *testing.T) {
	if racetest.Enabled {
		t.Skip("4 GiB of zeros under -race is minutes of shadow memory; make unit runs this without -race")
	}
	const (
		pageSize = 4096
		dbPages  = 1<<20 + 4096 // 4 GiB + 16 MiB
	)
	planted := map[uint32][]byte{}
	for _, no := range []uint32{1, 2, 1 << 20, 1<<20 + 1, 1<<20 + 2049, dbPages} {
		p := bytes.Repeat([]byte{byte(no), byte(no >> 8), byte(no >> 16), 0x5a}, pageSize/4)
		planted[no] = p
	}
	dir := t.TempDir()
	img, err := os.Create(filepath.Join(dir, "sparse.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	if err := img.Truncate(int64(dbPages) * pageSize); err != nil {
		t.Fatal(err)
	}
	for no, p := range planted {
		if _, err := img.WriteAt(p, int64(no-1)*pageSize); err != nil {
			t.Fatal(err)
		}
	}

	streamURL := testserver.Start(t, testserver.Options{ClusterID: "lazy-test"}).URL + "/dbs1/big"
	c := newClient(t)
	if _, err := c.Create(ctx, streamURL, client.CreateOptions{ContentType: "application/octet-stream"}); err != nil {
		t.Fatal(err)
	}
	tail := tailOf(t, streamURL)
	blobFile, err := os.Create(filepath.Join(dir, "snap.blob"))
	if err != nil {
		t.Fatal(err)
	}
	defer blobFile.Close()
	h := replicator.SnapshotHeader{PageSize: pageSize, DBPages: dbPages, Epoch: 1, Offset: tail}
	n, err := replicator.WriteSnapshot(blobFile, h, &sparseReader{f: img, size: int64(dbPages) * pageSize})
	if err != nil {
		t.Fatal(err)
	}
	blob := make([]byte, n)
	if _, err := blobFile.ReadAt(blob, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PublishSnapshot(ctx, streamURL, streamcore.FormatOffset(tail), "application/octet-stream", blob); err != nil {
		t.Fatal(err)
	}

	src, err := lazy.Open(ctx, streamURL, lazy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	v := src.View()
	if v.DBPages() != dbPages || v.PageSize() != pageSize {
		t.Fatalf("view of %d pages of %d, want %d of %d", v.DBPages(), v.PageSize(), dbPages, pageSize)
	}
	for no, want := range planted {
		got, err := v.ReadPage(ctx, no)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("page %d: %v, %.8x, want %.8x", no, err, got, want)
		}
	}
	for _, no := range []uint32{3, 1<<20 - 1, 1<<20 + 3, dbPages - 1} {
		got, err := v.ReadPage(ctx, no)
		if err != nil || !bytes.Equal(got, make([]byte, pageSize)) {
			t.Fatalf("page %d (a hole): %v, %.8x, want zeros", no, err, got)
		}
	}
	f := src.NewFile()
	if size := f.Size(); size != int64(dbPages)*pageSize || size <= 1<<32 {
		t.Fatalf("file size %d, want %d (over 4 GiB)", size, int64(dbPages)*pageSize)
	}
	// A read straddling two planted pages past 2^32 bytes.
	buf := make([]byte, 100)
	off := int64(1<<20+1)*pageSize - 50 // the last 50 bytes of page 2^20+1, the first 50 of 2^20+2
	if _, err := f.ReadAt(buf, off); err != nil {
		t.Fatal(err)
	}
	if want := append(append([]byte(nil), planted[1<<20+1][pageSize-50:]...), make([]byte, 50)...); !bytes.Equal(buf, want) {
		t.Fatalf("ReadAt(%d): %x, want %x", off, buf, want)
	}
	if fetched := src.Stats().BytesFetched; fetched > 16<<20 {
		t.Fatalf("fetched %d bytes for a few pages of a 4 GiB database", fetched)
	}
}

// sparseReader reads a sparse file in order, answering its holes with zeros without
// reading them (SEEK_DATA / SEEK_HOLE), so 4 GiB of holes cost no system calls.
type sparseReader struct {
	f          *os.File
	pos, size  int64
	data, hole int64 // the next data region [data, hole) at or after pos
}

const (
	seekData = 3 // SEEK_DATA (Linux)
	seekHole = 4 // SEEK_HOLE (Linux)
)

func (r *sparseReader) Read(p []byte) (int, error) {
	if r.pos >= r.size {
		return 0, io.EOF
	}
	if r.pos >= r.hole {
		d, err := r.f.Seek(r.pos, seekData)
		if err != nil { // no data past pos (ENXIO), or no hole support: read it all
			d = r.size
			if r.pos == 0 {
				d = 0
			}
		}
		h, err := r.f.Seek(d, seekHole)
		if err != nil || d >= r.size {
			h = r.size
		}
		r.data, r.hole = d, h
	}
	p = p[:min(int64(len(p)), r.size-r.pos)]
	if r.pos < r.data {
		n := min(int64(len(p)), r.data-r.pos)
		clear(p[:n])
		r.pos += n
		return int(n), nil
	}
	n, err := r.f.ReadAt(p[:min(int64(len(p)), r.hole-r.pos)], r.pos)
	r.pos += int64(n)
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}
