//go:build !linux

package streamcore

const arenasAvailable = false

func mapPopulated(int) ([]byte, bool) { return nil, false }

func unmap([]byte) {}
