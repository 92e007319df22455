//go:build !linux

package nodelog

func dropCache(string) bool { return false }
