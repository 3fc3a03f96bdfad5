//go:build linux

package interop

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill a peer or relay process when the process that started it
// dies (a test binary killed on its timeout, say): nothing the suite starts outlives it.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
