package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// HTTP bounds of the admin listener: headers in 10 s and 16 KiB, idle connections closed after
// 60 s, at most maxRequests served at once.
const (
	headerTimeout  = 10 * time.Second
	idleTimeout    = 60 * time.Second
	maxHeaderBytes = 16 << 10
	maxRequests    = 16 // served at once; more are answered 503
)

// Config is what a Server is told.
type Config struct {
	Listen string // --admin-listen: host:port
	Pprof  bool   // --admin-pprof: net/http/pprof under /debug/pprof/
	// Source is the relay core the page and /readyz read.
	Source Source
	// Registry is served on /metrics, and its relay_* counters listed on the page.
	Registry *prometheus.Registry
	Logger   zerolog.Logger // the admin component's
	// Now is the clock the page is read on (its now, the uptime); nil is time.Now.
	Now func() time.Time
}

// Server is the admin listener. Listen binds it; Serve serves it until Shutdown.
type Server struct {
	cfg      Config               // set at construction
	registry *prometheus.Registry // set at construction
	started  time.Time            // set at construction: the page's uptime counts from it
	rates    counterRates         // samples of the counters for the page's rates
	srv      *http.Server         // set at construction

	mu sync.Mutex
	ln net.Listener // guarded by mu: set by Listen
}

// New makes the admin server; nothing is bound yet.
func New(cfg Config) *Server {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Server{cfg: cfg, registry: cfg.Registry, started: cfg.Now()}
	if s.registry == nil {
		s.registry = prometheus.NewRegistry()
	}
	s.srv = &http.Server{Handler: capRequests(s.Handler(), maxRequests), ReadHeaderTimeout: headerTimeout,
		IdleTimeout: idleTimeout, MaxHeaderBytes: maxHeaderBytes, ErrorLog: stdLogger(cfg.Logger)}
	return s
}

// Listen binds the admin listener.
func (s *Server) Listen() error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("admin listen %s: %w", s.cfg.Listen, err)
	}
	s.mu.Lock()
	s.ln = ln
	s.mu.Unlock()
	return nil
}

// Addr is the bound address (after Listen); nil before.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// Serve serves the bound listener, and samples the counters for their rates, until Shutdown; ctx
// ends only the sampling.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	ln := s.ln
	s.mu.Unlock()
	if ln == nil {
		return errors.New("admin: Serve before Listen")
	}
	ctx, stop := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() { defer close(sampled); s.sampleCounters(ctx) }()
	defer func() { stop(); <-sampled }()
	err := s.srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Shutdown stops the listener and waits, until ctx ends, for the requests being served.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// Close closes the listener without serving it (a relay that fails after Listen).
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Close()
}

// Handler serves /healthz (the process is alive), /readyz (the Source's readiness; the body says
// why not), /metrics, /status and /status.json, and with Config.Pprof net/http/pprof under
// /debug/pprof/.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		line, err := s.cfg.Source.Ready()
		if err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, line)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /status", s.servePage)
	mux.HandleFunc("GET /status.json", s.serveJSON)
	if s.cfg.Pprof {
		// The profiles say what the relay does, not what it carries; the admin listener is on
		// loopback by default, and this is off unless asked for.
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// snapshot is the Source's snapshot with the server's own facts: the uptime, the bound admin
// address and the counters.
func (s *Server) snapshot() Snapshot {
	now := s.cfg.Now()
	st := s.cfg.Source.Snapshot(now)
	st.Now, st.Started = now, s.started
	st.UptimeSeconds = int64(now.Sub(s.started) / time.Second)
	if a := s.Addr(); a != nil {
		st.Addresses.Admin = a.String()
	}
	families, _ := gatherCounters(s.registry)
	st.Counters = s.rates.counterGroups(now, families)
	return st
}

func (s *Server) serveJSON(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(s.snapshot())
}

// capRequests serves at most n requests at once; more are answered 503 at once.
func capRequests(h http.Handler, n int) http.Handler {
	slots := make(chan struct{}, n)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
			h.ServeHTTP(w, req)
		default:
			w.Header().Set("Retry-After", "1")
			http.Error(w, "too many admin requests at once", http.StatusServiceUnavailable)
		}
	})
}

// stdLogger routes net/http's internal log lines to the admin logger at debug level.
func stdLogger(l zerolog.Logger) *log.Logger { return log.New(levelWriter{l}, "", 0) }

type levelWriter struct{ l zerolog.Logger }

func (w levelWriter) Write(p []byte) (int, error) {
	n := len(p)
	for n > 0 && p[n-1] == '\n' {
		n--
	}
	w.l.Debug().Msg(string(p[:n]))
	return len(p), nil
}
