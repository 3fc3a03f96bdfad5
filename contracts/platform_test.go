package contracts

import (
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

const desiredState = `{"capabilities":{"corestore-inventory":true,"n":12345678901234567890},"providerConfigs":[{"k":"v\u00e9"}],` +
	`"bindings":[{"nodeId":"node-a","binding":{"db":"one","x":1.50}},{"nodeId":"-node_b","binding":"two"},{"nodeId":"node-a","binding":[3]}]}`

// TestReadPlatformDesiredState: the seed's shape is read exactly, every inner member kept as the
// bytes Cloudly sent, and each node's Corestore body holds its own bindings byte for byte.
func TestReadPlatformDesiredState(t *testing.T) {
	st, err := ReadPlatformDesiredState([]byte(desiredState))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Bindings) != 3 || st.Bindings[1].NodeID != "-node_b" {
		t.Fatalf("bindings: %+v", st.Bindings)
	}
	got := st.SplitByNode([]string{"node-a", "-node_b", "node-c"})
	want := map[string]string{
		"node-a":  `{"capabilities":{"corestore-inventory":true,"n":12345678901234567890},"providerConfigs":[{"k":"v\u00e9"}],"bindings":[{"db":"one","x":1.50},[3]]}`,
		"-node_b": `{"capabilities":{"corestore-inventory":true,"n":12345678901234567890},"providerConfigs":[{"k":"v\u00e9"}],"bindings":["two"]}`,
		"node-c":  `{"capabilities":{"corestore-inventory":true,"n":12345678901234567890},"providerConfigs":[{"k":"v\u00e9"}],"bindings":[]}`,
	}
	if len(got) != len(want) {
		t.Fatalf("split: %d bodies", len(got))
	}
	for n, w := range want {
		if string(got[n]) != w {
			t.Errorf("%s: %s\nwant %s", n, got[n], w)
		}
	}
	for _, bad := range []string{
		`{"capabilities":{},"providerConfigs":{},"bindings":[],"extra":1}`,
		`{"capabilities":{},"providerConfigs":{}}`,
		`{"capabilities":{},"providerConfigs":{},"bindings":{}}`,
		`{"capabilities":{},"providerConfigs":{},"bindings":[{"nodeId":"a b","binding":1}]}`,
		`{"capabilities":{},"providerConfigs":{},"bindings":[{"nodeId":"a","binding":1,"more":2}]}`,
		`{"capabilities":{},"providerConfigs":{},"bindings":[{"nodeId":"a"}]}`,
		`{"capabilities":{},"capabilities":{},"providerConfigs":{},"bindings":[]}`,
	} {
		if _, err := ReadPlatformDesiredState([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

// TestClosureBodies: the relay's two seed-spelled requests have exactly the seed's keys, the
// descriptor byte for byte; the answers are read exactly.
func TestClosureBodies(t *testing.T) {
	req := BackupClosureRequest{BackupID: "b-1", ServiceID: "svc:1", NodeID: "node-a", Descriptor: json.RawMessage(`{"z":1,"a":1e400}`), StreamID: "s-1"}
	const want = `{"backupId":"b-1","serviceId":"svc:1","nodeId":"node-a","descriptor":{"z":1,"a":1e400},"closure":{"_isVirtualStream":true,"streamId":"s-1"}}`
	if got := string(req.Encode()); got != want {
		t.Fatalf("backup request %s", got)
	}
	if got := string(EncodeRestoreClosureRequest("b-1", "svc:1", "node-a")); got != `{"backupId":"b-1","serviceId":"svc:1","nodeId":"node-a"}` {
		t.Fatalf("restore request %s", got)
	}
	for in, want := range map[string]bool{`{"accepted":true}`: true, `{"accepted":false}`: false} {
		if got, err := ReadBackupClosureResponse([]byte(in)); err != nil || got != want {
			t.Errorf("%s: %v %v", in, got, err)
		}
	}
	for _, bad := range []string{`{"accepted":1}`, `{}`, `{"accepted":true,"why":"x"}`, `null`} {
		if _, err := ReadBackupClosureResponse([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
	r, err := ReadRestoreClosureResponse([]byte(`{"descriptor":{"format":"corestore.database.backup"},"closure":{"_isVirtualStream":true,"streamId":"cl-9","extra":1}}`))
	if err != nil || r.StreamID != "cl-9" || string(r.Descriptor) != `{"format":"corestore.database.backup"}` {
		t.Fatalf("restore answer: %+v %v", r, err)
	}
	for _, bad := range []string{`{"descriptor":{},"closure":{"streamId":"x"}}`, `{"descriptor":{},"closure":"x"}`,
		`{"descriptor":{},"closure":{"_isVirtualStream":true,"streamId":""}}`, `{"closure":{"_isVirtualStream":true,"streamId":"x"}}`} {
		if _, err := ReadRestoreClosureResponse([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

// TestCorestoreListings: project-defined, read tolerantly: unknown members ignored, an entry the
// relay cannot carry skipped and counted, never the whole listing refused.
func TestCorestoreListings(t *testing.T) {
	bs, skipped, err := ReadCorestoreBackups([]byte(`{"v":2,"backups":[{"backupId":"b1","serviceId":"s1","descriptor":{"d":1},"size":9},` +
		`{"backupId":"../x","serviceId":"s","descriptor":{}},{"backupId":"b3","serviceId":"s3"}]}`))
	if err != nil || skipped != 2 || len(bs) != 1 || bs[0].BackupID != "b1" || string(bs[0].Descriptor) != `{"d":1}` {
		t.Fatalf("backups: %+v %d %v", bs, skipped, err)
	}
	rs, skipped, err := ReadCorestoreRestores([]byte(`{"restores":[{"backupId":"b1","serviceId":"s1","state":"wanted"},{"backupId":7}]}`))
	if err != nil || skipped != 1 || len(rs) != 1 || rs[0] != (CorestoreRestore{"b1", "s1"}) {
		t.Fatalf("restores: %+v %d %v", rs, skipped, err)
	}
	if _, _, err := ReadCorestoreRestores([]byte(`{"wanted":[]}`)); err == nil {
		t.Fatal("a listing without restores read")
	}
}

// TestEnvelope: the opener opens what the sealer sealed to its key under its info, and nothing
// else: another key, another info, a tampered or truncated envelope, padding, standard base64.
func TestEnvelope(t *testing.T) {
	priv, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := ecdh.X25519().GenerateKey(rand.Reader)
	env, err := SealEnvelope(priv.PublicKey(), EnvelopeInfoCorestoreCredential, []byte("credential-value"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := OpenEnvelope(priv, EnvelopeInfoCorestoreCredential, env); err != nil || string(got) != "credential-value" {
		t.Fatalf("open: %q %v", got, err)
	}
	flip := []byte(env)
	flip[len(flip)-3] ^= 1
	for name, c := range map[string]struct {
		key  *ecdh.PrivateKey
		info string
		env  string
	}{
		"other key":  {other, EnvelopeInfoCorestoreCredential, env},
		"other info": {priv, EnvelopeInfoEnrollment, env},
		"tampered":   {priv, EnvelopeInfoCorestoreCredential, string(flip)},
		"truncated":  {priv, EnvelopeInfoCorestoreCredential, env[:40]},
		"padded":     {priv, EnvelopeInfoCorestoreCredential, env + "="},
		"empty":      {priv, EnvelopeInfoCorestoreCredential, ""},
		"no key":     {nil, EnvelopeInfoCorestoreCredential, env},
	} {
		if _, err := OpenEnvelope(c.key, c.info, c.env); !errors.Is(err, ErrEnvelope) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Enrollment bodies round trip.
	pub, err := ReadBeginEnrollment(EncodeBeginEnrollment(priv.PublicKey()))
	if err != nil || !bytes.Equal(pub.Bytes(), priv.PublicKey().Bytes()) {
		t.Fatalf("begin: %v", err)
	}
	e, err := ReadEnrollment([]byte(`{"enrollmentId":"e-1","challenge":"abc","expiresAt":1}`))
	if err != nil || e.ID != "e-1" || e.Challenge != "abc" {
		t.Fatalf("enrollment: %+v %v", e, err)
	}
	if got := string(EncodeCompleteEnrollment("e-1", []byte{0xff, 0xfe})); got != `{"enrollmentId":"e-1","response":"__4"}` {
		t.Fatalf("complete: %s", got)
	}
	p, err := ReadCorestoreCredentialPush([]byte(`{"nodeId":"_n","envelope":"x","v":1}`))
	if err != nil || p.NodeID != "_n" || p.Envelope != "x" {
		t.Fatalf("push: %+v %v", p, err)
	}
	if _, err := ReadCorestoreCredentialPush([]byte(`{"nodeId":"n","envelope":"` + strings.Repeat("s", 8) + `secret-text","nodeId":"m"}`)); err == nil ||
		strings.Contains(err.Error(), "secret-text") {
		t.Fatalf("push with a repeated nodeId: %v", err)
	}
}

// TestChunkData: every encoding the library writes reads back to the same bytes, the relay's own
// encoding among them; the closing chunk is recognised; anything else is refused.
func TestChunkData(t *testing.T) {
	data := []byte{0, 1, 9, 10, 99, 100, 255, 'h', 'i'}
	for _, enc := range []string{
		string(AppendBufferChunk(nil, data)),
		`{"type":"Buffer","data":[0, 1,9,10,99,100,255,104,105]}`,
		`{"0":0,"1":1,"2":9,"3":10,"4":99,"5":100,"6":255,"7":104,"8":105}`,
		`{"type":"EncodedBuffer","data":"base64:AAEJCmNk/2hp"}`,
		`[0,1,9,10,99,100,255,104,105]`,
	} {
		got, closing, err := AppendChunkData([]byte("pre"), []byte(enc))
		if err != nil || closing || string(got) != "pre"+string(data) {
			t.Errorf("%s: %q %v %v", enc, got, closing, err)
		}
	}
	if _, closing, err := AppendChunkData(nil, []byte(`"`+StreamClosingBit+`"`)); err != nil || !closing {
		t.Fatalf("closing: %v %v", closing, err)
	}
	if got, _, err := AppendChunkData(nil, []byte(`{"type":"Buffer","data":[]}`)); err != nil || len(got) != 0 {
		t.Fatalf("empty: %v", err)
	}
	for _, bad := range []string{`"hello"`, `{"type":"Buffer","data":[256]}`, `{"type":"Buffer","data":[01]}`, `{"type":"Buffer","data":[-1]}`,
		`{"type":"Buffer","data":[1.0]}`, `{"1":1}`, `{"0":1,"0":2}`, `{"type":"EncodedBuffer","data":"AAEJ"}`, `12`, `null`, `[1,]`} {
		if _, _, err := AppendChunkData(nil, []byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

// TestStreamFrames: the frames one end writes read back as that end's peer reads them.
func TestStreamFrames(t *testing.T) {
	chunk := AppendChunkFrame(nil, "s", "c1", []byte("ab"), true, false)
	f, err := ReadStreamFrameBody(chunk)
	if err != nil || !f.Request.Present || f.Response.Present || f.Request.MainPurpose != "chunk" || f.Request.CycleID != "c1" || !f.Request.Next {
		t.Fatalf("chunk: %+v %v", f, err)
	}
	if b, _, _ := AppendChunkData(nil, f.Request.ChunkData); string(b) != "ab" {
		t.Fatalf("chunk data %q", b)
	}
	if !IsStreamClosing(AppendChunkFrame(nil, "s", "c2", nil, false, true)) {
		t.Fatal("closing frame not closing")
	}
	ka, _ := ReadStreamFrameBody(AppendKeepAliveFrame(nil, "s", "c3", false))
	if ka.Request.MainPurpose != "keepAlive" || !ka.Request.HasKeepAlive || ka.Request.KeepAlive {
		t.Fatalf("keepAlive: %+v", ka)
	}
	ans := AppendStreamAnswer(nil, StreamAnswer{StreamID: "s", CycleID: "c1", Purpose: "feedback", Backpressure: true,
		Refusal: RelayRequestInvalid.Refuse("closure over the limit")})
	a, err := ReadStreamFrameBody(ans)
	if err != nil || a.Request.Present || a.Response.CycleID != "c1" || !a.Response.Backpressure || !strings.HasPrefix(a.ErrorText, "relay-request-invalid: ") {
		t.Fatalf("answer: %+v %v", a, err)
	}
	if id, ok := ReadStreamFrameID(nil, []byte(`{"streamId":"s"}`)); !ok || id != "s" {
		t.Fatal("answer's stream id")
	}
	if err := strictjson.Valid(ans); err != nil {
		t.Fatal(err)
	}
	if err := strictjson.Valid(AppendFeedbackFrame(nil, "s", "c4")); err != nil {
		t.Fatal(err)
	}
}
