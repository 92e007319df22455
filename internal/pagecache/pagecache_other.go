//go:build !linux

package pagecache

import (
	"errors"
	"os"
)

func drop(*os.File) {}

// Resident is not available here.
func Resident(string) (int, int, error) { return 0, 0, errors.ErrUnsupported }
