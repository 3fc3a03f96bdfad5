package faults

import (
	"bufio"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// Anonymous peers for the hostile-load fault: raw TCP sockets that speak just enough WebSocket to
// be upgraded and then write frames, never reading a byte after the upgrade's answer. They cost
// this process a file descriptor each and no goroutine, so that tens of thousands fit under the
// race detector's goroutine limit.

// loopback is 127.a.b.c: every address of 127.0.0.0/8 is local on Linux, so an attacker can bind
// as many source addresses as it needs.
func loopback(a, b, c byte) netip.Addr { return netip.AddrFrom4([4]byte{127, a, b, c}) }

// errRefused is an upgrade answered with something else than 101.
type errRefused struct{ status int }

func (e errRefused) Error() string { return fmt.Sprintf("upgrade answered %d", e.status) }

// dialFrom opens a TCP connection from source to addr. A peer that reads nothing (narrow) shrinks
// its receive buffer and announces an Ethernet-sized MSS before it connects: loopback's 64 KiB
// segments would let the relay's kernel buffer megabytes for it, where over a real network the
// relay itself holds what such a peer does not read.
func dialFrom(source netip.Addr, addr string, narrow bool) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: source.AsSlice()}, Timeout: 5 * time.Second}
	if narrow {
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = errors.Join(syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096),
					syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, 1400))
			})
			return errors.Join(err, serr)
		}
	}
	return d.Dial("tcp", addr)
}

// upgrade opens a WebSocket from source (narrow: see dialFrom) and reads the upgrade's answer,
// nothing more. A refused upgrade is errRefused with its status.
func upgrade(source netip.Addr, addr string, narrow bool) (net.Conn, error) {
	c, err := dialFrom(source, addr, narrow)
	if err != nil {
		return nil, err
	}
	c.Write(upgradeRequest())
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	// The relay sends nothing after the 101 until it pings (15 s), so the reader takes only the answer.
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 1024), nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	resp.Body.Close()
	c.SetReadDeadline(time.Time{})
	if resp.StatusCode != http.StatusSwitchingProtocols {
		c.Close()
		return nil, errRefused{resp.StatusCode}
	}
	return c, nil
}

// upgradeRequest is a WebSocket upgrade request.
func upgradeRequest() []byte {
	var key [16]byte
	rand.Read(key[:])
	return fmt.Appendf(nil, "GET / HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n", base64.StdEncoding.EncodeToString(key[:]))
}

// upgraded reports whether what c received so far begins with a 101 answer, without blocking.
func upgraded(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var buf [12]byte
	n := 0
	rc.Read(func(fd uintptr) bool {
		n, _, _ = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true
	})
	return n == len(buf) && string(buf[:]) == "HTTP/1.1 101"
}

// appendFrame appends one masked client frame (FIN set) carrying payload.
func appendFrame(dst []byte, opcode byte, payload []byte) []byte {
	dst = append(dst, 0x80|opcode)
	switch n := len(payload); {
	case n < 126:
		dst = append(dst, 0x80|byte(n))
	case n < 1<<16:
		dst = append(dst, 0x80|126, byte(n>>8), byte(n))
	default:
		dst = append(dst, 0x80|127, 0, 0, 0, 0, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	var key [4]byte
	rand.Read(key[:])
	dst = append(dst, key[:]...)
	for i, b := range payload {
		dst = append(dst, b^key[i&3])
	}
	return dst
}

const opText = 0x1

// peerClosed reports whether the far end closed c, reading (and dropping) whatever it sent first
// without blocking: an idle connection's only way to learn it was closed.
func peerClosed(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	closed := false
	var buf [4096]byte
	rc.Read(func(fd uintptr) bool {
		for {
			n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_DONTWAIT)
			switch {
			case err == syscall.EINTR:
				continue
			case err == syscall.EAGAIN:
			case err != nil || n == 0:
				closed = true
			default:
				continue // data (a ping, a close frame): drop it and look again
			}
			return true
		}
	})
	return closed
}

// corpus is every input of the fuzz corpora of the decoders of peer bytes: the TypedRequest
// envelope's and the contracts readers'. Each file is `go test fuzz v1` and one []byte value.
func corpus(t *testing.T) [][]byte {
	t.Helper()
	var out [][]byte
	for _, root := range []string{"../internal/typedsocket/testdata/fuzz", "../contracts/testdata/fuzz"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			values, err := parseFuzzFile(b)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			out = append(out, values...)
			return nil
		})
		if err != nil {
			t.Fatalf("read the fuzz corpora: %v", err)
		}
	}
	if len(out) < 1000 {
		t.Fatalf("only %d corpus inputs: the corpora moved", len(out))
	}
	return out
}

// scalarValue matches a corpus line holding a fuzz target's non-byte argument (a size, a flag):
// not bytes a peer sends, so not replayed.
var scalarValue = regexp.MustCompile(`^(u?int(8|16|32|64)?|bool|float(32|64)|rune|byte)\(`)

// parseFuzzFile reads a Go fuzz corpus file: the header line, then one value a line, each
// []byte("…") or string("…") with a Go-quoted literal, or a scalar argument, skipped.
func parseFuzzFile(b []byte) ([][]byte, error) {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) == 0 || strings.TrimSpace(lines[0]) != "go test fuzz v1" {
		return nil, errors.New("not a go test fuzz v1 file")
	}
	var out [][]byte
	for _, line := range lines[1:] {
		line = strings.TrimSpace(line)
		if scalarValue.MatchString(line) {
			continue
		}
		lit, ok := strings.CutPrefix(line, "[]byte(")
		if !ok {
			lit, ok = strings.CutPrefix(line, "string(")
		}
		lit, ok2 := strings.CutSuffix(lit, ")")
		if !ok || !ok2 {
			return nil, fmt.Errorf("a value that is neither []byte nor string: %.40s", line)
		}
		s, err := strconv.Unquote(lit)
		if err != nil {
			return nil, fmt.Errorf("unquote %.40s: %w", lit, err)
		}
		out = append(out, []byte(s))
	}
	return out, nil
}

// replayFrames turns the corpus into the frames anonymous peers send: each input as a frame of
// its own, as the body of a request (verbatim), and as a request whose body is the input quoted
// (a request the relay can name but not read). Frames the relay answers are kept apart from those
// that end the connection (a frame with no usable correlation), which must each go last on a
// connection for every frame before them to be read.
func replayFrames(inputs [][]byte) (answered, ending [][]byte) {
	methods := []string{"registerPalletRuntimeSession", "registerClusterIngress", "holdRuntimeNetworkDnsLeaseRenewals",
		"getClusterIngressRouteTable", "reportRuntimeAssignmentObservation", strings.Repeat("m", typedsocket.MaxMethodLen)}
	for i, in := range inputs {
		m := strconv.Quote(methods[i%len(methods)])
		id := fmt.Sprintf(`"%0*d"`, typedsocket.MaxIDLen, i)
		for _, f := range [][]byte{
			in,
			fmt.Appendf(nil, `{"method":%s,"correlation":{"id":%s,"phase":"request"},"request":%s}`, m, id, in),
			fmt.Appendf(nil, `{"method":%s,"correlation":{"id":%s,"phase":"request"},"request":%s}`, m, id, strconv.Quote(string(in))),
		} {
			if len(f) > 60<<10 {
				continue // beyond an unregistered connection's read limit: it tests the limit, not the decoder
			}
			var de *typedsocket.DecodeError
			if _, err := typedsocket.Decode(f); errors.As(err, &de) && de.ID == "" && !de.Stream {
				ending = append(ending, f)
			} else {
				answered = append(answered, f)
			}
		}
	}
	return answered, ending
}

// junkRequest is a request the relay answers relay-request-invalid and never reads further: the
// largest answer for the fewest bytes (the method and id are echoed).
func junkRequest(i int) []byte {
	return fmt.Appendf(nil, `{"method":"%s","correlation":{"id":"%0*d","phase":"request"},"request":0}`,
		strings.Repeat("j", typedsocket.MaxMethodLen), typedsocket.MaxIDLen, i)
}

// fifo keeps at most max connections from one source open, closing the oldest first.
type fifo struct {
	max   int
	conns []net.Conn
}

func (f *fifo) push(c net.Conn) {
	if len(f.conns) >= f.max {
		f.conns[0].Close()
		f.conns = f.conns[1:]
	}
	f.conns = append(f.conns, c)
}

func (f *fifo) closeAll() {
	for _, c := range f.conns {
		c.Close()
	}
	f.conns = nil
}

// isRefused reports whether err is an upgrade answered 503.
func isRefused(err error) bool {
	var r errRefused
	return errors.As(err, &r) && r.status == http.StatusServiceUnavailable
}

// answeredOrEnded reports whether c has bytes to read or has ended, without reading.
func answeredOrEnded(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	var buf [1]byte
	var n int
	var rerr error
	rc.Read(func(fd uintptr) bool {
		n, _, rerr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true
	})
	return n > 0 || rerr == nil // bytes, or the end (a read of 0 without an error)
}
