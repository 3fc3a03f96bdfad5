package contracts

import (
	"testing"
)

// Benchmarks of the readers on the relay's hot and large paths: the escrow binds one apply answer
// per release (10 000 at a slot) and reads a 23-renewal hold per node; a registration, a
// configuration push and a Corestore summary are read once each. Compare runs of the same
// command (-count, benchstat), never absolute times: the machine is shared.

func BenchmarkBindApplyAnswer(b *testing.B) {
	h := testRun(b, 1, tenMinutes, MaximumDnsLeaseMs)
	sent := h.Renewals[0].Renewal.Reference()
	answer := []byte(`{"status":"accepted","renewal":{"projection":` + string(testProjection.AppendJSON(nil)) +
		`,"sequence":1,"digest":"` + sent.Digest + `"}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := BindApplyRuntimeNetworkDnsLeaseRenewalResponse(answer, sent); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadHold23(b *testing.B) {
	h := testRun(b, 23, tenMinutes, MaximumDnsLeaseMs)
	body := h.AppendJSON(nil)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ReadHoldRuntimeNetworkDnsLeaseRenewalsRequest(body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadClusterIngressRegistration(b *testing.B) {
	body := []byte(`{"bearer":"s3cret-bearer-value","version":"3.0.0","nodeId":"node-a","capabilities":["a","b"],"protocol":` + offer32 + `}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ReadClusterIngressRegistration(body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadClusterRelayConfigPush(b *testing.B) {
	body := []byte(`{"config":{"clusterId":"cluster-a","relay":{"origin":"https://relay.example:8443"},"corestores":[` +
		`{"nodeId":"n1","origin":"https://192.0.2.17:7443"},{"nodeId":"n2","origin":"https://192.0.2.18:7443"}]}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ReadClusterRelayConfigPush(body, false); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkProjectIsolatedRestoreProgress(b *testing.B) {
	summary := []byte(`{"restoreId":"restore-1","stagingArchiveId":"staging-1","status":"prepared","revision":2,"lastFence":1,` +
		`"expectedObjects":2,"receivedObjects":0,"completedMappings":0,"totalMappings":3,"preparedAt":1,"updatedAt":2,` +
		`"stagedObject":{"key":"a","nextIndex":3}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := ProjectIsolatedRestoreProgress("node-a", summary); err != nil {
			b.Fatal(err)
		}
	}
}
