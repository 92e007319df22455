package s3test

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the gateway exit when the test process dies (a panic or a timeout
// skips Cleanup).
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
