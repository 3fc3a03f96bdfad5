package interop

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
)

// BinEnv names a relay binary to run instead of building one from this tree (the lead points
// the suite at another build with it).
const BinEnv = "RELAY_INTEROP_BIN"

// RelayBinary is the relay the suite runs: $RELAY_INTEROP_BIN when set, else `go build
// ./cmd/relay` of the module around dir (the interop directory) into outDir.
func RelayBinary(ctx context.Context, dir, outDir string) (string, error) {
	if bin := os.Getenv(BinEnv); bin != "" {
		abs, err := filepath.Abs(bin)
		if err != nil {
			return "", err
		}
		if _, err := os.Stat(abs); err != nil {
			return "", fmt.Errorf("interop: %s: %w", BinEnv, err)
		}
		return abs, nil
	}
	bin := filepath.Join(outDir, "relay")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/relay")
	cmd.Dir = filepath.Dir(dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("interop: go build ./cmd/relay: %v\n%s", err, out)
	}
	return bin, nil
}

// Relay is a running relay process: plaintext on loopback, dialling Cloudly.
type Relay struct {
	Listen string // downstream address, host:port
	Admin  string // admin address, host:port

	cmd    *exec.Cmd
	log    *Tail
	exited chan struct{} // closed when the process has exited
	err    error         // set before exited closes
}

// RelayConfig is what StartRelay passes on the relay's command line.
type RelayConfig struct {
	Bin        string // the binary
	CloudlyURL string // ws:// URL of Cloudly
	ClusterID  string // --cluster-id; must be what Cloudly's configuration push names
	Token      string // the machine JWT Cloudly accepts, written to a file in WorkDir
	WorkDir    string // where the token file (and the hub's key file) go
	// HubListen is --hub-listen, IPv4:port ("": the hub is off). The relay reports the hub to
	// Cloudly with registerClusterVpnHub after it attaches; HubAddress finds an address to bind.
	HubListen string
}

// StartRelay runs `relay run` against cfg.CloudlyURL and waits until it serves.
func StartRelay(ctx context.Context, cfg RelayConfig) (*Relay, error) {
	token := filepath.Join(cfg.WorkDir, "cloudly.jwt")
	if err := os.WriteFile(token, []byte(cfg.Token), 0o600); err != nil {
		return nil, err
	}
	args := []string{"run",
		"--cluster-id", cfg.ClusterID, "--node-id", "relay-node",
		"--cloudly-url", cfg.CloudlyURL, "--cloudly-token-file", token,
		"--advertise-address", "192.0.2.10", "--insecure-plaintext",
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--log-format", "json", "--log-level", "info"}
	if cfg.HubListen != "" {
		args = append(args, "--hub-listen", cfg.HubListen, "--hub-key-file", filepath.Join(cfg.WorkDir, "hub.key"))
	}
	cmd := exec.Command(cfg.Bin, args...)
	dieWithParent(cmd)
	r := &Relay{cmd: cmd, log: NewTail(256 << 10), exited: make(chan struct{})}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("interop: start relay: %w", err)
	}
	serving := make(chan struct{})
	go func() {
		defer func() {
			r.err = cmd.Wait()
			close(r.exited)
		}()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		announced := false
		for sc.Scan() {
			line := sc.Bytes()
			r.log.Write(append(line, '\n'))
			if announced {
				continue
			}
			var ev struct {
				Message string `json:"message"`
				Listen  string `json:"listen"`
				Admin   string `json:"admin"`
			}
			if json.Unmarshal(line, &ev) == nil && ev.Message == "relay serving" {
				r.Listen, r.Admin, announced = ev.Listen, ev.Admin, true
				close(serving)
			}
		}
		io.Copy(io.Discard, stderr)
	}()
	select {
	case <-serving:
		return r, nil
	case <-r.exited:
		return nil, fmt.Errorf("interop: relay exited at start (%v): %s", r.err, r.log.String())
	case <-ctx.Done():
		r.Stop()
		return nil, fmt.Errorf("interop: relay did not start serving: %w", ctx.Err())
	}
}

// URL is the downstream WebSocket URL nodes dial.
func (r *Relay) URL() string { return "ws://" + r.Listen + "/" }

// Log is the end of the relay's log.
func (r *Relay) Log() string { return r.log.String() }

// Alive reports whether the process runs and answers /healthz.
func (r *Relay) Alive() error {
	select {
	case <-r.exited:
		return fmt.Errorf("relay exited: %v", r.err)
	default:
	}
	return r.get("/healthz")
}

// Ready reports whether the relay answers /readyz with 200 (attached to Cloudly).
func (r *Relay) Ready() error { return r.get("/readyz") }

func (r *Relay) get(path string) error {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + r.Admin + path)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", path, resp.Status)
	}
	return nil
}

// Metrics reads the relay's /metrics into name → value for unlabelled series (and the sum over
// labels for labelled ones).
func (r *Relay) Metrics() (map[string]float64, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + r.Admin + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	m := make(map[string]float64)
	for _, line := range bytes.Split(body, []byte("\n")) {
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		name, value, ok := bytes.Cut(line, []byte(" "))
		if !ok {
			continue
		}
		if i := bytes.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
		}
		if v, err := strconv.ParseFloat(string(bytes.TrimSpace(value)), 64); err == nil {
			m[string(name)] += v
		}
	}
	return m, nil
}

// Sample reads one series of the relay's /metrics by its exact text, labels included
// (`relay_upstream_hub_reports_total{outcome="accepted"}`); ok is false when it is not there.
func (r *Relay) Sample(series string) (value float64, ok bool, err error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + r.Admin + "/metrics")
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, false, err
	}
	for _, line := range bytes.Split(body, []byte("\n")) {
		if v, found := bytes.CutPrefix(line, []byte(series+" ")); found {
			f, err := strconv.ParseFloat(string(bytes.TrimSpace(v)), 64)
			return f, err == nil, err
		}
	}
	return 0, false, nil
}

// HubReport is the relay's newest VPN hub report as /status.json shows it (cloudly.hubReport);
// Outcome is "" when it shows none.
type HubReport struct {
	Outcome  string    `json:"outcome"`
	At       time.Time `json:"at"`
	Sequence int64     `json:"sequence"`
}

// HubReport reads /status.json's cloudly.hubReport.
func (r *Relay) HubReport() (HubReport, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + r.Admin + "/status.json")
	if err != nil {
		return HubReport{}, err
	}
	defer resp.Body.Close()
	var st struct {
		Cloudly struct {
			HubReport *HubReport `json:"hubReport"`
		} `json:"cloudly"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return HubReport{}, fmt.Errorf("/status.json: %w", err)
	}
	if st.Cloudly.HubReport == nil {
		return HubReport{}, nil
	}
	return *st.Cloudly.HubReport, nil
}

// HubAddress is an address of this host the relay's hub can bind for the suite: the first IPv4
// address of an interface that is up that --hub-listen accepts (unicast, neither loopback nor
// link-local). The hub is never dialled in the suite; it only has to bind, so that the relay
// reports it.
func HubAddress() (netip.Addr, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return netip.Addr{}, err
	}
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			p, err := netip.ParsePrefix(a.String())
			if err == nil && p.Addr().Is4() && contracts.IsPlausibleUnicastIPv4(p.Addr().String()) {
				return p.Addr(), nil
			}
		}
	}
	return netip.Addr{}, errors.New("interop: this host has no unicast IPv4 address outside loopback and link-local for the relay's hub to bind")
}

// RSS is the process's resident set size in bytes (VmRSS).
func (r *Relay) RSS() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", r.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) == 2 && f[1] == "kB" {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb << 10, err
			}
		}
	}
	return 0, errors.New("no VmRSS in /proc status")
}

// Stop ends the relay with SIGTERM, and kills it after 10 s.
func (r *Relay) Stop() {
	select {
	case <-r.exited:
		return
	default:
	}
	r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.exited:
	case <-time.After(10 * time.Second):
		r.cmd.Process.Kill()
		<-r.exited
	}
}
