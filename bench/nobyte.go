package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The nobyte suite: the hostile-load fault (faults.TestFaultNoByteOutsideTheBudget, docs/hostile.md
// "No byte outside the budget" and "Descriptors") measured the way the upstream suite measures:
// the relay binary pinned to core hopCPU, the fault's process (the registered nodes, Cloudly's
// stand-in and every attacker) pinned to core peersCPU, so that the relay's CPU is its own and the
// attackers cannot take it.
//
//	go run ./bench -suites nobyte
//	RELAY_BENCH_BEFORE=/tmp/old go run ./bench -suites nobyte   # and a "before" column
//
// RELAY_BENCH_BEFORE names a worktree of an older commit into which faults/ of this one has been
// copied (the fault's test files, and sim.ErrNoRelaySocket): its fault runs there, against its
// relay, with the same pinning, and its figures stand beside today's.

// nobyteFigures is what faults.nobyte writes (RELAY_FAULTS_FIGURES), the fields the table reads.
type nobyteFigures struct {
	Fault                  string
	Nodes                  int
	Budget                 int64
	HeapPeak, HeapLive     int64
	RSS, BudgetPeak        int64
	FDPeak, FDLimit        int
	ConnCap                int
	Answered, Refused      int64
	Lost, Cut              int64
	RunsHeld, RunsReleased int
	CalmP99, AttackP99     time.Duration
	RelayCPU, PeersCPU     [2]float64
	Closed                 map[string]float64
	Evictions, Refusals    float64
	Attack                 map[string]int64
	EMFILE                 int64
	Attaches               float64
	LateNodes, LateLost    int
	HeapGoal               int64
	Relay, PeersCPUPinned  string
}

func runNoByte(cfg benchConfig, w *bytes.Buffer) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	mode := "long"
	if cfg.quick {
		mode = "short"
	}
	today, outToday, errToday := nobyteRun(root, mode)
	var before []nobyteFigures
	var errBefore error
	beforeDir := os.Getenv("RELAY_BENCH_BEFORE")
	if beforeDir != "" {
		before, _, errBefore = nobyteRun(beforeDir, mode)
	}
	fmt.Fprintf(w, "\n## No byte outside the budget (docs/hostile.md): header floods, partial frames, descriptor exhaustion\n\n")
	fmt.Fprintf(w, "`RELAY_FAULTS=%s RELAY_FAULTS_RELAY_CPU=%d taskset -c %d faults.test -test.run TestFaultNoByteOutsideTheBudget` (built by `go test -c ./faults`): "+
		"the relay binary on core %d, the nodes, Cloudly's stand-in and the attackers on core %d.", mode, hopCPU, peersCPU, hopCPU, peersCPU)
	if beforeDir != "" {
		commit, _ := exec.Command("git", "-C", beforeDir, "rev-parse", "--short", "HEAD").Output()
		fmt.Fprintf(w, " Before: the same fault run in a worktree of %s (its relay), with the same pinning.", strings.TrimSpace(string(commit)))
	}
	fmt.Fprintln(w)
	for _, part := range []string{"header floods and partial frames", "descriptor exhaustion"} {
		now, old := pick(today, part), pick(before, part)
		if now == nil {
			continue
		}
		fmt.Fprintf(w, "\n### %s\n\n| figure | goal | today |", now.Fault)
		if old != nil {
			fmt.Fprint(w, " before |")
		}
		fmt.Fprint(w, "\n| --- | --- | --- |")
		if old != nil {
			fmt.Fprint(w, " --- |")
		}
		fmt.Fprintln(w)
		for _, row := range nobyteRows(now) {
			fmt.Fprintf(w, "| %s | %s | %s |", row[0], row[1], row[2])
			if old != nil {
				for _, r := range nobyteRows(old) {
					if r[0] == row[0] {
						fmt.Fprintf(w, " %s |", r[2])
					}
				}
			}
			fmt.Fprintln(w)
		}
	}
	if errToday != nil {
		fmt.Fprintf(w, "\n```\n%s\n```\n", tail(outToday, 30))
		return errToday
	}
	if errBefore != nil {
		fmt.Fprintf(w, "\nBefore: the fault failed there, as it should: %v.\n", errBefore)
	}
	return nil
}

// nobyteRows are one part's figures as table rows: name, goal, value.
func nobyteRows(f *nobyteFigures) [][3]string {
	mib := func(n int64) string { return fmt.Sprintf("%d MiB", n>>20) }
	pct := func(a, b time.Duration) string {
		if a <= 0 {
			return "n/a"
		}
		return fmt.Sprintf("%+.0f %%", 100*(float64(b)/float64(a)-1))
	}
	var closed []string
	for _, r := range []string{"budget", "descriptors", "descriptors-oldest", "limit", "source-limit", "overdue"} {
		if v := f.Closed[r]; v > 0 {
			closed = append(closed, fmt.Sprintf("%s %.0f", r, v))
		}
	}
	attack := func(keys ...string) string {
		var out []string
		for _, k := range keys {
			if v, ok := f.Attack[k]; ok {
				out = append(out, fmt.Sprintf("%s %d", k, v))
			}
		}
		return strings.Join(out, ", ")
	}
	rows := [][3]string{
		{"relay's peak heap (GC trace and /metrics)", "≤ budget + 64 MiB = " + mib(f.HeapGoal), fmt.Sprintf("%s (live ≤ %s)", mib(f.HeapPeak), mib(f.HeapLive))},
		{"relay's peak RSS", "reported", mib(f.RSS)},
		{"relay_downstream_budget_used_bytes at most", "≤ " + mib(f.Budget), fmt.Sprintf("%.1f MiB", float64(f.BudgetPeak)/(1<<20))},
		{"descriptors in use at most (process_open_fds) / limit / downstream cap", "< limit", fmt.Sprintf("%d / %d / %d", f.FDPeak, f.FDLimit, f.ConnCap)},
		{"honest requests lost", "0", fmt.Sprintf("%d of %d", f.Lost, f.Answered+f.Refused+f.Lost)},
		{"honest requests refused by name", "0 (descriptor part: only while Cloudly is dropped)", strconv.FormatInt(f.Refused, 10)},
		{"escrowed runs lost", "0", fmt.Sprintf("%d (%d held, %d released on detach)", f.Nodes-f.RunsReleased, f.RunsHeld, f.RunsReleased)},
		{"honest p99, calm → attacked", "≤ +25 %", fmt.Sprintf("%s → %s (%s)", f.CalmP99.Round(10*time.Microsecond), f.AttackP99.Round(10*time.Microsecond), pct(f.CalmP99, f.AttackP99))},
		{"relay CPU, calm → attacked (cores)", "reported", fmt.Sprintf("%.2f → %.2f (peers' and attackers' %.2f → %.2f)", f.RelayCPU[0], f.RelayCPU[1], f.PeersCPU[0], f.PeersCPU[1])},
		{"relay_downstream_unregistered_closed_total by reason", "named", strings.Join(closed, ", ")},
		{"budget evictions, refusals", "reported", fmt.Sprintf("%.0f, %.0f", f.Evictions, f.Refusals)},
		{`relay log lines "too many open files"`, "0", strconv.FormatInt(f.EMFILE, 10)},
		{"upstream attaches (the second after Cloudly's drop)", "descriptor part: 2", fmt.Sprintf("%.0f", f.Attaches)},
	}
	if f.LateNodes > 0 {
		rows = append(rows, [3]string{"honest nodes arriving at the cap, not carried", "0", fmt.Sprintf("%d of %d", f.LateLost, f.LateNodes)})
	}
	rows = append(rows, [3]string{"the attack", "", attack("header-opened", "header-431", "header-503", "header-none", "admitted-conns", "admitted-refused",
		"admitted-withheld", "registered-conns", "registered-withheld", "idle-held", "idle-opened", "idle-closed-by-relay", "idle-dial-errors")})
	return rows
}

func pick(figs []nobyteFigures, part string) *nobyteFigures {
	for i := range figs {
		if strings.HasPrefix(figs[i].Fault, part) {
			return &figs[i]
		}
	}
	return nil
}

// nobyteRun builds the fault suite of the module at dir and runs the fault pinned; the figures come
// back whether or not the fault passed.
func nobyteRun(dir, mode string) ([]nobyteFigures, string, error) {
	tmp, err := os.MkdirTemp("", "relay-nobyte-*")
	if err != nil {
		return nil, "", err
	}
	defer os.RemoveAll(tmp)
	bin, figs := filepath.Join(tmp, "faults.test"), filepath.Join(tmp, "figures.jsonl")
	build := exec.Command("go", "test", "-c", "-o", bin, "./faults")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		return nil, string(out), fmt.Errorf("go test -c ./faults in %s: %v", dir, err)
	}
	cmd := exec.Command("taskset", "-c", strconv.Itoa(peersCPU), bin, "-test.run", "TestFaultNoByteOutsideTheBudget", "-test.count=1", "-test.v", "-test.timeout", "30m")
	cmd.Dir = filepath.Join(dir, "faults")
	cmd.Env = append(os.Environ(), "RELAY_FAULTS="+mode, "RELAY_FAULTS_RELAY_CPU="+strconv.Itoa(hopCPU), "RELAY_FAULTS_FIGURES="+figs)
	out, runErr := run(cmd)
	f, err := os.Open(figs)
	if err != nil {
		return nil, out, fmt.Errorf("no figures (%v): %w", runErr, err)
	}
	defer f.Close()
	var all []nobyteFigures
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var n nobyteFigures
		if json.Unmarshal(sc.Bytes(), &n) == nil {
			all = append(all, n)
		}
	}
	return all, out, runErr
}
