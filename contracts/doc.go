// Package contracts holds every wire shape, constant, vocabulary and validator the relay speaks,
// and nothing else. It imports only the standard library; every other package of the relay
// imports it. Seed-defined names are spelled exactly as @serve.zone/interfaces spells them;
// project-defined ones (docs/protocol.md#sources-and-conventions) are marked so where they are declared.
//
// # Protocol flow
//
// The relay is the one process of an outbound-only cluster that dials the control plane:
//
//		Cloudly ◄──── one WebSocket (TypedRequest envelopes) ──── relay ◄──── WebSocket ──── Pallet node
//		                                                           │   ◄──── WebSocket ──── cluster ingress
//		                                                           │   ◄──── QUIC + Noise ── node VPN clients
//		                                                           └──── HTTPS ───────────► node Corestores
//
//	 1. The relay dials Cloudly and sends registerCloudlyClientSession { protocol, jwt }. Cloudly
//	    answers with its own offer; the relay negotiates it (NegotiateProtocol).
//	 2. It sends registerClusterRelay (RegisterClusterRelayRequest) with a registrationSequence that
//	    starts at 0 per process. Cloudly answers { protocol, origin? }: the relay is attached. A
//	    refusal named in ClusterRelayUndispatchedRefusals ends its custody of escrowed state.
//	 3. Cloudly pushes pushClusterRelayConfig (ClusterRelayConfig), pushClusterVpnMembership, route
//	    tables and DNS lease renewal runs to hold.
//	 4. Each node dials the relay and sends registerPalletRuntimeSession. The relay reads the
//	    protocol key first (ReadProtocolOffer), negotiates it against RelayOffer, and only then
//	    forwards the body, untouched, to Cloudly; Cloudly's { session, protocol } binds the
//	    connection to session.nodeId. From then on the relay routes Cloudly → node requests by
//	    request.session.nodeId (or request.nodeId) and forwards node → Cloudly requests from that
//	    connection only.
//	 5. When Cloudly is unreachable the relay is detached: it refuses node → Cloudly requests with
//	    relay-upstream-detached, releases escrowed DNS lease renewals whose window is current,
//	    keeps serving the route table it holds, and re-dials with backoff. After re-attaching it
//	    tells every downstream connection pushRelayUpstreamChanged { attached: true }.
//
// # Reading peer bytes
//
// Every body a peer sends is read with the strict reader of package strictjson (contracts holds
// the shapes and rules, strictjson the reading): a repeated key the relay reads, invalid UTF-8 or
// a lone surrogate is refused, so the relay and Cloudly never read one body two ways. Bodies the relay forwards stay raw bytes and are never re-encoded.
//
// Exact where the seeds are exact, tolerant where this project guessed (the reading rule of docs/protocol.md#sources-and-conventions). An
// object shape is read one way, with its fields (strictjson.Req, Opt) in one pass:
//
//   - ReadExact for a seed-spelled shape: one whose keys the seeds spell (a validator, a reader, a
//     binder or a method table). Every member named, nothing else; validators return one named
//     reason per violation and an empty list for a valid body, as the seeds' do.
//   - ReadTolerant for a project-defined shape: the members the relay uses, every other member
//     ignored; only what the relay cannot work without is required.
//
// docs/decisions.md ("Contracts: tolerance sweep") classifies every reader of this package.
//
// # Seed mirrors
//
// Some exports exist only to mirror a seed export, so that Go code (the simulator, tests, a
// future Go peer) reads a seed fact from one place; the relay itself does not call them:
// ClusterIngressEnvironmentNames, ClusterIngressRegistrationRefusalReasons,
// IsClusterIngressRegistrationRefusalReason, ClusterRelayCertificateDomainName,
// ClusterRelayUndispatchedRefusals, HoldRuntimeNetworkDnsLeaseRenewalsRefusals,
// IsolatedRestoreNodeControlRefusals, IsolatedRestoreProgressStatuses, IsolatedRestoreMethods,
// ProtocolIncompatibilities, CreateProtocolOffer, ReadReplicaID, BindIsolatedRestoreProgressToNode,
// BindHoldRuntimeNetworkDnsLeaseRenewalsResponse, and the Validate… functions beside their readers
// (ValidateClusterRelay, ValidateRegisterClusterRelayRequest, ValidateProtocolOffer,
// ValidateProtocolOfferOn, ValidateClusterIngressRegistration,
// ValidateClusterIngressRegistrationRefusal, ValidateClusterIngressRouteTableChange,
// ValidateHoldRuntimeNetworkDnsLeaseRenewalsRequest). Keep them when the relay stops using one.
package contracts
