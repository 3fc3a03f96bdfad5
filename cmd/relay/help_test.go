package main

import (
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"

	"code.foss.global/serve.zone/relay/relay"
)

// TestHelpListsEveryFlag checks what the top-level usage promises: "relay <command> -h" lists the
// command's flags, each with its environment variable and default, and exits 0. The image carries
// no documentation, so this is all an operator in a container has.
func TestHelpListsEveryFlag(t *testing.T) {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var cfg relay.Config
	runFlags(fs, &cfg)
	for _, arg := range []string{"-h", "--help"} {
		code, out, stderr := runMain(t, nil, "run", arg)
		if code != 0 || stderr != "" {
			t.Fatalf("run %s: exit %d, stderr %q", arg, code, stderr)
		}
		fs.VisitAll(func(f *flag.Flag) {
			line := regexp.MustCompile(`(?m)^  --` + regexp.QuoteMeta(f.Name) + `\s+` + envName(f.Name) + `\s.*$`).FindString(out)
			if line == "" {
				t.Errorf("run %s does not list --%s with %s:\n%s", arg, f.Name, envName(f.Name), out)
			} else if f.DefValue != "" && f.DefValue != "false" && !strings.Contains(line, "(default "+f.DefValue+")") {
				t.Errorf("run %s: --%s line %q lacks its default %s", arg, f.Name, line, f.DefValue)
			}
		})
	}
	if code, out, _ := runMain(t, nil, "dev", "-h"); code != 0 || !strings.Contains(out, "--nodes") || !strings.Contains(out, "--duration") {
		t.Fatalf("dev -h: exit %d, %q", code, out)
	}
	if code, out, _ := runMain(t, nil, "keygen", "-h"); code != 0 || !strings.Contains(out, "--hub-key-file") {
		t.Fatalf("keygen -h: exit %d, %q", code, out)
	}
}

// TestOperatingDocListsEveryRunFlag checks docs/operating.md's flag table against the flags
// `relay run` defines: every flag has a row, and a non-empty text default is the one in the code.
func TestOperatingDocListsEveryRunFlag(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, _ := strings.Cut(string(doc), "\n## Flags and environment\n")
	table, _, _ = strings.Cut(table, "\n## ")
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var cfg relay.Config
	runFlags(fs, &cfg)
	fs.VisitAll(func(f *flag.Flag) {
		row := regexp.MustCompile("(?m)^\\| [^|]*`--" + regexp.QuoteMeta(f.Name) + "`[^|]*\\|([^|]*)\\|.*$").FindStringSubmatch(table)
		if row == nil {
			t.Errorf("docs/operating.md has no flag table row for --%s", f.Name)
			return
		}
		if _, isNumber := f.Value.(flag.Getter).Get().(int64); f.DefValue != "" && f.DefValue != "false" && !isNumber &&
			!strings.Contains(row[1], "`"+f.DefValue+"`") {
			t.Errorf("docs/operating.md gives --%s the default %q; the code's is %s", f.Name, strings.TrimSpace(row[1]), f.DefValue)
		}
	})
}
