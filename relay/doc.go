// Package relay is the cluster relay's core: the one upstream Cloudly session, the downstream
// listener that carries every node's runtime session and the cluster ingress over it, routing
// between the two, and the admin listener. It owns connection state and routing; it never signs,
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
//	features.go  the seams: Feature (methods a part serves), Observer (what it hears), Component
//	             (what the relay runs); escrow, ingress, restore, the VPN hub and registry
//	             forwarding implement them without importing this package
//	dispatch.go  one table per side, method → handler, built at New; forwarding is the fallback
//	upstream.go  one Cloudly session behind upstreamHost; cloudly.go is the relay's side of it,
//	             custody.go whether Cloudly dispatches to the relay
//	listener.go, peer.go, bind.go, route.go, streams.go  the downstream connections: upgrade and
//	             limits, peer state and the memory budget, registrations, forwarding, streams
package relay
