package sim

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
)

// The peers keep nothing of a body or a grant unless a test asked them to: `relay-dev` runs them
// for as long as anyone likes.
func TestPeersKeepControlsAndGrantsOnlyWhenAsked(t *testing.T) {
	auth, err := NewRestoreAuthority()
	if err != nil {
		t.Fatal(err)
	}
	for _, record := range []bool{false, true} {
		auth.RecordGrants = record
		c := NewCorestore(CorestoreOptions{NodeName: "node-a", Authority: auth.PublicKey(), Plaintext: true, Log: zerolog.Nop(), RecordControls: record})
		p := &RestorePlan{RestoreID: fmt.Sprintf("restore-%v", record), NodeName: "node-a", Mappings: []string{"db->db"},
			Objects: []RestoreObject{{Key: "a.tar", Data: []byte("archive")}}}
		if status := postControl(t, c, contracts.CorestoreOpPrepare, auth.PrepareControl(p)); status != http.StatusOK {
			t.Fatalf("prepare answered %d", status)
		}
		c.Close()
		if got := len(c.Received()); got != map[bool]int{false: 0, true: 1}[record] {
			t.Fatalf("record %v: %d controls kept", record, got)
		}
		if got := len(auth.Minted()); record != (got > 0) {
			t.Fatalf("record %v: %d grants kept", record, got)
		}
	}
}

// A Corestore keeps the staging of the restores updated last and forgets the oldest: a restore
// abandoned half way (its Cloudly went away) does not stay forever.
func TestCorestoreForgetsTheOldestStaging(t *testing.T) {
	auth, err := NewRestoreAuthority()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	c := NewCorestore(CorestoreOptions{NodeName: "node-a", Authority: auth.PublicKey(), Plaintext: true, Log: zerolog.Nop(),
		Now: func() time.Time { now = now.Add(time.Millisecond); return now }})
	defer c.Close()
	plan := func(i int) *RestorePlan {
		return &RestorePlan{RestoreID: fmt.Sprintf("restore-%d", i), NodeName: "node-a", Mappings: []string{"db->db"},
			Objects: []RestoreObject{{Key: "a.tar", Data: []byte("archive")}}}
	}
	for i := range maxStagings + 1 {
		if status := postControl(t, c, contracts.CorestoreOpPrepare, auth.PrepareControl(plan(i))); status != http.StatusOK {
			t.Fatalf("prepare %d answered %d", i, status)
		}
	}
	if status := postControl(t, c, contracts.CorestoreOpStatus, auth.StatusControl(plan(0))); status != http.StatusNotFound {
		t.Fatalf("the oldest staging answered %d, want 404 restore-unknown", status)
	}
	if status := postControl(t, c, contracts.CorestoreOpStatus, auth.StatusControl(plan(1))); status != http.StatusOK {
		t.Fatalf("the second oldest staging answered %d", status)
	}
}

func postControl(t *testing.T, c *Corestore, op string, control []byte) int {
	t.Helper()
	resp, err := http.Post(c.Origin()+contracts.CorestoreIsolatedRestorePathPrefix+op, "application/json", bytes.NewReader(control))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A stream nobody waits for — its request was lost, or its receiver gave up — is forgotten once
// streamLinger has passed since its last chunk, and every stream at once when its path is gone; a
// stream still moving is kept until then.
func TestStreamsForgetAbandonedStreams(t *testing.T) {
	s := newStreams()
	s.chunk("half", "aGFsZg==") // never closed
	s.chunk("closed", "d2hvbGU=")
	s.chunk("closed", contracts.StreamClosingBit) // closed, and nobody asks for it
	later := time.Now().Add(streamLinger + time.Second)
	s.mu.Lock()
	s.incoming["moving"] = &inbound{data: []byte("x"), last: later} // a chunk just came
	s.sweepLocked(later)
	kept := len(s.incoming) + len(s.closed)
	_, moving := s.incoming["moving"]
	s.mu.Unlock()
	if kept != 1 || !moving {
		t.Fatalf("kept %d streams (moving kept: %v); want only the moving one", kept, moving)
	}
	s.chunk("closed-too", contracts.StreamClosingBit)
	s.abandon() // the path they came over is gone: Cloudly's socket ended, or the relay detached
	s.mu.Lock()
	kept = len(s.incoming) + len(s.closed)
	s.mu.Unlock()
	if kept != 0 {
		t.Fatalf("kept %d streams whose path is gone", kept)
	}
}

func TestNewestKeepsTheNewestInOrder(t *testing.T) {
	var r newest[int]
	if got := r.all(); len(got) != 0 {
		t.Fatalf("empty ring holds %v", got)
	}
	for i := range newestKept + 10 {
		r.add(i)
	}
	got := r.all()
	want := make([]int, 0, newestKept)
	for i := 10; i < newestKept+10; i++ {
		want = append(want, i)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("ring holds %v", got)
	}
	var v []string
	for range firstFewKept + 1 {
		v = firstFew(v, strings.Repeat("x", 3))
	}
	if len(v) != firstFewKept {
		t.Fatalf("firstFew kept %d", len(v))
	}
}
