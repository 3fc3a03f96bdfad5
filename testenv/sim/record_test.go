package sim

import (
	"bytes"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
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
	synctest.Test(t, func(t *testing.T) {
		s := newStreams()
		chunk := func(id string, data []byte) {
			s.read(&recordLink{id: id}).StreamFrame(contracts.AppendChunkFrame(nil, id, id+"-c", data, data != nil, data == nil))
			synctest.Wait() // its reader took it
		}
		kept := func() (readers, closed []string) {
			s.mu.Lock()
			defer s.mu.Unlock()
			return slices.Sorted(maps.Keys(s.readers)), slices.Sorted(maps.Keys(s.closed))
		}
		chunk("half", []byte("half")) // never closed
		chunk("closed", []byte("whole"))
		chunk("closed", nil) // closed, and nobody asks for it
		if r, c := kept(); !slices.Equal(r, []string{"half"}) || !slices.Equal(c, []string{"closed"}) {
			t.Fatalf("reading %v, read %v; want [half] and [closed]", r, c)
		}
		// Inside the bubble the clock is synctest's: this moves it past the linger at once.
		time.Sleep(streamLinger + time.Second)
		chunk("moving", []byte("x")) // a chunk just came
		if r, c := kept(); !slices.Equal(r, []string{"moving"}) || len(c) != 0 {
			t.Fatalf("reading %v, read %v; want only the moving one", r, c)
		}
		chunk("closed-too", nil)
		s.abandon() // the path they came over is gone: Cloudly's socket ended, or the relay detached
		synctest.Wait()
		if r, c := kept(); len(r)+len(c) != 0 {
			t.Fatalf("kept %v and %v, whose path is gone", r, c)
		}
	})
}

// recordLink is a stream's path that takes what is sent on it and keeps none of it.
type recordLink struct{ id string }

func (l *recordLink) ID() string              { return l.id }
func (l *recordLink) Send(frame []byte) error { return nil }
func (l *recordLink) Done() <-chan struct{}   { return nil }

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
