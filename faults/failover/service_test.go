package failover

import (
	"context"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"code.foss.global/serve.zone/relay/testenv/kubeapi"
)

// startService stands in for the chart's Service on role=leader (kubeapi.Service), reaching each
// Pod at the downstream address the test annotated it with, and at its VPN hub's UDP address when
// it runs one; it is closed when the test ends.
func startService(t testing.TB, client kubernetes.Interface, ns string) *kubeapi.Service {
	t.Helper()
	s, err := kubeapi.StartService(client, ns, roleLabel, "leader", func(p *corev1.Pod) (string, bool) {
		a, ok := p.Annotations[downstreamAnnotation]
		return a, ok && a != ""
	}, kubeapi.WithUDP(func(p *corev1.Pod) (netip.AddrPort, bool) {
		a, err := netip.ParseAddrPort(p.Annotations[hubAnnotation])
		return a, err == nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
