package daemon

import (
	"path/filepath"
	"testing"
)

// An elected relay needs its Pod's name, namespace and address from the downward API; without
// any of them it would neither label its Pod nor replicate, so `relay run` (and `relay check`)
// refuse to start: exit 2, one line naming every one missing.
func TestHAWithoutPodEnvironmentRefusesToStart(t *testing.T) {
	key := filepath.Join(t.TempDir(), "replication.key")
	if err := WriteReplicationKey(key); err != nil {
		t.Fatal(err)
	}
	const head = "--ha-lease-name needs the Pod's POD_NAME, POD_NAMESPACE and POD_IP from the downward API (the chart sets them); missing: "
	for _, c := range []struct {
		name string
		env  map[string]string
		want string // "" : accepted
	}{
		{"none", map[string]string{"POD_NAME": "", "POD_NAMESPACE": "", "POD_IP": ""}, "POD_NAME, POD_NAMESPACE, POD_IP"},
		{"no address", map[string]string{"POD_NAME": "relay-0", "POD_NAMESPACE": "ns", "POD_IP": ""}, "POD_IP"},
		{"name only", map[string]string{"POD_NAME": "relay-0", "POD_NAMESPACE": "", "POD_IP": ""}, "POD_NAMESPACE, POD_IP"},
		{"all", map[string]string{"POD_NAME": "relay-0", "POD_NAMESPACE": "ns", "POD_IP": "10.0.0.7"}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, cmd := range []string{"run", "check"} {
				code, _, stderr := runMain(t, c.env, runArgs(t, cmd, "--ha-lease-name", "relay", "--ha-lease-namespace", "ns",
					"--ha-replication-key-file", key)...)
				if c.want == "" {
					if cmd == "check" && code != 0 {
						t.Fatalf("relay check: exit %d, stderr %q; want 0", code, stderr)
					}
					continue
				}
				if want := "relay " + cmd + ": " + head + c.want + "\n"; code != 2 || stderr != want {
					t.Fatalf("relay %s: exit %d, stderr %q; want 2 and %q", cmd, code, stderr, want)
				}
			}
		})
	}
}
