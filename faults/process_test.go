package faults

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// relayProcess is the real relay binary, `relay run` against a Cloudly stand-in, as a process of
// its own: its memory is its own (this process's peers do not count in it), and it either keeps
// running or exits.
type relayProcess struct {
	cmd           *exec.Cmd
	listen, admin string
	exited        chan struct{} // closed when the process has exited; exitErr is then set
	exitErr       error
	heapPeak      atomic.Int64 // bytes: the largest heap a GC reported (GODEBUG=gctrace=1)
	heapLive      atomic.Int64 // bytes: the largest live heap a GC left
	gcs           atomic.Int64 // GC cycles reported
	gcShare       atomic.Int64 // percent of its time the process spent in GC since it started, at the last GC
	emfile        atomic.Int64 // lines the relay wrote that say it ran out of descriptors

	mu   sync.Mutex
	tail []string // guarded by mu: the last lines the relay wrote that are not GC traces
}

// buildRelay builds cmd/relay into a test directory. RELAY_FAULTS_RELAY_BIN names a binary to
// run instead (an older build, to measure what a fix changed).
func buildRelay(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("RELAY_FAULTS_RELAY_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "relay")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/relay").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// gcLine is one GODEBUG=gctrace=1 line's heap figures: at the start of the cycle, at its end, live.
var gcLine = regexp.MustCompile(`^gc \d+ @[0-9.]+s (\d+)%: .* (\d+)->(\d+)->(\d+) MB`)

// startRelay runs bin against cloudly with the flags every fault needs and extra ones, and waits
// until it is ready. RELAY_FAULTS_RELAY_ENV adds to its environment (space-separated NAME=value:
// GOMEMLIMIT, GOGC, …). With gctrace it reports every GC's heap on standard error, read into heapPeak.
// The process is killed when the test ends, if it still runs.
func startRelay(t *testing.T, bin string, cloudly *sim.Cloudly, gctrace bool, extra ...string) *relayProcess {
	t.Helper()
	return startRelayUnder(t, nil, bin, cloudly, gctrace, extra...)
}

// startRelayUnder is startRelay with the relay's command line run by wrap (a program that sets
// something of the process's and executes the rest, as prlimit does), so that the relay's pid is
// the one started. RELAY_FAULTS_RELAY_CPU=n pins the relay to core n (taskset), as the benchmarks
// run it: its own core, the peers and attackers on the others.
func startRelayUnder(t *testing.T, wrap []string, bin string, cloudly *sim.Cloudly, gctrace bool, extra ...string) *relayProcess {
	t.Helper()
	token := filepath.Join(t.TempDir(), "jwt")
	if err := os.WriteFile(token, []byte(cloudly.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	// freePort's address may be taken by another process before the relay binds it: a relay that
	// exits for that is started again on fresh ports, a few times.
	for attempt := 1; ; attempt++ {
		p := spawnRelay(t, wrap, bin, cloudly, token, gctrace, extra...)
		if await.Within(20*time.Second, func() bool { return ready(p.admin) || p.hasExited() }) && !p.hasExited() {
			return p
		}
		if attempt < 4 && p.hasExited() && strings.Contains(p.lastLines(), "address already in use") {
			continue
		}
		t.Fatalf("the relay never became ready; it wrote:\n%s", p.lastLines())
	}
}

// spawnRelay starts one relay process on fresh loopback ports; it is killed when the test ends,
// if it still runs.
func spawnRelay(t *testing.T, wrap []string, bin string, cloudly *sim.Cloudly, token string, gctrace bool, extra ...string) *relayProcess {
	t.Helper()
	p := &relayProcess{listen: freePort(t), admin: freePort(t), exited: make(chan struct{})}
	args := append([]string{"run", "--cluster-id", cloudly.ClusterID, "--node-id", "relay-node",
		"--cloudly-url", cloudly.URL(), "--cloudly-token-file", token, "--insecure-plaintext",
		"--listen", p.listen, "--admin-listen", p.admin, "--advertise-address", "192.0.2.1", "--log-level", "warn"}, extra...)
	argv := append(slices.Clone(wrap), bin)
	if cpu := os.Getenv("RELAY_FAULTS_RELAY_CPU"); cpu != "" {
		argv = append([]string{"taskset", "-c", cpu}, argv...)
	}
	p.cmd = exec.Command(argv[0], append(argv[1:], args...)...)
	p.cmd.Env = append(os.Environ(), strings.Fields(os.Getenv("RELAY_FAULTS_RELAY_ENV"))...)
	if gctrace {
		p.cmd.Env = append(p.cmd.Env, "GODEBUG=gctrace=1")
	}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		p.readStderr(stderr)
	}()
	go func() {
		<-read // Wait closes the pipe: read it to the end first
		p.exitErr = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

func (p *relayProcess) readStderr(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := gcLine.FindStringSubmatch(line); m != nil {
			share, _ := strconv.ParseInt(m[1], 10, 64)
			start, _ := strconv.ParseInt(m[2], 10, 64)
			end, _ := strconv.ParseInt(m[3], 10, 64)
			live, _ := strconv.ParseInt(m[4], 10, 64)
			p.gcs.Add(1)
			p.gcShare.Store(share)
			raise(&p.heapPeak, max(start, end)<<20)
			raise(&p.heapLive, live<<20)
			continue
		}
		if strings.Contains(line, "too many open files") {
			p.emfile.Add(1)
		}
		p.mu.Lock()
		if p.tail = append(p.tail, line); len(p.tail) > 40 {
			p.tail = p.tail[1:]
		}
		p.mu.Unlock()
	}
}

// raise sets v to n when n is larger.
func raise(v *atomic.Int64, n int64) {
	for {
		old := v.Load()
		if n <= old || v.CompareAndSwap(old, n) {
			return
		}
	}
}

func (p *relayProcess) lastLines() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, "\n")
}

func (p *relayProcess) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// url is the relay's downstream WebSocket URL.
func (p *relayProcess) url() string { return "ws://" + p.listen + "/" }

// stop sends SIGTERM and waits (10 s at most) for the exit; nil is exit status 0.
func (p *relayProcess) stop() error {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return p.exitErr
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("no exit within 10 s of SIGTERM")
	}
}

// metrics scrapes the admin /metrics: every series by its name and labels as written
// (`name{a="b"}`), to its value.
func (p *relayProcess) metrics() (map[string]float64, error) {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + p.admin + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics answered %d", resp.StatusCode)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

// cpu is the CPU time the process has used so far, from /proc; 0 when unreadable.
func (p *relayProcess) cpu() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// Fields after the command (which may hold spaces) start at the last ')'; utime and stime
	// are the 14th and 15th fields of the whole line, in clock ticks (100 a second on Linux).
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// vmHWM is the process's peak resident set size, from /proc, in bytes; 0 when unreadable.
func (p *relayProcess) vmHWM() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
