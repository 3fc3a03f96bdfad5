// Package kubeapi runs a real Kubernetes control plane for tests: one etcd and one
// kube-apiserver on loopback, with static-token users (an admin in system:masters and a user
// for the relays that RBAC confines to a Role), so that the relay's high-availability code (docs/ha.md:
// a client-go Lease election, Pod labels) is tested against the API server it will meet in a
// cluster rather than against a fake clientset. No kubelet, controller manager or scheduler runs:
// Pod objects are created by the test, their status written through the status subresource.
//
// It owns the two child processes, their temporary data, certificates, tokens and logs, and
// cleans them up with the test. The binaries are built once from the Go module proxy by
// build.sh in this directory and cached (see Binaries); without them a test skips (see Require).
//
// This is test support only: the relay's own packages never import it.
package kubeapi
