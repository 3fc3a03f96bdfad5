package failover

import (
	"context"
	"io"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// service stands in for the chart's Service on role=leader: a loopback TCP listener that
// forwards each new connection to a Pod labelled relay.serve.zone/role=leader, which it learns
// by watching the Pods through the API, as kube-proxy learns endpoints. With several such Pods it
// takes them in turn, as kube-proxy spreads connections; a Pod that refuses the dial is skipped
// for the next. With none, the connection is closed at once (a Service without endpoints
// rejects). While the API server is away it keeps forwarding to what it saw last, as kube-proxy
// keeps its rules.
type service struct {
	ln     net.Listener         // set at construction
	client kubernetes.Interface // set at construction: the admin's
	ns     string               // set at construction
	cancel context.CancelFunc   // set at construction
	wg     sync.WaitGroup       // the watch loop, the accept loop, every forwarded connection

	mu         sync.Mutex
	pods       map[string]endpoint // guarded by mu: every Pod seen, by name
	turn       int                 // guarded by mu: round-robin position
	conns      map[net.Conn]bool   // guarded by mu: both ends of every forwarded connection
	maxLeaders int                 // guarded by mu: the most Pods labelled leader at once
	noLeader   int                 // guarded by mu: connections closed for want of a leader Pod
}

// endpoint is what the Service stand-in knows of one Pod.
type endpoint struct {
	leader bool
	addr   string // its downstream address (the test's annotation)
}

func startService(t testing.TB, client kubernetes.Interface, ns string) *service {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &service{ln: ln, client: client, ns: ns, cancel: cancel, pods: map[string]endpoint{}, conns: map[net.Conn]bool{}}
	s.wg.Add(2)
	go func() { defer s.wg.Done(); s.watch(ctx) }()
	go func() { defer s.wg.Done(); s.accept() }()
	t.Cleanup(s.close)
	return s
}

// URL is the relays' downstream URL through the Service.
func (s *service) URL() string { return "ws://" + s.ln.Addr().String() + "/" }

func (s *service) close() {
	s.cancel()
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// watch lists the Pods, then follows their changes; when the watch ends (the API server went
// away), it lists again, 100 ms apart, keeping what it knew meanwhile.
func (s *service) watch(ctx context.Context) {
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
			s.mu.Unlock()
		}
		w.Stop()
	}
}

func (s *service) setLocked(pod *corev1.Pod, deleted bool) {
	if deleted || pod.DeletionTimestamp != nil {
		delete(s.pods, pod.Name)
	} else {
		s.pods[pod.Name] = endpoint{leader: pod.Labels[roleLabel] == "leader", addr: pod.Annotations[downstreamAnnotation]}
	}
	n := 0
	for _, e := range s.pods {
		if e.leader {
			n++
		}
	}
	s.maxLeaders = max(s.maxLeaders, n)
}

// leaders is the downstream address of every Pod labelled leader, starting with the one whose
// turn it is.
func (s *service) leaders() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, e := range s.pods {
		if e.leader && e.addr != "" {
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

func (s *service) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.forward(c) }()
	}
}

func (s *service) forward(c net.Conn) {
	var up net.Conn
	for _, addr := range s.leaders() {
		var err error
		if up, err = net.DialTimeout("tcp", addr, time.Second); err == nil {
			break
		}
	}
	if up == nil {
		s.mu.Lock()
		s.noLeader++
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

// MaxLeaders is the most Pods the stand-in saw labelled leader at once.
func (s *service) MaxLeaders() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxLeaders
}

func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
