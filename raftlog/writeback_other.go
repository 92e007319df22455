//go:build !linux

package raftlog

import "os"

func startWriteback(*os.File, int64, int64) {}

func writeback(*os.File, int64, int64) {}
