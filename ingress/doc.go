// Package ingress serves the cluster ingress through the relay (docs/protocol.md#cluster-ingress): ingress registration
// forwarding, isolation by authorization, the route table held in memory and served to the
// ingress, change hints, and traffic statistics fanned out to every ingress connection.
//
// It owns which downstream connections are accepted ingress connections, the newest route table
// and the statistics cursor. It never stores a bearer, never logs a registration or a table, never
// writes a table anywhere but memory, and never judges what Cloudly judges (the bearer, the
// designation, the node): it forwards those bodies untouched.
//
// # Protocol flow
//
//	ingress ──registerClusterIngress { bearer, version, nodeId, capabilities?, protocol }──► relay
//	   relay: read the offer as data, negotiate it against the relay's own (a mismatch is the
//	          IProtocolRefusal; Cloudly sees nothing), check the shape, then forward untouched
//	relay ──registerClusterIngress (same bytes)──► Cloudly
//	   Cloudly answers { accepted: true, revision | null, protocol } → the connection is now the
//	          ingress of that node; or an IClusterIngressRegistrationRefusal in the error's data →
//	          forwarded untouched, the connection stays (or becomes again) a plain connection
//
//	relay ──getClusterRouteTable {}──► Cloudly                 on every attach
//	Cloudly ──pushClusterRouteTable { table }──► relay          whenever Cloudly computes one
//	   a table is applied only when its revision is newer; { appliedRevision } is the one held
//	relay ──pushClusterIngressRouteTableChanged { revision }──► every ingress   after each newer table
//	ingress ──getClusterIngressRouteTable { knownRevision }──► relay  → { table | null }, the table held
//
//	Cloudly ──getClusterTrafficStatistics { fromDayUtc, toDayUtc, cursor?, limit }──► relay
//	   relay: split limit across the ingress connections, ask each from where it stopped, merge
//	          the day buckets, and answer { statistics, nextCursor? } with a cursor holding every
//	          ingress's own position
//
// Every other connection, a Pallet node's included, is refused getClusterIngressRouteTable with
// relay-ingress-only and is never asked for statistics.
package ingress
