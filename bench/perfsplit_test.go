package main

import (
	"maps"
	"strings"
	"testing"
)

func TestPerfSplit(t *testing.T) {
	script := `
	ffffffff8201b2db tcp_event_data_recv
	ffffffff821ef691 do_syscall_64
	            b44e internal/runtime/syscall/linux.Syscall6
	           a2e7b syscall.write
	          15dbe5 net.(*netFD).Write

	           1a2b3 runtime.memmove
	           1a2b4 code.foss.global/serve.zone/relay/contracts.scanString
	           1a2b5 code.foss.global/serve.zone/relay/internal/typedsocket.Decode

	           1a2b6 runtime.nextFreeFast
	           1a2b7 runtime.mallocgcSmallNoscan
	           1a2b8 runtime.mallocgc
	           1a2b9 io.ReadAll

	           1a2c0 aeshashbody
	           1a2c1 main.(*forwarder).readUpstream

	           1a2c2 __vdso_clock_gettime
	           1a2c3 runtime.nanotime1
	           1a2c4 time.Now

	ffffffff81000000 asm_sysvec_apic_timer_interrupt
`
	got, total := perfSplit(strings.NewReader(script))
	want := map[string]int{
		"kernel: write(2), with the loopback delivery it runs": 1,
		"code: contracts":                      1,
		"Go: allocation":                       1,
		"code: main (the forwarder)":           1,
		"Go: reading the clock":                1,
		"kernel: other (interrupts, switches)": 1,
	}
	if total != 6 || !maps.Equal(got, want) {
		t.Fatalf("perfSplit = %v (%d samples), want %v", got, total, want)
	}
}
