//go:build unix && !linux

package kubeapi

import "syscall"

// sysProcAttr puts a child in its own process group, killed as a group.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
