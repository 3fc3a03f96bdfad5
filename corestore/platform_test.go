package corestore

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
)

// TestPlatformCalls: every platform call carries the bearer and nothing else of the relay's; a
// closure is refused unless served as the backup media type and announced within 256 MiB; a PUT
// carries the media type and the descriptor in base64url; a Corestore refusal travels as
// restore-node-refused with its own reason, never the bearer.
func TestPlatformCalls(t *testing.T) {
	const bearer = "platform-bearer-secret-0123456789abcdef"
	var gotDescriptor, gotType string
	var gotBody []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+bearer {
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"reason":"unauthenticated: bad bearer ` + r.Header.Get("Authorization") + `"}`))
			return
		}
		switch r.URL.Path {
		case "/platform/backups/typed/closure":
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Write([]byte("x"))
		case "/platform/backups/huge/closure":
			w.Header().Set("Content-Type", contracts.CorestoreDatabaseBackupMediaType)
			w.Header().Set("Content-Length", strconv.Itoa(contracts.MaxCorestoreClosureBytes+1))
			w.(http.Flusher).Flush()
		case "/platform/backups/ok/closure":
			w.Header().Set("Content-Type", contracts.CorestoreDatabaseBackupMediaType+"; version=1")
			w.Write([]byte("closure-bytes"))
		case "/platform/restores/r1/closure":
			gotType, gotDescriptor = r.Header.Get("Content-Type"), r.Header.Get(contracts.CorestoreDescriptorHeader)
			gotBody, _ = io.ReadAll(r.Body)
			w.Write([]byte(`{}`))
		default:
			w.Write([]byte(`{}`))
		}
	}))
	defer srv.Close()
	c, err := New(Options{AllowHTTP: true, StallTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	sec := contracts.NewSecret(bearer)

	if err := c.PutDesiredState(ctx, srv.URL, sec, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	err = c.PutDesiredState(ctx, srv.URL, contracts.NewSecret("wrong"), []byte(`{}`))
	if !errors.Is(err, contracts.RestoreNodeRefused) || !strings.Contains(err.Error(), "unauthenticated") {
		t.Fatalf("a refused bearer: %v", err)
	}
	if err := c.PutDesiredState(ctx, srv.URL, contracts.Secret{}, []byte(`{}`)); !errors.Is(err, contracts.RestoreNodeRefused) {
		t.Fatalf("no credential: %v", err)
	}
	if _, err := c.OpenBackupClosure(ctx, srv.URL, sec, "typed"); !errors.Is(err, contracts.RestoreNodeRefused) {
		t.Fatalf("a closure of another type: %v", err)
	}
	if _, err := c.OpenBackupClosure(ctx, srv.URL, sec, "huge"); !errors.Is(err, contracts.RelayRequestInvalid) {
		t.Fatalf("a closure announced over 256 MiB: %v", err)
	}
	rc, err := c.OpenBackupClosure(ctx, srv.URL, sec, "ok")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(b) != "closure-bytes" {
		t.Fatalf("closure %q %v", b, err)
	}
	desc := []byte(`{"format":"corestore.database.backup","n":1e3}`)
	if err := c.PutRestoreClosure(ctx, srv.URL, sec, "r1", desc, bytes.NewReader([]byte("restored"))); err != nil {
		t.Fatal(err)
	}
	if d, _ := base64.RawURLEncoding.DecodeString(gotDescriptor); gotType != contracts.CorestoreDatabaseBackupMediaType || string(d) != string(desc) || string(gotBody) != "restored" {
		t.Fatalf("PUT: type %q descriptor %q body %q", gotType, d, gotBody)
	}
	if err := c.PutRestoreClosure(ctx, srv.URL, sec, "r1", desc, io.MultiReader(strings.NewReader("part"), failing{})); !errors.Is(err, errSource) {
		t.Fatalf("a source that fails: %v", err)
	}
	if err := c.PutDesiredState(ctx, "https://user@x.example", sec, nil); !errors.Is(err, contracts.RestoreNodeUnreachable) {
		t.Fatalf("a non-canonical origin: %v", err)
	}
}

var errSource = errors.New("the source failed")

type failing struct{}

func (failing) Read([]byte) (int, error) { return 0, errSource }

// TestClosureStall: a Corestore that stops sending a closure midway is cut after StallTimeout; one
// that sends slowly but keeps moving is not.
func TestClosureStall(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", contracts.CorestoreDatabaseBackupMediaType)
		w.Write(bytes.Repeat([]byte("a"), 1<<10))
		w.(http.Flusher).Flush()
		if r.URL.Path == "/platform/backups/slow/closure" {
			pace := time.NewTicker(100 * time.Millisecond) // slow but moving: the pace is the behaviour
			defer pace.Stop()
			for range 5 {
				<-pace.C
				w.Write([]byte("b"))
				w.(http.Flusher).Flush()
			}
			return
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	c, err := New(Options{AllowHTTP: true, StallTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sec := contracts.NewSecret("b")
	rc, err := c.OpenBackupClosure(context.Background(), srv.URL, sec, "stall")
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(rc)
	rc.Close()
	if !errors.Is(err, contracts.RelayClosureStalled) {
		t.Fatalf("a stalled closure: %v", err)
	}
	rc, err = c.OpenBackupClosure(context.Background(), srv.URL, sec, "slow")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || len(b) != 1<<10+5 {
		t.Fatalf("a slow closure: %d bytes, %v", len(b), err)
	}
}
