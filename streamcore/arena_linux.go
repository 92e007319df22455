package streamcore

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

const arenasAvailable = true

// hugePage is the size of a transparent huge page on the platforms we run on.
const hugePage = 2 << 20

// mapPopulated maps n bytes of anonymous memory, touched up front. It asks for transparent
// huge pages first: on a virtual machine a first write to each 4 KiB page still costs a
// fault in the hypervisor even after MAP_POPULATE (measured: copying into a populated
// 256 MiB mapping ran at 300-500 MB/s, into a huge-page one at 4-10 GB/s), and huge pages
// take one fault per 2 MiB. Without huge pages (THP off, old kernel) it falls back to a
// populated mapping of small pages.
func mapPopulated(n int) ([]byte, bool) {
	if mem, ok := mapHuge(n); ok {
		return mem, true
	}
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE|unix.MAP_POPULATE)
	if err != nil {
		return nil, false
	}
	return unsafe.Slice((*byte)(p), n), true
}

// mapHuge maps n bytes (a multiple of hugePage) aligned to hugePage, advises huge pages
// and populates them for writing.
func mapHuge(n int) ([]byte, bool) {
	if n%hugePage != 0 {
		return nil, false
	}
	span := uintptr(n + hugePage)
	p, err := unix.MmapPtr(-1, 0, nil, span, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, false
	}
	head := (hugePage - uintptr(p)%hugePage) % hugePage
	start := unsafe.Add(p, head)
	if head > 0 {
		unix.MunmapPtr(p, head)
	}
	if tail := span - head - uintptr(n); tail > 0 {
		unix.MunmapPtr(unsafe.Add(start, n), tail)
	}
	mem := unsafe.Slice((*byte)(start), n)
	if unix.Madvise(mem, unix.MADV_HUGEPAGE) != nil || unix.Madvise(mem, unix.MADV_POPULATE_WRITE) != nil {
		unix.MunmapPtr(start, uintptr(n))
		return nil, false
	}
	return mem, true
}

func unmap(mem []byte) { unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(mem)), uintptr(len(mem))) }
