// Command testsummary reads `go test -json` on standard input and writes what `go test` without
// -json would — each package's ok/FAIL line, and the output of failing tests only — then a
// summary of what ran and what skipped, each skip with its reason, so that a suite that skipped
// (no Node.js, no Chromium) is seen, not hidden behind "ok". It exits 1 when a test or a build
// failed, or the stream held no test at all. .ci/run pipes the README's test command into it.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string // build-output events
}

type key struct{ pkg, test string }

type skip struct {
	key
	reason string
}

func main() {
	os.Exit(summarize(os.Stdin, os.Stdout))
}

func summarize(in io.Reader, out io.Writer) int {
	held := map[key][]string{} // a running test's output, printed only if it fails
	var passed, failed, skipped int
	var skips []skip
	var failures []key
	failedBuild := false
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			fmt.Fprintln(out, sc.Text()) // not test2json: a go command error, say
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "build-output":
			fmt.Fprint(out, e.Output)
		case "build-fail":
			failedBuild = true
		case "output":
			if e.Test == "" {
				if e.Output != "PASS\n" { // go test prints it only with -v
					fmt.Fprint(out, e.Output) // the package's own lines: ok, FAIL, panics
				}
			} else {
				held[k] = append(held[k], e.Output)
			}
		case "pass":
			if e.Test != "" {
				passed++
				delete(held, k)
			}
		case "fail":
			if e.Test != "" {
				failed++
				failures = append(failures, k)
				fmt.Fprint(out, strings.Join(held[k], ""))
				delete(held, k)
			}
		case "skip":
			if e.Test != "" {
				skipped++
				skips = append(skips, skip{k, reason(held[k])})
				delete(held, k)
			}
		}
	}
	fmt.Fprintf(out, "\n== test summary: %d passed, %d failed, %d skipped ==\n", passed, failed, skipped)
	sort.Slice(skips, func(i, j int) bool {
		if skips[i].pkg != skips[j].pkg {
			return skips[i].pkg < skips[j].pkg
		}
		return skips[i].test < skips[j].test
	})
	for _, s := range skips {
		fmt.Fprintf(out, "SKIP %s %s: %s\n", s.pkg, s.test, s.reason)
	}
	for _, f := range failures {
		fmt.Fprintf(out, "FAIL %s %s\n", f.pkg, f.test)
	}
	if failedBuild {
		fmt.Fprintln(out, "FAIL: a package did not build")
	}
	if failed > 0 || failedBuild || passed+skipped == 0 {
		return 1
	}
	return 0
}

// reason is what a skipped test said: its last line of output other than the --- SKIP line,
// without the file:line prefix t.Skip adds.
func reason(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "--- SKIP") || strings.HasPrefix(l, "=== ") {
			continue
		}
		if _, msg, ok := strings.Cut(l, ": "); ok && strings.Contains(strings.SplitN(l, ": ", 2)[0], ".go:") {
			return msg
		}
		return l
	}
	return "(no reason given)"
}
