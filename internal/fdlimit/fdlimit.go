// Package fdlimit raises the process's open-file limit: a server holding many
// connections, or a benchmark opening many readers, needs more descriptors than the
// usual soft default.
package fdlimit

import "syscall"

// Raise lifts the soft descriptor limit to the hard one and returns the soft limit in
// force afterwards (0 when it cannot be read).
func Raise() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	if rl.Cur < rl.Max {
		want := rl
		want.Cur = rl.Max
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want) == nil {
			rl = want
		}
	}
	return rl.Cur
}
