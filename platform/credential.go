package platform

import (
	"crypto/ecdh"
	"crypto/rand"
	"encoding/json"

	"code.foss.global/serve.zone/relay/contracts"
)

// The credential (docs/platform.md): after each attach the agent enrols as a secret recipient with a
// fresh X25519 key pair held in memory only; Cloudly seals each node's Corestore credential to
// that key (pushCorestoreCredential). A credential is a contracts.Secret: it prints as [secret],
// is never logged, stored or shown, and goes only into the Authorization header of calls to its
// own node's Corestore. Credentials outlive a detach by CredentialHorizon (the escrow horizon:
// a relay cut off from Cloudly keeps its nodes' platform work going as long as it keeps their
// renewals), then are dropped.

// startEnrollment enrols for session, unless an enrollment of it is done or under way.
func (p *Platform) startEnrollment(session uint64) {
	p.mu.Lock()
	if p.closed || !p.attached || p.session != session || p.enrolling == session || p.enrolled == session {
		p.mu.Unlock()
		return
	}
	p.enrolling = session
	p.mu.Unlock()
	p.goDo(func() { p.enroll(session) })
}

// enroll runs one enrollment: a key pair, begin, open the challenge, complete.
func (p *Platform) enroll(session uint64) {
	start := p.clock.Now()
	err := p.enrollOnce(session)
	out := outcome(err, outcomeEnrolled)
	p.metrics.enrollments.WithLabelValues(out).Inc()
	p.mu.Lock()
	p.enrollment = out
	if p.enrolling == session {
		p.enrolling = 0
	}
	if err == nil && p.session == session {
		p.enrolled = session
	}
	p.mu.Unlock()
	ev := p.log.Info()
	if err != nil {
		ev = p.log.Warn()
	}
	ev.Str("method", contracts.MethodBeginSecretRecipientEnrollment).Str("outcome", out).Dur("latency", p.clock.Since(start)).
		Msg("secret recipient enrollment")
}

func (p *Platform) enrollOnce(session uint64) error {
	key, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return contracts.RelayRequestInvalid.Refuse("cannot make a recipient key")
	}
	p.mu.Lock()
	if !p.attached || p.session != session {
		p.mu.Unlock()
		return contracts.RelayUpstreamDetached.Refuse("the session ended before the enrollment")
	}
	// Held from now: Cloudly may seal a credential to the key as soon as it has it.
	p.recipient = key
	p.mu.Unlock()
	body, err := p.call(p.ctx, contracts.MethodBeginSecretRecipientEnrollment, contracts.EncodeBeginEnrollment(key.PublicKey()))
	if err != nil {
		return err
	}
	e, err := contracts.ReadEnrollment(body)
	if err != nil {
		return contracts.RelayRequestInvalid.Refuse("Cloudly's answer to %s: %v", contracts.MethodBeginSecretRecipientEnrollment, err)
	}
	opened, err := contracts.OpenEnvelope(key, contracts.EnvelopeInfoEnrollment, e.Challenge)
	if err != nil || len(opened) != contracts.EnrollmentChallengeBytes {
		return contracts.RelayRequestInvalid.Refuse("the enrollment challenge does not open to %d bytes with the relay's key", contracts.EnrollmentChallengeBytes)
	}
	_, err = p.call(p.ctx, contracts.MethodCompleteSecretRecipientEnrollment, contracts.EncodeCompleteEnrollment(e.ID, opened))
	return err
}

// serveCredential serves pushCorestoreCredential: the envelope opened with the newest recipient
// key, the credential kept for that node only. Reasons never quote the envelope or credential.
func (p *Platform) serveCredential(body json.RawMessage) (json.RawMessage, error) {
	push, err := contracts.ReadCorestoreCredentialPush(body)
	if err != nil {
		return nil, contracts.RelayRequestInvalid.Refuse("%s: %v", contracts.MethodPushCorestoreCredential, err)
	}
	p.mu.Lock()
	key, n := p.recipient, p.nodes[push.NodeID]
	p.mu.Unlock()
	switch {
	case n == nil:
		return nil, contracts.RestoreNodeNotCarried.Refuse("this relay has no Corestore origin for node %s", push.NodeID)
	case key == nil:
		return nil, contracts.RelayRequestInvalid.Refuse("the relay has not enrolled as a secret recipient in this session")
	}
	plain, err := contracts.OpenEnvelope(key, contracts.EnvelopeInfoCorestoreCredential, push.Envelope)
	if err != nil {
		return nil, contracts.RelayRequestInvalid.Refuse("the credential envelope for node %s does not open with the relay's recipient key", push.NodeID)
	}
	if !isBearerToken(plain) {
		clear(plain)
		return nil, contracts.RelayRequestInvalid.Refuse("the credential for node %s is not a bearer token (1 to %d visible ASCII characters)",
			push.NodeID, contracts.MaxCredentialBytes)
	}
	n.setCredential(contracts.NewSecret(string(plain)))
	clear(plain)
	return json.RawMessage(`{}`), nil
}

// isBearerToken: 1 to MaxCredentialBytes visible ASCII characters, what an Authorization header
// carries after "Bearer ".
func isBearerToken(b []byte) bool {
	if len(b) == 0 || len(b) > contracts.MaxCredentialBytes {
		return false
	}
	for _, c := range b {
		if c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// dropCredentials forgets every credential when the relay is still detached from the session it
// lost a horizon ago.
func (p *Platform) dropCredentials(session uint64) {
	p.mu.Lock()
	if p.attached || p.session != session {
		p.mu.Unlock()
		return
	}
	nodes := p.nodeList()
	p.mu.Unlock()
	for _, n := range nodes {
		n.dropCredential()
	}
	p.metrics.dropped.Add(float64(len(nodes)))
	p.log.Info().Int("corestores", len(nodes)).Str("outcome", "dropped").Msg("Corestore credentials dropped: detached past the escrow horizon")
}

// nodeList is the nodes as a slice. Called with p.mu held.
func (p *Platform) nodeList() []*node {
	out := make([]*node, 0, len(p.nodes))
	for _, n := range p.nodes {
		out = append(out, n)
	}
	return out
}
