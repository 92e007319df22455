package replicator

import (
	"encoding/binary"
	"errors"
	"os"
)

// A SQLite WAL file (https://sqlite.org/fileformat2.html#walformat): a 32-byte header,
// then frames of a 24-byte header and one page. A frame is valid when its salts match the
// header's and its checksum continues the running checksum; a transaction is the run of
// frames up to one whose "database size after commit" field is non-zero.
const (
	WALHeaderSize      = 32
	WALFrameHeaderSize = 24
	walMagicLE         = 0x377f0682
	walMagicBE         = 0x377f0683
)

// walChecksum continues SQLite's WAL checksum over b (a multiple of 8 bytes).
func walChecksum(bigEndian bool, s0, s1 uint32, b []byte) (uint32, uint32) {
	order := binary.ByteOrder(binary.LittleEndian)
	if bigEndian {
		order = binary.BigEndian
	}
	for i := 0; i+8 <= len(b); i += 8 {
		s0 += order.Uint32(b[i:]) + s1
		s1 += order.Uint32(b[i+4:]) + s0
	}
	return s0, s1
}

// foldWAL applies the committed transactions of the WAL beside path (path+"-wal") to the
// database file, as SQLite's recovery plus a full checkpoint would, then removes the -wal
// and -shm files. Frames after the last valid commit frame (an unacknowledged
// transaction's, or a torn tail) are ignored. It returns the number of transactions folded.
// No SQLite connection may have the file open.
func foldWAL(path string) (int, error) {
	wal, err := os.ReadFile(path + "-wal")
	if errors.Is(err, os.ErrNotExist) {
		os.Remove(path + "-shm")
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	txs, pages, dbPages, pageSize := scanWAL(wal)
	if txs > 0 {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return 0, err
		}
		for no, data := range pages {
			if no <= dbPages {
				if _, err := f.WriteAt(data, int64(no-1)*int64(pageSize)); err != nil {
					f.Close()
					return 0, err
				}
			}
		}
		if err := f.Truncate(int64(dbPages) * int64(pageSize)); err != nil {
			f.Close()
			return 0, err
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return 0, err
		}
		if err := f.Close(); err != nil {
			return 0, err
		}
	}
	if err := os.Remove(path + "-wal"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	os.Remove(path + "-shm")
	return txs, nil
}

// scanWAL returns the committed page images of a WAL image (last write wins), the
// database size in pages after the last commit, and the page size.
func scanWAL(wal []byte) (txs int, pages map[uint32][]byte, dbPages, pageSize uint32) {
	if len(wal) < WALHeaderSize {
		return 0, nil, 0, 0
	}
	magic := binary.BigEndian.Uint32(wal[0:])
	if magic != walMagicLE && magic != walMagicBE {
		return 0, nil, 0, 0
	}
	be := magic == walMagicBE
	pageSize = binary.BigEndian.Uint32(wal[8:])
	if pageSize == 1 {
		pageSize = 65536
	}
	if pageSize < 512 || pageSize > 65536 || pageSize&(pageSize-1) != 0 {
		return 0, nil, 0, 0
	}
	s0, s1 := walChecksum(be, 0, 0, wal[:24])
	if s0 != binary.BigEndian.Uint32(wal[24:]) || s1 != binary.BigEndian.Uint32(wal[28:]) {
		return 0, nil, 0, 0
	}
	salt1, salt2 := binary.BigEndian.Uint32(wal[16:]), binary.BigEndian.Uint32(wal[20:])
	pages = map[uint32][]byte{}
	pending := map[uint32][]byte{}
	fs := WALFrameHeaderSize + int(pageSize)
	for off := WALHeaderSize; off+fs <= len(wal); off += fs {
		h := wal[off : off+WALFrameHeaderSize]
		if binary.BigEndian.Uint32(h[8:]) != salt1 || binary.BigEndian.Uint32(h[12:]) != salt2 {
			break
		}
		s0, s1 = walChecksum(be, s0, s1, h[:8])
		s0, s1 = walChecksum(be, s0, s1, wal[off+WALFrameHeaderSize:off+fs])
		if s0 != binary.BigEndian.Uint32(h[16:]) || s1 != binary.BigEndian.Uint32(h[20:]) {
			break
		}
		pending[binary.BigEndian.Uint32(h[0:])] = wal[off+WALFrameHeaderSize : off+fs]
		if size := binary.BigEndian.Uint32(h[4:]); size != 0 {
			for no, data := range pending {
				pages[no] = data
			}
			clear(pending)
			dbPages = size
			txs++
		}
	}
	return txs, pages, dbPages, pageSize
}
