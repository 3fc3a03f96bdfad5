package daemon

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"code.foss.global/serve.zone/relay/relay"
)

// cmdProbe is `relay probe`: GET the admin listener's /healthz, exit 0 on 200 and 1 otherwise —
// a HEALTHCHECK for an image that has no shell or curl. The address is the one `relay run`
// reads: --admin-listen, or SERVEZONE_RELAY_ADMIN_LISTEN, so a container's probe finds its
// relay without being told twice; a wildcard host is probed on loopback.
func cmdProbe(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	admin := fs.String("admin-listen", relay.DefaultAdminListen, "the relay's admin listen address, probed at /healthz")
	url := fs.String("url", "", "the URL to probe instead (http://127.0.0.1:9464/healthz)")
	timeout := fs.Duration("timeout", 3*time.Second, "how long the answer may take")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	if *timeout <= 0 {
		return Usagef("--timeout: must be positive")
	}
	target := *url
	if target == "" {
		host, port, err := net.SplitHostPort(*admin)
		if err != nil {
			return Usagef("--admin-listen=%q: must be host:port or :port", *admin)
		}
		if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
			host = "127.0.0.1"
		}
		target = "http://" + net.JoinHostPort(host, port) + "/healthz"
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return Usagef("--url=%q: %v", target, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", target, err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", target, resp.Status)
	}
	fmt.Fprintf(stdout, "relay probe: %s: %s\n", target, resp.Status)
	return nil
}
