//go:build linux

package quicsock

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/goleak"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

func listen(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadBuffer(8 << 20)
	return c
}

// quicMessages are receive messages as quic-go's listen loop passes them: eight, of 1452 bytes.
func quicMessages() []ipv4.Message {
	ms := make([]ipv4.Message, 8)
	for i := range ms {
		ms[i].Buffers = [][]byte{make([]byte, 1452)}
		ms[i].OOB = make([]byte, 128)
	}
	return ms
}

// datagram i: a run of full-sized ones with a short one every 50th, numbered.
func datagram(i int) []byte {
	n := 1400
	if i%50 == 49 {
		n = 100
	}
	p := bytes.Repeat([]byte{byte(i)}, n)
	binary.BigEndian.PutUint32(p, uint32(i))
	return p
}

// Datagrams written through a Conn reach a Conn's ReadBatch intact and in order, one per message,
// whether the kernel carried them one by one or coalesced.
func TestDatagramsArriveIntact(t *testing.T) {
	defer goleak.VerifyNone(t)
	rc, sc := New(listen(t)), New(listen(t))
	defer rc.Close()
	defer sc.Close()
	to := rc.LocalAddr().(*net.UDPAddr)
	const n = 2000
	go func() {
		for i := range n {
			sc.WriteMsgUDP(datagram(i), nil, to)
		}
	}()
	ms := quicMessages()
	rc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for got := 0; got < n; {
		k, err := rc.ReadBatch(ms, 0)
		if err != nil {
			t.Fatalf("after %d datagrams: %v", got, err)
		}
		for _, m := range ms[:k] {
			if want := datagram(got); !bytes.Equal(m.Buffers[0][:m.N], want) {
				t.Fatalf("datagram %d: %d bytes, numbered %d", got, m.N, binary.BigEndian.Uint32(m.Buffers[0]))
			}
			if m.Addr.String() != sc.LocalAddr().String() {
				t.Fatalf("from %s", m.Addr)
			}
			got++
		}
	}
}

// A run of equal-sized datagrams to one address leaves as one GSO message: a receiving socket
// with UDP_GRO gets it in one buffer.
func TestARunIsSentAsOneGSOMessage(t *testing.T) {
	defer goleak.VerifyNone(t)
	raw := listen(t)
	defer raw.Close()
	rawConn, _ := raw.SyscallConn()
	rawConn.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_GRO, 1) })
	sc := New(listen(t))
	defer sc.Close()
	to := raw.LocalAddr().(*net.UDPAddr)
	sc.mu.Lock() // hold the flusher back, so the run is in one batch
	for i := range 10 {
		s := &sc.fill.slots[i]
		s.n, s.oobn, s.addr = copy(s.buf[:], bytes.Repeat([]byte{byte(i)}, 1200)), 0, to
	}
	sc.fill.n = 10
	sc.mu.Unlock()
	sc.wake <- struct{}{}
	buf, oob := make([]byte, 65536), make([]byte, 128)
	raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, oobn, _, _, err := raw.ReadMsgUDP(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	if n != 12000 || groSize(oob[:oobn]) != 1200 {
		t.Fatalf("received %d bytes in segments of %d; want the run of ten 1200-byte datagrams in one", n, groSize(oob[:oobn]))
	}
}

func TestGROSizeReadsTheControlMessage(t *testing.T) {
	b := make([]byte, unix.CmsgSpace(1)+unix.CmsgSpace(4))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = unix.IPPROTO_IP, unix.IP_TOS
	h.SetLen(unix.CmsgLen(1))
	h = (*unix.Cmsghdr)(unsafe.Pointer(&b[unix.CmsgSpace(1)]))
	h.Level, h.Type = unix.IPPROTO_UDP, unix.UDP_GRO
	h.SetLen(unix.CmsgLen(4))
	*(*int32)(unsafe.Pointer(&b[unix.CmsgSpace(1)+unix.CmsgSpace(0)])) = 1391
	if got := groSize(b); got != 1391 {
		t.Fatalf("groSize = %d", got)
	}
	for _, bad := range [][]byte{nil, b[:3], b[:unix.CmsgSpace(1)], {255, 255, 255, 255, 0, 0, 0, 0, 17, 0, 0, 0, 104, 0, 0, 0}} {
		if got := groSize(bad); got != 0 {
			t.Fatalf("groSize(%x) = %d", bad, got)
		}
	}
}

// A flow's packets are handed to quic-go only while fewer than Window are not yet drained: the
// rest waits, and comes when the drain loop has taken some.
func TestAFlowWaitsForItsDrain(t *testing.T) {
	defer goleak.VerifyNone(t)
	stallLimit = time.Minute
	defer func() { stallLimit = 10 * time.Millisecond }()
	rc, sc := New(listen(t)), New(listen(t))
	defer rc.Close()
	defer sc.Close()
	flow := rc.Flow(netip.MustParseAddrPort(sc.LocalAddr().String()))
	defer flow.Close()
	to := rc.LocalAddr().(*net.UDPAddr)
	for i := range Window + 20 {
		p := datagram(i % 49) // full-sized: counted
		p[0] &^= 0x80         // a 1-RTT packet
		sc.WriteMsgUDP(p, nil, to)
	}
	ms := quicMessages()
	got := 0
	for got < Window {
		k, err := rc.ReadBatch(ms, 0)
		if err != nil {
			t.Fatal(err)
		}
		got += k
	}
	if got != Window {
		t.Fatalf("handed over %d before any drain; want %d", got, Window)
	}
	more := make(chan int)
	go func() {
		k, _ := rc.ReadBatch(ms, 0)
		more <- k
	}()
	select {
	case k := <-more:
		t.Fatalf("handed over %d more with %d not drained", k, Window)
	case <-time.After(100 * time.Millisecond):
	}
	for range 10 {
		flow.Drained()
	}
	select {
	case k := <-more:
		if k < 1 || k > 8 {
			t.Fatalf("handed over %d after 10 drained", k)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a drained flow's packets still wait")
	}
}

// Stop sends what is queued; writes after it fail.
func TestStopFlushesAndEndsWrites(t *testing.T) {
	defer goleak.VerifyNone(t)
	rc, raw := New(listen(t)), listen(t)
	defer rc.Close()
	sc := New(raw)
	defer raw.Close()
	to := rc.LocalAddr().(*net.UDPAddr)
	for i := range 100 {
		sc.WriteMsgUDP(datagram(i), nil, to)
	}
	sc.Stop()
	if _, _, err := sc.WriteMsgUDP(datagram(0), nil, to); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after Stop: %v", err)
	}
	ms := quicMessages()
	rc.SetReadDeadline(time.Now().Add(5 * time.Second))
	for got := 0; got < 100; {
		k, err := rc.ReadBatch(ms, 0)
		if err != nil {
			t.Fatalf("%d of 100 arrived: %v", got, err)
		}
		got += k
	}
}

// Empty datagrams carry nothing for quic-go and are skipped: ReadBatch never reports zero
// messages without an error, which quic-go would take as a stale message to read again.
func TestEmptyDatagramsAreSkipped(t *testing.T) {
	defer goleak.VerifyNone(t)
	rc, sc := New(listen(t)), listen(t)
	defer rc.Close()
	defer sc.Close()
	to := rc.LocalAddr().(*net.UDPAddr)
	sc.WriteToUDP(nil, to)
	sc.WriteToUDP(nil, to) // loopback queues each datagram at rc before WriteToUDP returns
	ms := quicMessages()
	rc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if k, err := rc.ReadBatch(ms, 0); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("with only empty datagrams to read: ReadBatch = %d, %v; want it to wait", k, err)
	}
	sc.WriteToUDP([]byte("after"), to)
	rc.SetReadDeadline(time.Now().Add(5 * time.Second))
	k, err := rc.ReadBatch(ms, 0)
	if err != nil || k != 1 || string(ms[0].Buffers[0][:ms[0].N]) != "after" {
		t.Fatalf("ReadBatch = %d, %v, %q", k, err, ms[0].Buffers[0][:ms[0].N])
	}
}
