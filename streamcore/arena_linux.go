package streamcore

import "syscall"

const arenasAvailable = true

func mapPopulated(n int) ([]byte, bool) {
	mem, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE|syscall.MAP_POPULATE)
	return mem, err == nil
}

func unmap(mem []byte) { syscall.Munmap(mem) }
