package contracts

import (
	"bytes"
	"crypto/ecdh"
	"encoding/json"
	"testing"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// FuzzPlatformReaders: the readers of the Corestore platform agent never panic, never keep a
// binding of an invalid node, and keep every opaque member as a sub-slice Valid JSON; a split
// body is Valid JSON whose members are the bytes read.
func FuzzPlatformReaders(f *testing.F) {
	for _, s := range []string{desiredState, `{"capabilities":{},"providerConfigs":{},"bindings":[]}`,
		`{"backups":[{"backupId":"b","serviceId":"s","descriptor":{}}]}`, `{"restores":[{"backupId":"b","serviceId":"s"}]}`,
		`{"descriptor":{},"closure":{"_isVirtualStream":true,"streamId":"x"}}`, `{"accepted":true}`,
		`{"enrollmentId":"e","challenge":"c"}`, `{"nodeId":"n","envelope":"e"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if st, err := ReadPlatformDesiredState(in); err == nil {
			nodes := []string{"n"}
			for _, b := range st.Bindings {
				if !IsClusterNodeID(b.NodeID) || strictjson.Valid(b.Binding) != nil {
					t.Fatalf("binding %+v", b)
				}
				nodes = append(nodes, b.NodeID)
			}
			for _, body := range st.SplitByNode(nodes) {
				if strictjson.Valid(body) != nil {
					t.Fatalf("split body not JSON: %s", body)
				}
			}
		}
		if bs, _, err := ReadCorestoreBackups(in); err == nil {
			for _, b := range bs {
				if !IsCanonicalID(b.BackupID) || strictjson.Valid(b.Descriptor) != nil {
					t.Fatalf("backup %+v", b)
				}
			}
		}
		if rs, _, err := ReadCorestoreRestores(in); err == nil {
			for _, r := range rs {
				if !IsCanonicalID(r.BackupID) || !IsCanonicalID(r.ServiceID) {
					t.Fatalf("restore %+v", r)
				}
			}
		}
		if r, err := ReadRestoreClosureResponse(in); err == nil && (r.StreamID == "" || strictjson.Valid(r.Descriptor) != nil) {
			t.Fatalf("restore answer %+v", r)
		}
		ReadBackupClosureResponse(in)
		ReadEnrollment(in)
		if p, err := ReadCorestoreCredentialPush(in); err == nil && !IsClusterNodeID(p.NodeID) {
			t.Fatalf("push %+v", p)
		}
		if k, err := ReadBeginEnrollment(in); err == nil && k.Curve() != ecdh.X25519() {
			t.Fatal("not an X25519 key")
		}
	})
}

// FuzzStreamChunks: chunk data that reads reads to what encoding/json makes of it (a Buffer's or
// a plain array's bytes), and the relay's own encoding of any bytes reads back to them.
func FuzzStreamChunks(f *testing.F) {
	f.Add([]byte(`{"type":"Buffer","data":[1,2,255]}`), []byte("ab"))
	f.Add([]byte(`{"0":104,"1":105}`), []byte{0, 255})
	f.Add([]byte(`{"type":"EncodedBuffer","data":"base64:aGk="}`), []byte{})
	f.Add([]byte(`"#############CLOSING BIT#############"`), []byte("x"))
	f.Add(AppendChunkFrame(nil, "s", "c", []byte("hi"), true, false), []byte("y"))
	f.Fuzz(func(t *testing.T, in, data []byte) {
		got, closing, err := AppendChunkData(nil, in)
		if err == nil && !closing {
			var ref struct {
				Type string `json:"type"`
				Data []int  `json:"data"`
			}
			var arr []int
			switch {
			case json.Unmarshal(in, &arr) == nil && strictjson.KindOf(in) == strictjson.KindArray:
				checkInts(t, in, arr, got)
			case json.Unmarshal(in, &ref) == nil && ref.Type == "Buffer":
				checkInts(t, in, ref.Data, got)
			}
		}
		if _, err := ReadStreamFrameBody(in); err == nil {
			_ = err
		}
		back, closing, err := AppendChunkData(nil, AppendBufferChunk(nil, data))
		if err != nil || closing || !bytes.Equal(back, data) {
			t.Fatalf("round trip of %x: %x %v", data, back, err)
		}
	})
}

func checkInts(t *testing.T, in []byte, ref []int, got []byte) {
	if len(ref) != len(got) {
		t.Fatalf("%s: %d bytes, reference %d", in, len(got), len(ref))
	}
	for i, v := range ref {
		if v != int(got[i]) {
			t.Fatalf("%s: byte %d is %d, reference %d", in, i, got[i], v)
		}
	}
}
