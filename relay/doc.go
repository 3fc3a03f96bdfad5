// Package relay is the cluster relay's core: the one upstream Cloudly session, the downstream
// listener that carries every node's runtime session and the cluster ingress over it, and routing
// between the two. The admin listener and the status page are package status, which reads the
// Snapshot the core fills. It owns connection state and routing; it never signs,
// verifies or mints anything, and it forwards bodies untouched.
//
// # Flow
//
//	upstream.run:  dial Cloudly → registerCloudlyClientSession → registerClusterRelay → attached
//	               … socket lost → detached → backoff (250 ms → 30 s, full jitter; 300 s after a
//	               protocol refusal) → dial again
//	downstream:    node connects → registerPalletRuntimeSession (offer judged here, then forwarded)
//	               → bound to session.nodeId → node → Cloudly requests forwarded from that
//	               connection only; Cloudly → node requests routed by session.nodeId or nodeId
//
// Every connection is a typedsocket.Conn: one read loop dispatching requests in order and one
// send loop draining a bounded queue, so a slow node gets relay-node-busy and never slows Cloudly's
// socket or another node.
//
// # Where things are
//
//	relay.go       Relay wires the upstream, the downstream and the parts; serve.go runs and
//	               stops them; snapshot.go fills the status page's Snapshot and /readyz
//	features.go    the feature table: the parts (package feature's small interfaces, each found
//	               once, at New) and, with dispatch.go, which handler serves each method
//	methods.go     the method table: per method, the side it is served from, the refusal when
//	               its part is off, whether it decides a connection's role
//	dispatch.go    one handler map per side, built from the table and the parts at New;
//	               forwarding is the fallback
//	upstream.go    one Cloudly session behind upstreamHooks; attach.go dials and registers one
//	               socket; cloudly.go is the relay's side of it, custody.go whether Cloudly
//	               dispatches to the relay
//	downstream.go  behind downstreamHooks, the downstream's own state: connections, the nodes
//	               they carry, the bounds on unregistered connections and the peer memory
//	               budget; peer.go one connection
//	bind.go, route.go, streams.go  registrations, forwarding either way, VirtualStreams
package relay
