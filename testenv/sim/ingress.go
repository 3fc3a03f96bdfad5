package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// Ingress is a cluster ingress stand-in: it dials the relay, registers with its bearer, version,
// node id and offer, pulls the route table when the relay hints a newer one, and serves
// getClusterTrafficStatistics from its own day buckets with its own cursor ("o<offset>").
type Ingress struct {
	NodeID       string
	Bearer       contracts.Secret        // the bearer Cloudly minted for the ingress
	Version      string                  // the ingress build (default "3.0.0")
	Offer        contracts.ProtocolOffer // default: the relay's offer
	Capabilities []string                // nil: the key is omitted

	// AutoPull pulls the table when a hint names a newer revision than the one applied, and after
	// a re-registration whose answer names one (default true).
	AutoPull bool
	// AutoReregister registers again when the relay pushes pushRelayUpstreamChanged (default true).
	AutoReregister bool
	// OnHint, when set before Connect, is called with every hinted revision (it must not block).
	OnHint func(revision int64)

	log zerolog.Logger

	mu         sync.Mutex
	conn       *typedsocket.Conn // guarded by mu
	table      json.RawMessage   // guarded by mu: the newest table applied, as received; nil: none
	revision   int64             // guarded by mu: its revision, -1 while none
	hints      newest[int64]     // guarded by mu: the newest revisions hinted, in order
	lastHint   []byte            // guarded by mu: the newest hint's body, as received
	buckets    []json.RawMessage // guarded by mu: the day buckets it serves
	days       []string          // guarded by mu: days[i] is buckets[i]'s dayUtc
	statsErr   error             // guarded by mu: when set, statistics are answered with it
	statsCalls int               // guarded by mu: getClusterTrafficStatistics requests seen

	tables        atomic.Int64   // non-null route tables received
	registrations atomic.Int64   // accepted registrations
	bg            sync.WaitGroup // pulls and re-registrations started by the relay's pushes
}

// NewIngress returns an ingress stand-in for node with the given bearer.
func NewIngress(node, bearer string, log zerolog.Logger) *Ingress {
	return &Ingress{
		NodeID: node, Bearer: contracts.NewSecret(bearer), Version: "3.0.0", Offer: contracts.RelayOffer,
		AutoPull: true, AutoReregister: true, revision: -1,
		log: log.With().Str("component", "sim-ingress").Str("node", node).Logger(),
	}
}

// Connect dials the relay's downstream WebSocket.
func (in *Ingress) Connect(ctx context.Context, url string) error {
	conn, err := dialRelay(ctx, url, in.serve, nil, in.log)
	if err != nil {
		return fmt.Errorf("ingress %s dial relay: %w", in.NodeID, err)
	}
	in.mu.Lock()
	in.conn = conn
	in.mu.Unlock()
	return nil
}

// Conn is the ingress's current connection.
func (in *Ingress) Conn() *typedsocket.Conn {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.conn
}

// Close closes the connection and waits for the work the relay's pushes started.
func (in *Ingress) Close() {
	if c := in.Conn(); c != nil {
		c.CloseNow()
		<-c.Done()
	}
	in.bg.Wait()
}

// Call sends a request to the relay.
func (in *Ingress) Call(ctx context.Context, method string, body json.RawMessage) (json.RawMessage, error) {
	c := in.Conn()
	if c == nil {
		return nil, errors.New("ingress not connected")
	}
	return c.Call(ctx, method, body)
}

// RegistrationBody is the ingress's registerClusterIngress request.
func (in *Ingress) RegistrationBody() json.RawMessage {
	return contracts.EncodeClusterIngressRegistration(contracts.ClusterIngressRegistration{
		Bearer: in.Bearer, Version: in.Version, NodeID: in.NodeID, Capabilities: in.Capabilities, Protocol: in.Offer,
	})
}

// Register sends registerClusterIngress and returns the answer, or the error it was refused with
// (read a named refusal with contracts.ReadClusterIngressRegistrationRefusal on its data).
func (in *Ingress) Register(ctx context.Context) (json.RawMessage, error) {
	resp, err := in.Call(ctx, contracts.MethodRegisterClusterIngress, in.RegistrationBody())
	if err != nil {
		return nil, err
	}
	in.registrations.Add(1)
	return resp, nil
}

// RegisterBackingOff registers as an ingress built from the seeds does: a refusal it can read
// ("Everything else is not a refusal") is waited out before it registers again — an
// IClusterIngressRegistrationRefusal for its retryAfterMs, an IProtocolRefusal for
// refusedOfferRetryIntervalMs — and any other error ends it, since nothing says when to retry.
// wait is how it waits (a test's clock); it returns the accepted answer, the waits it took, in
// order, and the error that ended it.
func (in *Ingress) RegisterBackingOff(ctx context.Context, wait func(context.Context, time.Duration) error) (json.RawMessage, []time.Duration, error) {
	var waits []time.Duration
	for {
		resp, err := in.Register(ctx)
		if err == nil {
			return resp, waits, nil
		}
		var remote *typedsocket.Error
		if !errors.As(err, &remote) {
			return nil, waits, err
		}
		var d time.Duration
		if r, ok := contracts.ReadClusterIngressRegistrationRefusal(remote.Data); ok {
			d = time.Duration(r.RetryAfterMs) * time.Millisecond
		} else if _, ok := contracts.ReadProtocolRefusal(remote.Data); ok {
			d = contracts.RefusedOfferRetryInterval
		} else {
			return nil, waits, fmt.Errorf("ingress %s: a registration error that is no refusal, with no time to retry: %w", in.NodeID, err)
		}
		waits = append(waits, d)
		if err := wait(ctx, d); err != nil {
			return nil, waits, err
		}
	}
}

// Registrations is the number of accepted registrations.
func (in *Ingress) Registrations() int64 { return in.registrations.Load() }

// Pull asks the relay for its route table with the revision already applied, and applies a newer
// one. It returns the table the relay answered (null included).
func (in *Ingress) Pull(ctx context.Context) (contracts.RouteTable, error) {
	in.mu.Lock()
	known := in.revision
	in.mu.Unlock()
	resp, err := in.Call(ctx, contracts.MethodGetClusterIngressRouteTable, contracts.EncodeGetClusterIngressRouteTableRequest(known))
	if err != nil {
		return contracts.RouteTable{}, err
	}
	t, err := contracts.ReadGetClusterIngressRouteTableResponse(resp)
	if err != nil {
		return contracts.RouteTable{}, fmt.Errorf("ingress %s: %w", in.NodeID, err)
	}
	if t.IsNull() {
		return t, nil // none computed yet: nothing to serve, and not an empty table
	}
	in.tables.Add(1)
	in.mu.Lock()
	if t.Revision > in.revision {
		in.table, in.revision = append(json.RawMessage(nil), t.Raw...), t.Revision
	}
	in.mu.Unlock()
	return t, nil
}

// Table is the newest table applied and its revision; ok is false while none is.
func (in *Ingress) Table() (table json.RawMessage, revision int64, ok bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.table, in.revision, in.table != nil
}

// TablesReceived counts the non-null route tables the relay answered.
func (in *Ingress) TablesReceived() int64 { return in.tables.Load() }

// Hints returns the revisions the relay hinted, in order: the newest 64.
func (in *Ingress) Hints() []int64 {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.hints.all()
}

// LastHint is the newest hint's body exactly as the relay sent it.
func (in *Ingress) LastHint() []byte {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.lastHint
}

// SetStatistics replaces the day buckets the ingress serves.
func (in *Ingress) SetStatistics(buckets []contracts.ClusterTrafficStatistics) {
	raw := make([]json.RawMessage, len(buckets))
	days := make([]string, len(buckets))
	for i, b := range buckets {
		raw[i], _ = json.Marshal(b)
		days[i] = b.DayUTC
	}
	in.mu.Lock()
	in.buckets, in.days = raw, days
	in.mu.Unlock()
}

// FailStatistics makes the ingress answer statistics requests with err (nil: serve them again).
func (in *Ingress) FailStatistics(err error) {
	in.mu.Lock()
	in.statsErr = err
	in.mu.Unlock()
}

// StatisticsRequests is how many getClusterTrafficStatistics requests reached the ingress.
func (in *Ingress) StatisticsRequests() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.statsCalls
}

func (in *Ingress) serve(c *typedsocket.Conn, req *typedsocket.Request) {
	switch req.Method {
	case contracts.MethodPushClusterIngressRouteTableChanged:
		rev, ok := contracts.ReadClusterIngressRouteTableChange(req.Body)
		if !ok {
			req.Fail(contracts.RelayRequestInvalid.Refuse("%s", contracts.ValidateClusterIngressRouteTableChange(req.Body, "")[0]))
			return
		}
		in.mu.Lock()
		in.hints.add(rev)
		in.lastHint = append([]byte(nil), req.Body...)
		newer := rev > in.revision
		in.mu.Unlock()
		req.Respond(json.RawMessage(`{}`))
		if in.OnHint != nil {
			in.OnHint(rev)
		}
		if newer && in.AutoPull {
			in.background(c, func(ctx context.Context) error { _, err := in.Pull(ctx); return err })
		}
	case contracts.MethodGetClusterTrafficStatistics:
		body, err := in.statistics(req.Body)
		req.Answer(typedsocket.Reply{Response: body, Err: err})
	case contracts.MethodPushRelayUpstreamChanged:
		req.Respond(json.RawMessage(`{}`))
		if in.AutoReregister {
			in.background(c, in.reregister)
		}
	default:
		req.Fail(contracts.RelayMethodUnknown.Refuse("%s", req.Method))
	}
}

// reregister registers again after the relay re-attached and pulls when Cloudly's answer names a
// newer revision than the one applied.
func (in *Ingress) reregister(ctx context.Context) error {
	resp, err := in.Register(ctx)
	if err != nil {
		return err
	}
	raw, _, _ := strictjson.Lookup(resp, "revision")
	rev, ok := strictjson.ReadCounter(raw)
	in.mu.Lock()
	newer := ok && rev > in.revision
	in.mu.Unlock()
	if newer && in.AutoPull {
		_, err = in.Pull(ctx)
	}
	return err
}

// background runs f for the connection c, bounded by c's life and the call timeout.
func (in *Ingress) background(c *typedsocket.Conn, f func(ctx context.Context) error) {
	in.bg.Add(1)
	go func() {
		defer in.bg.Done()
		ctx, cancel := context.WithTimeout(c.Context(), typedsocket.DefaultCallTimeout)
		defer cancel()
		if err := f(ctx); err != nil {
			in.log.Debug().Err(err).Msg("background step failed")
		}
	}()
}

// statistics answers one page from the ingress's buckets within the requested days. Its cursor is
// "o" and the offset into those buckets.
func (in *Ingress) statistics(body json.RawMessage) (json.RawMessage, error) {
	req, err := contracts.ReadGetClusterTrafficStatisticsRequest(body)
	if err != nil {
		return nil, contracts.RelayRequestInvalid.Refuse("%v", err)
	}
	in.mu.Lock()
	in.statsCalls++
	serr := in.statsErr
	var sel []json.RawMessage
	for i, b := range in.buckets {
		if in.days[i] >= req.FromDayUTC && in.days[i] <= req.ToDayUTC {
			sel = append(sel, b)
		}
	}
	in.mu.Unlock()
	if serr != nil {
		return nil, serr
	}
	off := 0
	if req.Cursor != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(req.Cursor, "o"))
		if !strings.HasPrefix(req.Cursor, "o") || err != nil || n < 0 || n > len(sel) {
			return nil, contracts.RelayRequestInvalid.Refuse("cursor is not one this ingress minted")
		}
		off = n
	}
	end := min(off+req.Limit, len(sel))
	out := []byte(`{"statistics":[`)
	for i, b := range sel[off:end] {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, b...)
	}
	out = append(out, ']')
	if end < len(sel) {
		out = append(strconv.AppendInt(append(out, `,"nextCursor":"o`...), int64(end), 10), '"')
	}
	return append(out, '}'), nil
}
