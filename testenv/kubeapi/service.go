package kubeapi

import (
	"context"
	"io"
	"net"
	"net/netip"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// Service stands in for a Service that selects the Pods carrying one label value (the chart's
// Service on role=leader): a loopback TCP listener that forwards each new connection to a
// selected Pod, which it learns by watching the Pods through the API, as kube-proxy learns
// endpoints. A Pod whose Ready condition is False (SetPodReady: its container died) is not
// selected, as an EndpointSlice serves only ready endpoints. With several selected it takes them in turn, as kube-proxy spreads connections; a
// Pod that refuses the dial is skipped for the next. With none, the connection is closed at once
// (a Service without endpoints rejects). While the API server is away it keeps forwarding to what
// it saw last, as kube-proxy keeps its rules. With WithUDP it carries a UDP port as well (the
// hub's; service_udp.go). The HA tests and `relay-dev --replicas` use it.
type Service struct {
	ln           net.Listener                     // set at construction
	client       kubernetes.Interface             // set at construction: one that may list and watch Pods
	ns           string                           // set at construction
	label, value string                           // set at construction: the selector
	addr         func(*corev1.Pod) (string, bool) // set at construction: a selected Pod's TCP address
	cancel       context.CancelFunc               // set at construction
	udp          *udpPort                         // set at construction: the UDP port; nil: TCP only
	wg           sync.WaitGroup                   // the watch loop, the accept loop, every forwarded connection

	mu       sync.Mutex
	pods     map[string]endpoint // guarded by mu: every Pod seen, by name
	turn     int                 // guarded by mu: round-robin position
	conns    map[net.Conn]bool   // guarded by mu: both ends of every forwarded connection
	most     int                 // guarded by mu: the most Pods selected at once
	rejected int                 // guarded by mu: connections closed for want of a selected Pod
	udpEnds  []netip.AddrPort    // guarded by mu: the selected Pods' UDP addresses, sorted
	udpEpoch uint64              // guarded by mu: counts the changes of udpEnds
}

// endpoint is what the Service knows of one Pod.
type endpoint struct {
	selected bool
	addr     string         // "" when addr did not know it
	udp      netip.AddrPort // invalid when the UDP port is off or its addr did not know it
}

// ServiceOption configures StartService.
type ServiceOption func(*serviceOptions)

type serviceOptions struct {
	udp func(*corev1.Pod) (netip.AddrPort, bool)
}

// WithUDP adds a UDP port to the Service, forwarding to each selected Pod at the address addr
// gives it (service_udp.go).
func WithUDP(addr func(*corev1.Pod) (netip.AddrPort, bool)) ServiceOption {
	return func(o *serviceOptions) { o.udp = addr }
}

// StartService listens on a loopback port and forwards to the Pods of ns labelled label=value, at
// the address addr gives each.
func StartService(client kubernetes.Interface, ns, label, value string, addr func(*corev1.Pod) (string, bool), opts ...ServiceOption) (*Service, error) {
	var o serviceOptions
	for _, opt := range opts {
		opt(&o)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{ln: ln, client: client, ns: ns, label: label, value: value, addr: addr, cancel: cancel,
		pods: map[string]endpoint{}, conns: map[net.Conn]bool{}}
	if o.udp != nil {
		if s.udp, err = listenUDP(s, o.udp); err != nil {
			ln.Close()
			cancel()
			return nil, err
		}
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.udp.serve() }()
	}
	s.wg.Add(2)
	go func() { defer s.wg.Done(); s.watch(ctx) }()
	go func() { defer s.wg.Done(); s.accept() }()
	return s, nil
}

// URL is the WebSocket URL of the Service's listener.
func (s *Service) URL() string { return "ws://" + s.ln.Addr().String() + "/" }

// Close stops the Service and ends every connection it forwards.
func (s *Service) Close() {
	s.cancel()
	s.ln.Close()
	if s.udp != nil {
		s.udp.close()
	}
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// Selected is the names of the Pods selected now, sorted.
func (s *Service) Selected() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for name, e := range s.pods {
		if e.selected {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// MostSelected is the most Pods the Service saw selected at once.
func (s *Service) MostSelected() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.most
}

// watch lists the Pods, then follows their changes; when the watch ends (the API server went
// away), it lists again, 100 ms apart, keeping what it knew meanwhile.
func (s *Service) watch(ctx context.Context) {
	pods := s.client.CoreV1().Pods(s.ns)
	for ctx.Err() == nil {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		list, err := pods.List(lctx, metav1.ListOptions{})
		cancel()
		if err != nil {
			pause(ctx, 100*time.Millisecond)
			continue
		}
		s.mu.Lock()
		s.pods = map[string]endpoint{}
		for i := range list.Items {
			s.setLocked(&list.Items[i], false)
		}
		s.udpChangedLocked()
		s.mu.Unlock()
		w, err := pods.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
		if err != nil {
			pause(ctx, 100*time.Millisecond)
			continue
		}
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				break // an error event: list again
			}
			s.mu.Lock()
			s.setLocked(pod, ev.Type == watch.Deleted)
			s.udpChangedLocked()
			s.mu.Unlock()
		}
		w.Stop()
	}
}

func (s *Service) setLocked(pod *corev1.Pod, deleted bool) {
	if deleted || pod.DeletionTimestamp != nil {
		delete(s.pods, pod.Name)
	} else {
		e := endpoint{selected: pod.Labels[s.label] == s.value && !markedUnready(pod)}
		if a, ok := s.addr(pod); ok {
			e.addr = a
		}
		if s.udp != nil {
			if a, ok := s.udp.addr(pod); ok {
				e.udp = a
			}
		}
		s.pods[pod.Name] = e
	}
	n := 0
	for _, e := range s.pods {
		if e.selected {
			n++
		}
	}
	s.most = max(s.most, n)
}

// markedUnready reports a Pod whose Ready condition is False: its EndpointSlice endpoint is not
// ready, and kube-proxy forwards nothing to it. A Pod without the condition (as the tests create
// them) counts as ready.
func markedUnready(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionFalse
		}
	}
	return false
}

// endpoints is the address of every selected Pod, starting with the one whose turn it is.
func (s *Service) endpoints() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, e := range s.pods {
		if e.selected && e.addr != "" {
			out = append(out, e.addr)
		}
	}
	sort.Strings(out)
	if len(out) > 1 {
		s.turn++
		k := s.turn % len(out)
		out = append(out[k:], out[:k]...)
	}
	return out
}

func (s *Service) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.forward(c) }()
	}
}

func (s *Service) forward(c net.Conn) {
	var up net.Conn
	for _, addr := range s.endpoints() {
		var err error
		if up, err = net.DialTimeout("tcp", addr, time.Second); err == nil {
			break
		}
	}
	if up == nil {
		s.mu.Lock()
		s.rejected++
		s.mu.Unlock()
		c.Close()
		return
	}
	s.mu.Lock()
	s.conns[c], s.conns[up] = true, true
	s.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) { io.Copy(dst, src); done <- struct{}{} }
	go pipe(up, c)
	go pipe(c, up)
	<-done // either side ended: end both, as a TCP connection through a dead endpoint does
	c.Close()
	up.Close()
	<-done
	s.mu.Lock()
	delete(s.conns, c)
	delete(s.conns, up)
	s.mu.Unlock()
}

func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
