// Package quicsock is the UDP socket the VPN hub and its client give quic-go. It does two things
// quic-go does not do for DATAGRAM traffic.
//
// It moves datagrams between quic-go and the kernel in batches (send.go, receive.go). quic-go
// writes one packet per system call, and a QUIC packet carrying a DATAGRAM never reaches the full
// size its own GSO batching needs, so without this every forwarded packet costs a sendmsg(2) of
// its own. Writes are copied into a batch and return at once; one flusher goroutine sends a batch
// with one sendmmsg(2), a run of equal-sized datagrams to one address (the full-sized segments of
// a TCP flow through the tunnel) as one UDP GSO message. Reads enable UDP GRO, so the kernel hands
// such a run over in one buffer, which is split back into quic-go's packets.
//
// And it keeps quic-go's datagram receive queue from overflowing (flow.go). quic-go v0.65 holds
// at most 128 received DATAGRAM frames per connection and drops beyond, and its connection
// goroutine fills that queue in bursts the application's reader cannot always be scheduled in
// time to empty: on a busy machine most of the hub's losses were there. So the reader counts, per
// remote address the application registered as a Flow, the packets it handed to quic-go and not
// yet drained (Flow.Drained), and stops handing over a flow's packets while Window are
// outstanding: the backlog waits in the kernel's socket buffer, which is large, instead of being
// dropped in quic-go's queue, which is not.
//
// A send error drops the datagram, as the network would: quic-go's loss detection sees it. A socket
// holds about 1 MiB of buffers: two batches of 128 datagrams to send, eight 64 KiB receive
// buffers.
package quicsock
