package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/kubeapi"
)

// TestDevHAHandsOver runs `relay-dev --replicas 2` against the real test API server, with the
// scripted handover every 3 s instead of 30 s: it waits until a handover has completed (another
// relay leads and Cloudly holds its socket) and a live line shows requests answered since, then
// ends the run as Ctrl-C does and reads the summary: nodes registered again after the handover,
// requests flowed after it, and Cloudly never saw two relays attached at once.
func TestDevHAHandsOver(t *testing.T) {
	kubeapi.Require(t)
	defer func(d time.Duration) { devHAHandoverEvery = d }(devHAHandoverEvery)
	devHAHandoverEvery = 3 * time.Second

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	outR, outW := io.Pipe()
	var errOut bytes.Buffer
	code := make(chan int, 1)
	go func() {
		code <- realMain(ctx, []string{"--replicas", "2", "--nodes", "5", "--duration", "2m"}, outW, &errOut)
		outW.Close()
	}()

	lines := make(chan string, 256)
	go func() {
		defer close(lines)
		for sc := bufio.NewScanner(outR); sc.Scan(); {
			lines <- sc.Text()
		}
	}()
	var out []string
	took, flowed := false, false
	timeout := time.After(90 * time.Second)
	for !flowed {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("relay-dev ended (exit %d) before a handover and requests after it:\n%s\nstderr:\n%s",
					<-code, strings.Join(out, "\n"), errOut.String())
			}
			out = append(out, l)
			switch {
			case strings.Contains(l, "scripted handover") && strings.Contains(l, " leads "):
				took = true
			case took && strings.Contains(l, " leader=relay-"):
				flowed = count(t, l, "requestsSinceHandover") > 0
			}
		case <-timeout:
			t.Fatalf("no handover with requests after it within 90 s:\n%s", strings.Join(out, "\n"))
		}
	}
	cancel() // as Ctrl-C
	for l := range lines {
		out = append(out, l)
	}
	if c := <-code; c != 0 {
		t.Fatalf("relay-dev --replicas 2: exit %d; stderr:\n%s", c, errOut.String())
	}
	if !strings.Contains(out[0], "(the leader's VPN hub on udp 127.0.0.1:") {
		t.Errorf("the first line names no UDP port of the Service for the hub: %q", out[0])
	}
	summary := out[len(out)-1]
	t.Logf("summary: %s", summary)
	if strings.Contains(summary, "leader=") {
		t.Fatalf("the last line is a live line, not the summary: %q", summary)
	}
	for _, k := range []string{"nodes", "requests", "requestsSinceHandover", "handovers"} {
		if count(t, summary, k) <= 0 {
			t.Errorf("summary %s = 0, want > 0", k)
		}
	}
	if got, nodes := count(t, summary, "registrations"), count(t, summary, "nodes"); got <= nodes {
		t.Errorf("registrations = %d with %d nodes: the nodes did not register again after the handover", got, nodes)
	}
	if n := count(t, summary, "twoAttached"); n != 0 {
		t.Errorf("Cloudly saw two relays attached at once %d times", n)
	}
	// Every timed line is a live line or the script's, which says it is scripted.
	for _, l := range out {
		if _, rest, ok := strings.Cut(l, "] "); ok && strings.HasPrefix(l, "[") &&
			!strings.HasPrefix(rest, "nodes=") && !strings.HasPrefix(rest, "scripted handover ") {
			t.Errorf("a timed line is neither a live line nor says it is scripted: %q", l)
		}
	}
}

// TestDevHAWithoutBinariesExits2 checks that `relay-dev --replicas 2` without the cached
// binaries names the one command that builds them and exits 2, starting nothing.
func TestDevHAWithoutBinariesExits2(t *testing.T) {
	t.Setenv("RELAY_KUBE_BIN_DIR", t.TempDir())
	code, out, errOut := runMain(t, nil, "--replicas", "2", "--duration", "1s")
	if code != 2 || !strings.Contains(errOut, kubeapi.BuildCommand) || out != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q: want exit 2 naming %q", code, out, errOut, kubeapi.BuildCommand)
	}
	if code, _, errOut := runMain(t, nil, "--replicas", "0"); code != 2 || !strings.Contains(errOut, "--replicas") {
		t.Fatalf("--replicas 0: exit %d, stderr %q", code, errOut)
	}
}

// count reads key=N from a summary or live line.
func count(t *testing.T, line, key string) int64 {
	t.Helper()
	m := regexp.MustCompile(`(?:^|[ \]])` + regexp.QuoteMeta(key) + `=(\d+)`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("no %s= in %q", key, line)
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

// TestDevHARestartsAReplicaWhoseTermEnded: the API server paused past the renew deadline ends the
// leader's term; its relay ends, and the dev cluster starts the Pod's relay again, a standby, as
// the kubelet restarts an exited container. Once the API answers again one relay leads, attached.
func TestDevHARestartsAReplicaWhoseTermEnded(t *testing.T) {
	kubeapi.Require(t)
	c, err := startDevCluster(2, zerolog.Nop(), "info")
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	var first *devReplica
	await.Until(t, "a replica leads, attached", 30*time.Second, func() bool {
		first = c.leader()
		return first != nil && c.cloudly.Attached()
	})
	if err := c.kube.PauseAPIServer(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			c.kube.ResumeAPIServer()
		}
	}()
	await.Until(t, first.name+"'s relay ended and started again", 30*time.Second, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		r := c.pods[first.name]
		return r != nil && r != first
	})
	if err := c.kube.ResumeAPIServer(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	await.Until(t, "a replica leads again, attached", 30*time.Second, func() bool {
		return c.leader() != nil && c.cloudly.Attached()
	})
	if err := <-first.done; !errors.Is(err, relay.ErrTermEnded) {
		t.Fatalf("%s's first relay ended with %v, want the end of its term", first.name, err)
	}
	if n := len(c.replicas()); n != 2 {
		t.Fatalf("%d replicas run, want 2", n)
	}
	if n := c.cloudly.TwoAttached(); n != 0 {
		t.Errorf("Cloudly saw two relays attached at once %d times", n)
	}
}
