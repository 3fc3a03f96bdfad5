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
// socket or another node. Features (escrow, ingress, restore, the VPN hub, registry forwarding)
// plug in through the small interfaces in features.go.
package relay
