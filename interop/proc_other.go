//go:build !linux

package interop

import "os/exec"

// dieWithParent: only Linux can tie a child's life to its parent's; elsewhere Close and Stop do.
func dieWithParent(*exec.Cmd) {}
