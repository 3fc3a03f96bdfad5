package contracts

import (
	"strings"
	"testing"
)

func TestNodeIDAndCanonicalIDDiffer(t *testing.T) {
	cases := []struct {
		s               string
		node, canonical bool
	}{
		{"node-a", true, true},
		{"-abc", true, false},
		{"_abc", true, false},
		{"a:b.c", false, true},
		{strings.Repeat("n", 128), true, true},
		{strings.Repeat("n", 129), false, true},
		{strings.Repeat("c", 200), false, true},
		{strings.Repeat("c", 201), false, false},
		{"", false, false},
		{"a b", false, false},
		{"é", false, false},
	}
	for _, c := range cases {
		if IsClusterNodeID(c.s) != c.node || IsCanonicalID(c.s) != c.canonical {
			t.Errorf("%q: node %v canonical %v; want %v %v", c.s, IsClusterNodeID(c.s), IsCanonicalID(c.s), c.node, c.canonical)
		}
	}
}

func TestReadReplicaID(t *testing.T) {
	for s, want := range map[string]ReplicaID{"node-a.0": {"node-a", 0}, "-x.12": {"-x", 12}, "a.b.3": {}} {
		got, ok := ReadReplicaID(s)
		if (want == ReplicaID{}) {
			if ok {
				t.Errorf("%q read as %+v", s, got)
			}
			continue
		}
		if !ok || got != want {
			t.Errorf("ReadReplicaID(%q) = %+v, %v", s, got, ok)
		}
	}
	for _, s := range []string{"node-a.01", "node-a", "node-a.", ".1", "node-a.-1", "node-a.1x"} {
		if _, ok := ReadReplicaID(s); ok {
			t.Errorf("%q accepted as a replica id", s)
		}
	}
}

func TestIsCanonicalUUID(t *testing.T) {
	if !IsCanonicalUUID("123e4567-e89b-42d3-a456-426614174000") {
		t.Error("canonical UUID refused")
	}
	for _, s := range []string{"123E4567-E89B-42D3-A456-426614174000", "123e4567e89b42d3a456426614174000", "123e4567-e89b-42d3-a456-42661417400"} {
		if IsCanonicalUUID(s) {
			t.Errorf("%q accepted", s)
		}
	}
}

func TestIsPlausibleUnicastIPv4(t *testing.T) {
	for s, want := range map[string]bool{
		"192.0.2.17": true, "10.0.0.1": true, "127.0.0.1": false, "169.254.1.1": false, "0.0.0.0": false,
		"224.0.0.1": false, "255.255.255.255": false, "::1": false, "192.0.2.017": false, "relay.example": false,
	} {
		if IsPlausibleUnicastIPv4(s) != want {
			t.Errorf("IsPlausibleUnicastIPv4(%q) = %v", s, !want)
		}
	}
}
