package strictjson

import (
	"errors"
	"testing"
)

// TestDecodeBytesReadsEveryForm: each form JavaScript writes bytes in reads back to the same
// bytes, appended to what dst held; AppendNodeBuffer writes the Buffer form within its bound.
func TestDecodeBytesReadsEveryForm(t *testing.T) {
	data := []byte{0, 1, 9, 10, 99, 100, 255}
	buffer := AppendNodeBuffer(nil, data)
	if string(buffer) != `{"type":"Buffer","data":[0,1,9,10,99,100,255]}` || len(buffer) > MaxNodeBufferLen(len(data)) {
		t.Fatalf("AppendNodeBuffer = %s (bound %d)", buffer, MaxNodeBufferLen(len(data)))
	}
	for _, enc := range []string{
		string(buffer),
		` [0, 1 ,9,10 , 99,100,255] `,
		`{"0":0,"1":1,"2":9,"3":10,"4":99,"5":100,"6":255}`,
		`{"type":"EncodedBuffer","data":"base64:AAEJCmNk/w=="}`,
	} {
		got, err := DecodeBytes([]byte("pre"), []byte(enc))
		if err != nil || string(got) != "pre"+string(data) {
			t.Errorf("DecodeBytes(%s) = %v, %v; want pre + %v", enc, got, err, data)
		}
	}
	if got, err := DecodeBytes(nil, []byte(`{"type":"Buffer","data":[]}`)); err != nil || len(got) != 0 {
		t.Errorf("an empty Buffer: %v, %v", got, err)
	}
}

// TestDecodeBytesRefuses: what is not one of the forms, or holds a value no byte has, is ErrBytes,
// and dst comes back as it was.
func TestDecodeBytesRefuses(t *testing.T) {
	for _, bad := range []string{
		`"bytes"`, `null`, `12`, `[256]`, `[-1]`, `[01]`, `[1.0]`, `[1e2]`, `[1,]`, `[1 2]`, `{"1":1}`, `{"0":1,"2":2}`,
		`{"0":"1"}`, `{"type":"Buffer"}`, `{"type":"EncodedBuffer","data":"AAE="}`, `{"type":"EncodedBuffer","data":"base64:!!"}`,
		`{"type":"Buffer","data":[1],"type":"Buffer"}`,
	} {
		got, err := DecodeBytes([]byte("pre"), []byte(bad))
		if !errors.Is(err, ErrBytes) || string(got) != "pre" {
			t.Errorf("DecodeBytes(%s) = %q, %v; want pre and ErrBytes", bad, got, err)
		}
	}
}
