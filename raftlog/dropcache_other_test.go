//go:build !linux

package raftlog

func dropCache(string) bool { return false }
