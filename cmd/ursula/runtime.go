package main

import (
	"fmt"
	"runtime"
)

// runtimeConfig is the [runtime] section of the config file.
type runtimeConfig struct {
	// LiveReadMaxWaitersPerCore bounds the live readers (long-poll and SSE) a node holds,
	// per CPU it runs on; 0 disables the bound, absent keeps the default of 65536.
	LiveReadMaxWaitersPerCore *int64 `toml:"live_read_max_waiters_per_core"`
}

// maxLiveReaders is the node-wide bound for server.Config.MaxLiveReaders: 0 for the
// server's default, negative for no bound.
func (rc runtimeConfig) maxLiveReaders() (int, error) {
	p := rc.LiveReadMaxWaitersPerCore
	switch {
	case p == nil:
		return 0, nil
	case *p < 0:
		return 0, fmt.Errorf("runtime.live_read_max_waiters_per_core must be 0 (no limit) or positive, not %d", *p)
	case *p == 0:
		return -1, nil
	}
	return int(min(*p*int64(runtime.GOMAXPROCS(0)), 1<<40)), nil
}
