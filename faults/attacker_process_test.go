package faults

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The attackers in a process of their own. With RELAY_FAULTS_ATTACKERS set, the hostile-load
// fault's anonymous peers run in a child: this test binary run again with only
// TestAttackerProcess selected and RELAY_FAULTS_ATTACKER naming the relay's address and budget.
// The child inherits the parent's CPU pinning (the peers' core); the value says how it is
// scheduled beside the honest nodes and Cloudly's stand-in, which stay in the parent:
//
//	idle     SCHED_IDLE (chrt -i 0): the attackers run only on CPU the honest peers leave
//	nice     nice 19
//	process  the parent's priority: only the Go scheduler is no longer shared
//
// In the parent's own process the honest nodes' goroutines share one Go scheduler (one P on the
// pinned core) with thousands of attackers' goroutines and queue behind them: a p99 measured that
// way times the harness as much as the relay. Attackers on other machines are what the goal is
// about; a child the honest peers preempt is the nearest this one machine has.
//
// Parent and child speak in lines: the child writes "attacker status|http|done JSON" to its
// standard output, the parent writes "http" or "stop" to its standard input. A child whose
// standard input ends stops its attack and exits.
const attackerEnv = "RELAY_FAULTS_ATTACKER"

// attackerStatus is what the child reports every 50 ms and at its end.
type attackerStatus struct {
	Filled   bool    `json:"filled"`
	Held     int64   `json:"held"`
	Hoarded  int64   `json:"hoarded"`
	Distinct int64   `json:"distinct"`
	Summary  string  `json:"summary,omitempty"` // done only
	CPU      float64 `json:"cpu,omitempty"`     // done only: the child's CPU seconds
}

// attackerHTTP is the child's answer to "http": httpStillOpen's figures.
type attackerHTTP struct {
	Open, Total int
	Kinds       map[string]int
}

// attackChild is the parent's side of a child running the attack.
type attackChild struct {
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	mode     string
	started  time.Time
	http     chan attackerHTTP
	done     chan attackerStatus
	read     sync.WaitGroup // the reader of the child's lines
	final    attackerStatus // set by stopChild
	elapsed  time.Duration  // from start to the child's end
	lastHTTP attackerHTTP
}

// attackersMode is RELAY_FAULTS_ATTACKERS: "" (in this process), idle, nice or process.
func attackersMode() string {
	switch m := os.Getenv("RELAY_FAULTS_ATTACKERS"); m {
	case "", "idle", "nice", "process":
		return m
	default:
		panic(fmt.Sprintf("RELAY_FAULTS_ATTACKERS=%q: want idle, nice or process", m))
	}
}

// startChild runs the attack in a child process scheduled as mode says, and follows its reports
// into a's counters, so that the fault reads the same figures as from attackers in its own
// process.
func (a *attack) startChild(mode string) {
	self, err := os.Executable()
	if err != nil {
		panic(fmt.Sprintf("the attackers' process: %v", err))
	}
	argv := []string{self, "-test.run=^TestAttackerProcess$", "-test.count=1"}
	switch mode {
	case "idle":
		argv = append([]string{"chrt", "--idle", "0"}, argv...)
	case "nice":
		argv = append([]string{"nice", "-n", "19"}, argv...)
	}
	c := &attackChild{mode: mode, http: make(chan attackerHTTP, 1), done: make(chan attackerStatus, 1)}
	c.cmd = exec.Command(argv[0], argv[1:]...)
	c.cmd.Env = append(os.Environ(), attackerEnv+"="+a.addr+" "+strconv.FormatInt(a.budget, 10))
	c.cmd.Stderr = os.Stderr
	c.stdin, err = c.cmd.StdinPipe()
	if err == nil {
		var out io.ReadCloser
		if out, err = c.cmd.StdoutPipe(); err == nil {
			if err = c.cmd.Start(); err == nil {
				c.started = time.Now()
				c.read.Add(1)
				go func() { defer c.read.Done(); a.followChild(c, out) }()
			}
		}
	}
	if err != nil {
		panic(fmt.Sprintf("the attackers' process: %v", err))
	}
	a.child = c
}

// followChild reads the child's lines until it closes its standard output.
func (a *attack) followChild(c *attackChild, out io.Reader) {
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	filled := false
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "attacker ")
		kind, body, ok2 := strings.Cut(rest, " ")
		if !ok || !ok2 {
			continue // the test binary's own lines (PASS, ok)
		}
		switch kind {
		case "status", "done":
			var s attackerStatus
			if json.Unmarshal([]byte(body), &s) != nil {
				continue
			}
			a.held.Store(s.Held)
			a.hoarded.Store(s.Hoarded)
			a.distinct.Store(s.Distinct)
			if s.Filled && !filled {
				filled = true
				close(a.filled)
			}
			if kind == "done" {
				c.done <- s
			}
		case "http":
			var h attackerHTTP
			if json.Unmarshal([]byte(body), &h) == nil {
				select {
				case c.http <- h:
				default: // childHTTP gave up waiting
				}
			}
		}
	}
}

// childHTTP asks the child for its idle HTTP connections' figures.
func (a *attack) childHTTP() (open, total int, kinds map[string]int) {
	c := a.child
	if _, err := io.WriteString(c.stdin, "http\n"); err == nil {
		select {
		case h := <-c.http:
			c.lastHTTP = h
		case <-time.After(30 * time.Second):
		}
	}
	return c.lastHTTP.Open, c.lastHTTP.Total, c.lastHTTP.Kinds
}

// stopChild has the child stop its attack and waits for its end.
func (a *attack) stopChild() {
	c := a.child
	io.WriteString(c.stdin, "stop\n")
	select {
	case c.final = <-c.done:
	case <-time.After(60 * time.Second):
		c.cmd.Process.Kill()
	}
	c.stdin.Close()
	c.read.Wait()
	c.cmd.Wait()
	c.elapsed = time.Since(c.started)
}

// childSummary is the child's summary and the CPU it used.
func (a *attack) childSummary() string {
	c := a.child
	return fmt.Sprintf("%s; attackers in a process of their own (%s), %.2f cores", c.final.Summary, c.mode,
		c.final.CPU/max(c.elapsed.Seconds(), 1e-9))
}

// TestAttackerProcess is the attackers' process (see attackerEnv); without RELAY_FAULTS_ATTACKER
// it is skipped.
func TestAttackerProcess(t *testing.T) {
	spec := os.Getenv(attackerEnv)
	if spec == "" {
		t.Skip("the hostile-load fault's attackers' process: run by TestFaultHostileLoad with RELAY_FAULTS_ATTACKERS set")
	}
	addr, b, _ := strings.Cut(spec, " ")
	budget, err := strconv.ParseInt(b, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", attackerEnv, spec, err)
	}
	os.Unsetenv("RELAY_FAULTS_ATTACKERS") // this process runs the attackers itself
	a := newAttack(addr, budget, corpus(t))
	var mu sync.Mutex // one line at a time on standard output
	report := func(kind string, v any) {
		line, _ := json.Marshal(v)
		mu.Lock()
		fmt.Printf("attacker %s %s\n", kind, line)
		mu.Unlock()
	}
	status := func() attackerStatus {
		filled := false
		select {
		case <-a.filled:
			filled = true
		default:
		}
		return attackerStatus{Filled: filled, Held: a.held.Load(), Hoarded: a.hoarded.Load(), Distinct: a.distinct.Load()}
	}
	a.start()
	stopReports := make(chan struct{})
	var reports sync.WaitGroup
	reports.Add(1)
	go func() {
		defer reports.Done()
		for {
			select {
			case <-stopReports:
				return
			case <-time.After(50 * time.Millisecond):
				report("status", status())
			}
		}
	}()
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() && sc.Text() != "stop" {
		if sc.Text() == "http" {
			open, total, kinds := a.httpStillOpen()
			report("http", attackerHTTP{open, total, kinds})
		}
	}
	a.stop()
	close(stopReports)
	reports.Wait()
	s := status()
	s.Summary, s.CPU = a.summary(), selfCPU().Seconds()
	report("done", s)
}
