package main

import (
	"bufio"
	"io"
	"strings"
)

// perfSplit reads `perf script -F ip,sym` output (one stack per sample, innermost frame first,
// samples separated by blank lines) and counts the samples of each kind of work: the system calls
// the process made, the Go runtime's parts, and the code that ran, by package. It is how the
// upstream suite says where a hop's CPU per request goes.
func perfSplit(r io.Reader) (counts map[string]int, total int) {
	counts = map[string]int{}
	var stack []string // symbols, innermost first; kernel ones prefixed "k "
	flush := func() {
		if len(stack) > 0 {
			counts[classifyStack(stack)]++
			total++
		}
		stack = stack[:0]
	}
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" {
			flush()
			continue
		}
		addr, sym, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if strings.HasPrefix(addr, "ffffffff") {
			sym = "k " + sym
		}
		stack = append(stack, strings.TrimSpace(sym))
	}
	flush()
	return counts, total
}

// The kinds of work, in the order they are looked for.
var (
	syscallKinds = []struct{ frame, kind string }{
		{"syscall.write", "kernel: write(2), with the loopback delivery it runs"},
		{"syscall.read", "kernel: read(2)"},
		{"runtime.netpoll", "kernel: the runtime waiting and waking (epoll, futex, nanosleep, yield)"},
		{"runtime.futex", "kernel: the runtime waiting and waking (epoll, futex, nanosleep, yield)"},
		{"runtime.usleep", "kernel: the runtime waiting and waking (epoll, futex, nanosleep, yield)"},
		{"runtime.osyield", "kernel: the runtime waiting and waking (epoll, futex, nanosleep, yield)"},
	}
	runtimeKinds = []struct {
		prefixes []string
		kind     string
	}{
		{[]string{"runtime.gcBgMarkWorker", "runtime.gcDrain", "runtime.gcAssist", "runtime.bgsweep", "runtime.bgscavenge", "runtime.gcStart", "runtime.markroot", "runtime.scanobject"}, "Go: garbage collection"},
		{[]string{"runtime.mallocgc", "runtime.newobject", "runtime.growslice", "runtime.makeslice", "runtime.makemap", "runtime.slicebytetostring", "runtime.concatstring", "runtime.rawstring", "runtime.rawbyteslice"}, "Go: allocation"},
		{[]string{"runtime.selectgo", "runtime.chansend", "runtime.chanrecv", "runtime.closechan"}, "Go: channels and select"},
		{[]string{"runtime.schedule", "runtime.findRunnable", "runtime.park_m", "runtime.mcall", "runtime.goready", "runtime.ready", "runtime.gopark", "runtime.wakep", "runtime.startm", "runtime.stopm", "runtime.sysmon", "runtime.newproc", "runtime.goexit0", "runtime.gosched"}, "Go: scheduler"},
		{[]string{"__vdso_clock_gettime", "runtime.nanotime", "time.Now", "time.Since", "time.Until"}, "Go: reading the clock"},
		{[]string{"runtime.(*timers)", "runtime.(*timer)", "time.AfterFunc", "time.NewTimer", "time.NewTicker", "time.(*Timer)", "time.(*Ticker)", "runtime.resetTimer", "runtime.stopTimer", "runtime.newTimer"}, "Go: timers"},
	}
)

func classifyStack(stack []string) string {
	var user []string
	kernel := false
	for _, f := range stack {
		if strings.HasPrefix(f, "k ") {
			kernel = true
		} else {
			user = append(user, f)
		}
	}
	if kernel {
		for _, f := range user {
			for _, k := range syscallKinds {
				if strings.HasPrefix(f, k.frame) {
					return k.kind
				}
			}
		}
		if len(user) > 0 {
			return "kernel: other (page faults, signals, …)"
		}
		return "kernel: other (interrupts, switches)"
	}
	for _, f := range user {
		for _, k := range runtimeKinds {
			for _, p := range k.prefixes {
				if strings.HasPrefix(f, p) {
					return k.kind
				}
			}
		}
		if !isRuntime(f) {
			return "code: " + packageOf(f) // memmove, hashing and the like count to their caller
		}
	}
	return "Go: runtime, other"
}

// isRuntime reports whether a symbol is the Go runtime's or an assembly routine's (no package).
func isRuntime(sym string) bool {
	return strings.HasPrefix(sym, "runtime.") || strings.HasPrefix(sym, "internal/runtime") ||
		strings.HasPrefix(sym, "internal/bytealg") || !strings.Contains(sym, ".") || sym == "[unknown]"
}

// packageOf is the package of a Go symbol, shortened inside this module.
func packageOf(sym string) string {
	sym = strings.TrimPrefix(sym, "code.foss.global/serve.zone/relay/")
	if strings.HasPrefix(sym, "main.") {
		return "main (the forwarder)"
	}
	slash := strings.LastIndexByte(sym, '/')
	if dot := strings.IndexByte(sym[slash+1:], '.'); dot >= 0 {
		return sym[:slash+1+dot]
	}
	return sym
}
