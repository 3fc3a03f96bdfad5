package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"code.foss.global/serve.zone/relay/testenv/sim"
)

// The node driver runs the simulated nodes in a child process, so that the relay's process holds
// the relay alone and its memory per connection can be read off runtime.MemStats. With -cloudly
// it runs the Cloudly stand-in too: the upstream suite pins the peers, Cloudly and nodes, to one
// core and the relay to the other. The parent talks to it over stdin/stdout, one JSON line each
// way.

var driverCloudly = flag.String("cloudly", "", "internal: the driver also runs a Cloudly stand-in: direct (nodes may talk to it without a relay) or relay")

// driverReport is the driver's answer to a command.
type driverReport struct {
	CloudlyURL string  `json:"cloudlyUrl,omitempty"`
	ClusterID  string  `json:"clusterId,omitempty"`
	Token      string  `json:"token,omitempty"` // the stand-in's machine JWT (a simulator's, not a secret)
	Registered int     `json:"registered"`
	RegisterS  float64 `json:"registerSeconds"`
	Requests   int     `json:"requests"`
	Errors     int     `json:"errors"`
	Seconds    float64 `json:"seconds"`
	P50us      float64 `json:"p50us"`
	P99us      float64 `json:"p99us"`
	Err        string  `json:"error,omitempty"`
}

// runDriver is the child process. With -cloudly it starts a Cloudly stand-in and reports its URL
// first. With a url it connects and registers n nodes to it at once; otherwise on "connect <url>
// <n>" (behind a relay, once the relay has attached to the stand-in). Then it serves commands:
// "load <seconds> <concurrent nodes>" and "quit".
func runDriver(url string, n int, prefix string) error {
	raiseFileLimit()
	out := json.NewEncoder(os.Stdout)
	var cloudly *sim.Cloudly
	if *driverCloudly != "" {
		c, err := sim.NewCloudly(zerolog.Nop())
		if err != nil {
			return out.Encode(driverReport{Err: err.Error()})
		}
		defer c.Close()
		if *driverCloudly == "direct" {
			c.AcceptNodesDirectly()
		}
		cloudly = c
		out.Encode(driverReport{CloudlyURL: c.URL(), ClusterID: c.ClusterID, Token: c.Token})
	}
	var nodes []*sim.Node
	if url != "" {
		var r driverReport
		nodes, r = connectNodes(url, n, prefix)
		out.Encode(r)
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var cmd string
		fmt.Sscan(in.Text(), &cmd)
		switch cmd {
		case "connect":
			fmt.Sscan(in.Text(), &cmd, &url, &n)
			if cloudly != nil && *driverCloudly == "relay" {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				err := cloudly.WaitAttached(ctx)
				cancel()
				if err != nil {
					out.Encode(driverReport{Err: "the relay did not attach: " + err.Error()})
					continue
				}
			}
			var r driverReport
			nodes, r = connectNodes(url, n, prefix)
			out.Encode(r)
		case "load":
			var seconds float64
			var concurrent int
			fmt.Sscan(in.Text(), &cmd, &seconds, &concurrent)
			out.Encode(closedLoop(nodes[:min(concurrent, len(nodes))], time.Duration(seconds*float64(time.Second))))
		case "quit":
			return nil
		}
	}
	return nil
}

// connectNodes connects and registers n nodes to url.
func connectNodes(url string, n int, prefix string) ([]*sim.Node, driverReport) {
	nodes := make([]*sim.Node, n)
	start := time.Now()
	var g errgroup.Group
	g.SetLimit(256)
	for i := range nodes {
		g.Go(func() error {
			node := sim.NewNode(fmt.Sprintf("%s%05d", prefix, i), zerolog.Nop())
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			if err := node.Connect(ctx, url); err != nil {
				return err
			}
			nodes[i] = node
			_, err := node.Register(ctx)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, driverReport{Err: err.Error()}
	}
	return nodes, driverReport{Registered: n, RegisterS: time.Since(start).Seconds()}
}

// closedLoop makes every node send node → Cloudly requests back to back for d.
func closedLoop(nodes []*sim.Node, d time.Duration) driverReport {
	var requests, errors atomic.Int64
	lat := make([][]time.Duration, len(nodes))
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := json.RawMessage(fmt.Sprintf(`{"session":{"nodeId":%q},"observation":{"sequence":1,"phase":"running"}}`, n.ID))
			for time.Now().Before(deadline) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				start := time.Now()
				_, err := n.Call(ctx, "reportRuntimeAssignmentObservation", body)
				cancel()
				if err != nil {
					errors.Add(1)
					continue
				}
				requests.Add(1)
				lat[i] = append(lat[i], time.Since(start))
			}
		}()
	}
	wg.Wait()
	all := slices.Concat(lat...)
	slices.Sort(all)
	r := driverReport{Requests: int(requests.Load()), Errors: int(errors.Load()), Seconds: d.Seconds()}
	if len(all) > 0 {
		r.P50us = float64(all[len(all)/2].Microseconds())
		r.P99us = float64(all[len(all)*99/100].Microseconds())
	}
	return r
}

// driver is the parent's handle on a node driver process.
type driver struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *json.Decoder
}

// startDriver starts a child that connects and registers n nodes to url.
func startDriver(url string, n int, prefix string) (*driver, driverReport, error) {
	d, err := spawnDriver(nil, "-driver", "-url", url, "-n", fmt.Sprint(n), "-prefix", prefix)
	if err != nil {
		return nil, driverReport{}, err
	}
	r, err := d.next()
	if err != nil {
		d.stop()
		return nil, r, err
	}
	return d, r, nil
}

// startPeers starts a child holding a Cloudly stand-in (mode "direct" or "relay") and, once told
// where to connect, the nodes; pin, when not nil, wraps its command line (taskset). The first
// report names the stand-in.
func startPeers(mode string, pin []string) (*driver, driverReport, error) {
	d, err := spawnDriver(pin, "-driver", "-cloudly", mode)
	if err != nil {
		return nil, driverReport{}, err
	}
	r, err := d.next()
	if err != nil {
		d.stop()
		return nil, r, err
	}
	return d, r, nil
}

func spawnDriver(pin []string, args ...string) (*driver, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	argv := append(append(append([]string(nil), pin...), self), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM} // never outlive the bench
	in, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &driver{cmd: cmd, in: in, out: json.NewDecoder(stdout)}, nil
}

// next reads the driver's next report; a report carrying an error is one.
func (d *driver) next() (driverReport, error) {
	var r driverReport
	if err := d.out.Decode(&r); err != nil || r.Err != "" {
		return r, fmt.Errorf("node driver: %v %s", err, r.Err)
	}
	return r, nil
}

// connect has a peers child connect and register n nodes to url.
func (d *driver) connect(url string, n int) (driverReport, error) {
	fmt.Fprintf(d.in, "connect %s %d\n", url, n)
	return d.next()
}

func (d *driver) load(seconds float64, concurrent int) (driverReport, error) {
	fmt.Fprintf(d.in, "load %g %d\n", seconds, concurrent)
	var r driverReport
	err := d.out.Decode(&r)
	return r, err
}

func (d *driver) stop() {
	fmt.Fprintln(d.in, "quit")
	d.in.Close()
	done := make(chan struct{})
	go func() { d.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		d.cmd.Process.Kill()
		<-done
	}
}

// raiseFileLimit lifts RLIMIT_NOFILE as far as the process may: 10 000 nodes need 10 000 sockets.
func raiseFileLimit() {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) != nil {
		return
	}
	want := lim
	want.Cur = max(lim.Cur, 200_000)
	want.Max = max(lim.Max, want.Cur)
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want) != nil {
		want.Cur = lim.Max
		want.Max = lim.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want)
	}
}

func hostDescription() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	return model
}
