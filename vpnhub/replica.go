package vpnhub

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"code.foss.global/serve.zone/relay/contracts"
)

// The membership as an HA leader copies it to its standbys (feature.Replicated), in memory only,
// so that a standby's hub holds it the moment its relay leads: Cloudly pushes the membership to
// the leader alone, and need not push again after a failover. Every key starts with "vpn/":
//
//	vpn/membership    the header: generation (8 bytes) ‖ chunk count (2) ‖ control prefix
//	                  (4-byte address ‖ 1-byte length) ‖ authority id
//	vpn/members/<i>   chunk i, 0 ≤ i < count: generation (8) ‖ member count (2, 1…1024) ‖ that
//	                  many members, each public key (32) ‖ control address (4) ‖ expiresAt (8,
//	                  Unix ms) ‖ node id length (1) ‖ node id
//
// All integers big-endian. The members are cut into chunks of at most 1024, in the push's order,
// so that no record is larger than about 180 KiB however large the membership (a push may hold
// 65536 members). A change sends the chunks first and the header last, then removes the chunks
// past the new count. A standby keeps what it is sent apart from the membership it serves, and
// installs a membership only once the header and every chunk it counts carry the same
// generation; until then it keeps the last whole one. The records are read strictly: exact
// lengths, nothing trailing, each field as the push reader judges it, and the whole membership
// judged again as a push.
// ReplicationPrefix begins every key the hub replicates: an Elector that copies several parts
// gives the hub every record under it.
const ReplicationPrefix = "vpn/"

const (
	replicaPrefix = ReplicationPrefix
	headerKey     = replicaPrefix + "membership"
	chunkPrefix   = replicaPrefix + "members/"
	chunkMembers  = 1024
	maxChunks     = contracts.VPNMaxMembers / chunkMembers
	maxSafeInt    = 1<<53 - 1
	headerFixed   = 8 + 2 + 5
	memberFixed   = 32 + 4 + 8 + 1
)

// replicaRecord is one record sent to a standby.
type replicaRecord struct {
	key   string
	value []byte
}

// replicaWatcher is one standby being fed.
type replicaWatcher struct {
	send func(key string, value []byte)
}

// replicaHeader is the header record read.
type replicaHeader struct {
	generation int64
	chunks     int
	prefix     netip.Prefix
	authority  string
}

// replicaChunk is a chunk record read.
type replicaChunk struct {
	generation int64
	members    []contracts.VPNMember
}

// stagedCopy is a standby's records as its leader sent them. Owned by the hub, under its mu.
type stagedCopy struct {
	header    *replicaHeader
	headerRaw []byte
	chunks    map[int]stagedChunk
}

type stagedChunk struct {
	chunk replicaChunk
	raw   []byte
}

func chunkKey(i int) string { return chunkPrefix + strconv.Itoa(i) }

func chunkCount(members int) int { return (members + chunkMembers - 1) / chunkMembers }

// Replicate implements feature.Replicated: it sends the membership held now, then every change,
// until stop. send is called with the hub's lock held.
func (h *Hub) Replicate(send func(key string, value []byte)) (stop func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.recordsLocked() {
		send(r.key, r.value)
	}
	w := &replicaWatcher{send: send}
	h.watchers = append(h.watchers, w)
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for i, x := range h.watchers {
			if x == w {
				h.watchers = append(h.watchers[:i], h.watchers[i+1:]...)
				return
			}
		}
	}
}

// recordsLocked is the records of the membership held, chunks first; built once per membership.
func (h *Hub) recordsLocked() []replicaRecord {
	v := h.view.Load()
	if v == nil {
		return nil
	}
	if h.records == nil {
		h.records = encodeRecords(v)
	}
	return h.records
}

// replicateLocked sends the standbys the change from old to v: v's records, then the removal of
// the chunks (and, when v is nil, the header) it no longer has.
func (h *Hub) replicateLocked(old, v *membershipView) {
	if len(h.watchers) == 0 {
		return
	}
	was, now := 0, 0
	if old != nil {
		was = chunkCount(len(old.members))
	}
	recs := h.recordsLocked()
	if v != nil {
		now = chunkCount(len(v.members))
	}
	for _, w := range h.watchers {
		for _, r := range recs {
			w.send(r.key, r.value)
		}
		if v == nil && old != nil {
			w.send(headerKey, nil)
		}
		for i := now; i < was; i++ {
			w.send(chunkKey(i), nil)
		}
	}
}

// encodeRecords cuts v into its records: the chunks, then the header.
func encodeRecords(v *membershipView) []replicaRecord {
	n := chunkCount(len(v.members))
	recs := make([]replicaRecord, 0, n+1)
	for i := range n {
		part := v.members[i*chunkMembers : min((i+1)*chunkMembers, len(v.members))]
		recs = append(recs, replicaRecord{chunkKey(i), appendChunk(nil, v.generation, part)})
	}
	hdr := replicaHeader{generation: v.generation, chunks: n, prefix: v.prefix, authority: v.authorityID}
	return append(recs, replicaRecord{headerKey, appendHeader(nil, hdr)})
}

// Adopt implements feature.Replicated: it keeps a record copied from the leader, and once the
// records make a whole membership, installs it as the hub's own. A standby's hub serves nothing
// while its relay stands by (lead.go), but holds the membership the moment it leads. A record
// that does not read is refused and changes nothing.
func (h *Hub) Adopt(key string, value []byte) error {
	if !strings.HasPrefix(key, replicaPrefix) {
		return fmt.Errorf("%w: %q is not a vpn/ record", ErrReplicaRecord, key)
	}
	h.mu.Lock()
	install, forget, err := h.copied.stage(key, value)
	if err != nil || (!install && !forget) {
		h.mu.Unlock()
		return err
	}
	var v *membershipView
	if install {
		m, ok, err := h.copied.assemble()
		if err != nil || !ok {
			h.mu.Unlock()
			return err
		}
		v = newMembershipView(m)
	}
	victims := h.installLocked(v, h.clock.Now().UnixMilli())
	h.mu.Unlock()
	shutVictims(victims)
	if v == nil {
		h.log.Info().Str("outcome", "forgotten").Msg("vpn membership removed by the leader's copy: it holds none")
	} else {
		h.log.Info().Int64("generation", v.generation).Int("members", len(v.members)).Str("outcome", "adopted").
			Msg("vpn membership copied from the leader")
	}
	return nil
}

// ForgetCopy implements feature.Replicated: the hub drops its membership and whatever it was
// sent, before it copies another leader's.
func (h *Hub) ForgetCopy() {
	h.mu.Lock()
	h.copied = stagedCopy{}
	var victims []victim
	had := h.view.Load() != nil
	if had {
		victims = h.installLocked(nil, h.clock.Now().UnixMilli())
	}
	h.mu.Unlock()
	shutVictims(victims)
	if had {
		h.log.Info().Str("outcome", "forgotten").Msg("vpn membership forgotten before copying another leader's")
	}
}

// stage keeps one record. install: the record may complete a membership (a header, or a chunk
// the header counts, that changed); forget: the leader removed its header, so it holds no
// membership.
func (c *stagedCopy) stage(key string, value []byte) (install, forget bool, err error) {
	if key == headerKey {
		if value == nil {
			had := c.header != nil
			c.header, c.headerRaw = nil, nil
			return false, had, nil
		}
		hdr, err := readHeader(value)
		if err != nil {
			return false, false, err
		}
		if bytes.Equal(value, c.headerRaw) {
			return false, false, nil
		}
		c.header, c.headerRaw = &hdr, bytes.Clone(value)
		return true, false, nil
	}
	i, ok := readChunkKey(key)
	if !ok {
		return false, false, fmt.Errorf("%w: unknown record %q", ErrReplicaRecord, key)
	}
	if value == nil {
		delete(c.chunks, i)
		return false, false, nil
	}
	ch, err := readChunk(value)
	if err != nil {
		return false, false, fmt.Errorf("%s: %w", key, err)
	}
	if old, ok := c.chunks[i]; ok && bytes.Equal(old.raw, value) {
		return false, false, nil
	}
	if c.chunks == nil {
		c.chunks = make(map[int]stagedChunk)
	}
	c.chunks[i] = stagedChunk{ch, bytes.Clone(value)}
	return c.header != nil && i < c.header.chunks, false, nil
}

// assemble is the membership the staged records make, when the header and every chunk it counts
// carry one generation (ok false otherwise). The membership is judged as a push is: one that
// the push reader refuses is an error, and is not installed.
func (c *stagedCopy) assemble() (contracts.VPNMembership, bool, error) {
	hdr := c.header
	if hdr == nil {
		return contracts.VPNMembership{}, false, nil
	}
	m := contracts.VPNMembership{AuthorityID: hdr.authority, ControlPrefix: hdr.prefix, Generation: hdr.generation}
	for i := range hdr.chunks {
		ch, ok := c.chunks[i]
		if !ok || ch.chunk.generation != hdr.generation {
			return contracts.VPNMembership{}, false, nil
		}
		m.Members = append(m.Members, ch.chunk.members...)
	}
	judged, err := contracts.ReadVPNMembershipPush(contracts.EncodeVPNMembershipPush(m))
	if err != nil {
		return contracts.VPNMembership{}, false, fmt.Errorf("%w: the copied membership generation %d is not one a push may carry: %v",
			ErrReplicaRecord, hdr.generation, err)
	}
	return judged, true, nil
}

func appendHeader(dst []byte, h replicaHeader) []byte {
	dst = binary.BigEndian.AppendUint64(dst, uint64(h.generation))
	dst = binary.BigEndian.AppendUint16(dst, uint16(h.chunks))
	a := h.prefix.Addr().As4()
	dst = append(append(dst, a[:]...), byte(h.prefix.Bits()))
	return append(dst, h.authority...)
}

// readHeader reads a header record strictly.
func readHeader(b []byte) (replicaHeader, error) {
	var h replicaHeader
	if len(b) <= headerFixed {
		return h, fmt.Errorf("%w: header of %d bytes", ErrReplicaRecord, len(b))
	}
	g := binary.BigEndian.Uint64(b)
	if g > maxSafeInt {
		return h, fmt.Errorf("%w: header generation past 2^53-1", ErrReplicaRecord)
	}
	h.generation, h.chunks = int64(g), int(binary.BigEndian.Uint16(b[8:]))
	if h.chunks > maxChunks {
		return h, fmt.Errorf("%w: header counts %d chunks, at most %d", ErrReplicaRecord, h.chunks, maxChunks)
	}
	p := netip.PrefixFrom(netip.AddrFrom4([4]byte(b[10:14])), int(b[14]))
	var ok bool
	if h.prefix, ok = contracts.ReadVPNControlPrefix(p.String()); !ok || !p.IsValid() {
		return h, fmt.Errorf("%w: header control prefix is not a private IPv4 prefix no longer than /30", ErrReplicaRecord)
	}
	if h.authority = string(b[headerFixed:]); !contracts.IsCanonicalID(h.authority) {
		return h, fmt.Errorf("%w: header authority id is not a canonical identifier", ErrReplicaRecord)
	}
	return h, nil
}

func appendChunk(dst []byte, generation int64, members []contracts.VPNMember) []byte {
	dst = binary.BigEndian.AppendUint64(dst, uint64(generation))
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(members)))
	for _, m := range members {
		a := m.ControlAddress.As4()
		dst = append(append(dst, m.PublicKey[:]...), a[:]...)
		dst = binary.BigEndian.AppendUint64(dst, uint64(m.ExpiresAt))
		dst = append(append(dst, byte(len(m.NodeID))), m.NodeID...)
	}
	return dst
}

// readChunk reads a chunk record strictly: exactly the members it counts, nothing after them.
func readChunk(b []byte) (replicaChunk, error) {
	var c replicaChunk
	if len(b) < 10 {
		return c, fmt.Errorf("%w: chunk of %d bytes", ErrReplicaRecord, len(b))
	}
	g, n := binary.BigEndian.Uint64(b), int(binary.BigEndian.Uint16(b[8:]))
	if g > maxSafeInt {
		return c, fmt.Errorf("%w: chunk generation past 2^53-1", ErrReplicaRecord)
	}
	if n == 0 || n > chunkMembers {
		return c, fmt.Errorf("%w: chunk counts %d members, from 1 to %d", ErrReplicaRecord, n, chunkMembers)
	}
	c.generation, c.members = int64(g), make([]contracts.VPNMember, 0, n)
	rest := b[10:]
	for i := range n {
		if len(rest) < memberFixed {
			return c, fmt.Errorf("%w: chunk member %d cut short", ErrReplicaRecord, i)
		}
		var m contracts.VPNMember
		copy(m.PublicKey[:], rest)
		m.ControlAddress = netip.AddrFrom4([4]byte(rest[32:36]))
		exp := binary.BigEndian.Uint64(rest[36:])
		l := int(rest[44])
		rest = rest[memberFixed:]
		if exp > maxSafeInt {
			return c, fmt.Errorf("%w: chunk member %d expiresAt past 2^53-1", ErrReplicaRecord, i)
		}
		if len(rest) < l {
			return c, fmt.Errorf("%w: chunk member %d cut short", ErrReplicaRecord, i)
		}
		m.ExpiresAt, m.NodeID = int64(exp), string(rest[:l])
		rest = rest[l:]
		if !contracts.IsClusterNodeID(m.NodeID) {
			return c, fmt.Errorf("%w: chunk member %d node id is not a cluster node id", ErrReplicaRecord, i)
		}
		c.members = append(c.members, m)
	}
	if len(rest) != 0 {
		return c, fmt.Errorf("%w: %d bytes after the chunk's members", ErrReplicaRecord, len(rest))
	}
	return c, nil
}

// readChunkKey reads "vpn/members/<i>": i in decimal without leading zeros, below maxChunks.
func readChunkKey(key string) (int, bool) {
	s, ok := strings.CutPrefix(key, chunkPrefix)
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || i >= maxChunks || strconv.Itoa(i) != s {
		return 0, false
	}
	return i, true
}
