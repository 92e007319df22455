package fdlimit

import (
	"syscall"
	"testing"
)

func TestRaiseReachesHardLimit(t *testing.T) {
	got := Raise()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if got == 0 || got != rl.Cur || rl.Cur != rl.Max {
		t.Fatalf("Raise() = %d; limit now %d of %d", got, rl.Cur, rl.Max)
	}
}
