package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// TestFaultSIGTERMMidTraffic runs the real relay binary, has nodes send through it while Cloudly
// answers slowly, and stops it with SIGTERM: it must exit 0 within its 5 s shutdown time, close
// every node socket with 1001, and leave no request without an answer or a named refusal.
func TestFaultSIGTERMMidTraffic(t *testing.T) {
	base := runtime.NumGoroutine()
	nodeCount := size(50, 500)
	f := figures{fault: "the relay killed with SIGTERM mid-traffic", nodes: nodeCount}
	func() {
		dir := t.TempDir()
		bin := buildRelay(t)
		cloudly, err := sim.NewCloudly(zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		defer cloudly.Close()
		token := filepath.Join(dir, "jwt")
		os.WriteFile(token, []byte(cloudly.Token), 0o600)
		// Port 0: the relay binds what the kernel gives, and says so in its start-up line.
		cmd := exec.Command(bin, "run", "--cluster-id", cloudly.ClusterID, "--node-id", "relay-node",
			"--cloudly-url", cloudly.URL(), "--cloudly-token-file", token, "--insecure-plaintext",
			"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--advertise-address", "192.0.2.1", "--log-level", "info")
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		bound := make(chan [2]string, 1)
		read := make(chan struct{})
		go func() { defer close(read); boundAddresses(stderr, bound) }()
		exited := make(chan error, 1)
		go func() { <-read; exited <- cmd.Wait() }()
		defer func() {
			if cmd.ProcessState == nil {
				cmd.Process.Kill()
			}
		}()
		var listen, admin string
		select {
		case a := <-bound:
			listen, admin = a[0], a[1]
		case <-time.After(20 * time.Second):
			t.Fatal("the relay logged no bound addresses within 20 s")
		}
		await.Until(t, "the relay ready", 20*time.Second, func() bool { return ready(admin) })
		nodes := make([]*sim.Node, nodeCount)
		for i := range nodes {
			n := sim.NewNode(fmt.Sprintf("node-%04d", i), zerolog.Nop())
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := n.Connect(ctx, "ws://"+listen+"/"); err != nil {
				t.Fatal(err)
			}
			if _, err := n.Register(ctx); err != nil {
				t.Fatal(err)
			}
			cancel()
			nodes[i] = n
			defer n.Close()
		}
		cloudly.SetSlowness(50 * time.Millisecond)
		var ta tally
		stop := make(chan struct{})
		senders := sendUntil(nodes, &ta, 0, stop)
		phase(size(time.Second, 5*time.Second))

		start := time.Now()
		cmd.Process.Signal(syscall.SIGTERM)
		var exitErr error
		select {
		case exitErr = <-exited:
		case <-time.After(10 * time.Second):
			t.Fatal("the relay did not exit within 10 s of SIGTERM")
		}
		took := time.Since(start)
		close(stop)
		senders.Wait()
		f.take(&ta, t)
		closedWith1001 := 0
		for _, n := range nodes {
			select {
			case <-n.Conn().Done():
				if websocket.CloseStatus(context.Cause(n.Conn().Context())) == websocket.StatusGoingAway {
					closedWith1001++
				}
			case <-time.After(5 * time.Second):
			}
		}
		f.extra = fmt.Sprintf("exit %v after %s; %d of %d sockets closed with 1001", exitErr, took.Round(time.Millisecond), closedWith1001, nodeCount)
		if exitErr != nil {
			t.Errorf("the relay exited with %v", exitErr)
		}
		if took > 6*time.Second {
			t.Errorf("shutdown took %s", took)
		}
		if closedWith1001 != nodeCount {
			t.Errorf("%d of %d node sockets closed with 1001", closedWith1001, nodeCount)
		}
		if f.answered == 0 {
			t.Error("no request was answered before the signal: the fault was not exercised")
		}
	}()
	f.leaked = leakedAfter(t, base)
	f.check(t)
}

// boundAddresses reads a relay's log lines from r: it sends the downstream and admin addresses of
// its start-up line on bound, and copies every warning and error to the test's standard error.
func boundAddresses(r io.Reader, bound chan<- [2]string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l struct{ Level, Message, Listen, Admin string }
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		switch {
		case l.Message == "relay starting" && l.Listen != "" && l.Admin != "":
			bound <- [2]string{l.Listen, l.Admin}
		case l.Level == "warn" || l.Level == "error" || l.Level == "fatal":
			fmt.Fprintln(os.Stderr, sc.Text())
		}
	}
}

// freePort returns a loopback address nothing listens on now. Another process may take it before
// the relay binds it: startRelay then starts the relay again on fresh ports; a relay given port 0
// reports what it bound instead (boundAddresses).
func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func ready(admin string) bool {
	resp, err := http.Get("http://" + admin + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
