package kubeapi

import "syscall"

// sysProcAttr puts a child in its own process group, killed as a group, and has the kernel kill
// it should the test binary die before its cleanup runs (a test timeout's panic).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
