package vpnhub

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
)

// memDevice is an in-memory Device: tests put packets in and take the tunnel's out.
type memDevice struct {
	in, out chan []byte
	once    sync.Once
	closed  chan struct{}
}

func newMemDevice() *memDevice {
	return &memDevice{in: make(chan []byte, 64), out: make(chan []byte, 64), closed: make(chan struct{})}
}

func (d *memDevice) ReadPacket(buf []byte) (int, error) {
	select {
	case p := <-d.in:
		return copy(buf, p), nil
	case <-d.closed:
		return 0, ErrClosed
	}
}

func (d *memDevice) WritePacket(p []byte) error {
	select {
	case d.out <- bytes.Clone(p):
	default:
	}
	return nil
}

func (d *memDevice) Close() error { d.once.Do(func() { close(d.closed) }); return nil }

func (d *memDevice) next(t *testing.T) []byte {
	t.Helper()
	select {
	case p := <-d.out:
		return p
	case <-time.After(5 * time.Second):
		t.Fatal("no packet out of the tunnel")
		return nil
	}
}

func TestTunnelRejoinsAfterRemovalAndStopsWhenReplaced(t *testing.T) {
	checkLeaks(t)
	th := startHub(t, nil)
	ka, kb := testKey(t, 2), testKey(t, 3)
	th.push(t, 1, testMember(ka, "node-a", 2), testMember(kb, "node-b", 3))
	b := th.mustDial(t, kb, "node-b")

	cl, err := NewClient(ClientConfig{Hub: th.addr(), HubKey: th.key.Public, AuthorityID: testAuthority, NodeID: "node-a", Key: ka})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	dev := newMemDevice()
	joins := make(chan *Conn, 4)
	tu := &Tunnel{Client: cl, Device: dev, OnJoin: func(c *Conn) { joins <- c }}
	done := make(chan error, 1)
	go func() { done <- tu.Run(context.Background()) }()
	join := func() *Conn {
		select {
		case c := <-joins:
			return c
		case <-time.After(15 * time.Second):
			t.Fatal("the tunnel did not join")
			return nil
		}
	}
	join()
	dev.in <- ipv4Packet(addrA, addrB, []byte("through the tunnel"))
	if got := receiveWithin(b, 5*time.Second); got == nil {
		t.Fatal("b received nothing from the tunnel")
	}
	dev.in <- ipv4Packet(addrB, addrB, []byte("not my address")) // dropped at the tunnel
	b.WritePacket(ipv4Packet(addrB, addrA, []byte("to the tunnel")))
	if p := dev.next(t); !bytes.Contains(p, []byte("to the tunnel")) {
		t.Fatalf("device got %q", p)
	}

	th.push(t, 2, testMember(kb, "node-b", 3)) // a removed: its session closes, redials are refused
	time.Sleep(600 * time.Millisecond)
	th.push(t, 3, testMember(ka, "node-a", 2), testMember(kb, "node-b", 3))
	join()

	th.mustDial(t, ka, "node-a") // another session of a's key: the tunnel must give way
	select {
	case err := <-done:
		if !errors.Is(err, contracts.VPNMemberReplaced) {
			t.Fatalf("tunnel ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the tunnel kept running after it was replaced")
	}
	if tu.Dropped() < 1 || tu.Sent() < 1 {
		t.Fatalf("sent %d dropped %d", tu.Sent(), tu.Dropped())
	}
}
