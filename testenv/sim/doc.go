// Package sim holds the real protocol peers the relay talks to — a Cloudly stand-in, Pallet nodes,
// (as their issues land) the cluster ingress, a Corestore and VPN clients — speaking the same
// wire protocol over loopback sockets. Tests, `relay-dev` and the benchmarks share them; nothing
// here mocks the relay's own internals.
package sim
