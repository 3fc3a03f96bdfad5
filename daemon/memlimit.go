package daemon

import (
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// memoryLimitShare is the part of the container's memory limit the Go runtime aims to stay
// under: the rest is for the stacks, buffers and binary outside the heap.
const memoryLimitShare = 0.9

// setMemoryLimit gives the Go runtime a soft memory limit from the container's (cgroup v2, else
// v1) unless GOMEMLIMIT sets one: under a memory attack the collector then works harder as the
// heap nears the container's limit instead of letting garbage grow to twice the live heap and the
// relay be killed for memory — losing every escrowed renewal (docs/hostile.md). It returns the limit set,
// or 0.
func setMemoryLimit() int64 {
	if _, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		return 0
	}
	limit := cgroupMemoryLimit()
	if limit <= 0 {
		return 0
	}
	soft := int64(float64(limit) * memoryLimitShare)
	debug.SetMemoryLimit(soft)
	return soft
}

// cgroupMemoryLimit is the memory limit of the process's cgroup, or 0 when there is none.
func cgroupMemoryLimit() int64 {
	for _, path := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		return parseMemoryLimit(string(b))
	}
	return 0
}

// parseMemoryLimit reads a cgroup memory limit file: "max" (v2) or a number of bytes; v1 writes a
// number near 2^63 for no limit.
func parseMemoryLimit(s string) int64 {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n <= 0 || n >= 1<<62 {
		return 0
	}
	return n
}
