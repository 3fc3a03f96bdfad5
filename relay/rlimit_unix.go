//go:build unix

package relay

import "syscall"

// descriptorLimit is the process's RLIMIT_NOFILE (Go raises the soft limit to the hard one at
// start), or 0 when it cannot be read.
func descriptorLimit() int {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil || l.Cur > 1<<30 {
		return 0
	}
	return int(l.Cur)
}
