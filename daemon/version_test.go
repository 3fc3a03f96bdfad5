package daemon

import (
	"strings"
	"testing"
)

// TestBadBuildVersionFailsVersionAndRun builds nothing: it sets the version -ldflags would, as a
// CI tag such as v0.2.0 passed to the Dockerfile does, and checks that `relay version` fails (so
// the image build fails) and that `relay run` says what is wrong without naming a flag that does
// not exist.
func TestBadBuildVersionFailsVersionAndRun(t *testing.T) {
	if code, _, stderr := runMainAs(t, "v0.2.0", nil, "version"); code != 1 || !strings.Contains(stderr, `built as version "v0.2.0"`) {
		t.Fatalf("version: exit %d, stderr %q; want 1 naming the build version", code, stderr)
	}
	code, _, stderr := runMainAs(t, "v0.2.0", nil, "run", "--cluster-id", "c1")
	if code != 1 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "main.buildVersion") || strings.Contains(stderr, "--version") {
		t.Fatalf("run: exit %d, stderr %q; want 1, one line naming the build version", code, stderr)
	}
}
