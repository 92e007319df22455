//go:build !linux

package nodelog

import "os"

func startWriteback(*os.File, int64, int64) {}
