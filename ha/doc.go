// Package ha runs several relays per cluster (docs/ha.md): one elected through a Kubernetes Lease
// with client-go's leaderelection, the others warm standbys. It labels the relay's own Pod with
// its role (the Service selects the leader), tells the relay when to lead and when to fence itself
// (relay.Elector), and copies the replicated parts (the escrow, the VPN membership), each under its
// own key prefix, from the leader to every standby over a Noise NNpsk0 channel, in memory only; a
// hold waits for the standbys' acknowledgement (Sync). It never dials Cloudly, never touches a node
// connection, and never logs what it copies.
//
// # Flow
//
//	start:     label the Pod standby, annotate its replication address → compete for the Lease
//	elected:   relabel the previous holder's Pod standby → label leader → the relay leads (dials
//	           Cloudly, admits nodes) → feed standbys
//	renewal:   each successful one extends the tenure to its sending + the renew deadline (the
//	           monotonic clock); the tenure runs out → fence (the relay stops acting, closes
//	           Cloudly) before the Lease can expire for anyone else
//	term end:  fenced or stepping down → client-go's run cancelled, the Lease released →
//	           label standby → Run returns: the relay's process exits, and comes back a standby
//	feed:      a standby's handshake, then its { pod } → its whole state, then every change → acks
//	hold:      the part queues it to every standby → Sync answers once each acknowledged it (1 s)
//	standby:   follow the holder's Pod annotation → copy its records → ready to lead
package ha
