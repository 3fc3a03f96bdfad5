package ha

import (
	"context"
	"encoding/json"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"code.foss.global/serve.zone/relay/testenv/kubeapi"
)

// TestStandbyPodIsJudgedThroughTheAPI: against a real API server, as the relay's service account,
// a standby's { pod } is taken only for a Pod that exists in the namespace with this relay's own
// Pod's release labels.
func TestStandbyPodIsJudgedThroughTheAPI(t *testing.T) {
	s := kubeapi.Start(t)
	const ns = "release"
	s.SetupNamespace(ns)
	for _, pod := range []string{"relay-a", "relay-b", "other-c"} {
		s.CreatePod(ns, pod, "127.0.0.1")
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{"app.kubernetes.io/name": "other"}}})
	if _, err := s.Client(kubeapi.Admin).CoreV1().Pods(ns).Patch(context.Background(), "other-c", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{LeaseName: "relay", Namespace: ns, Identity: "relay-a", PodName: "relay-a", PodIP: "127.0.0.1",
		Client: s.Client(kubeapi.Relay), Parts: []Part{{Prefix: "run/", Part: newMemPart()}}})
	if err != nil {
		t.Fatal(err)
	}
	for pod, ok := range map[string]bool{"relay-b": true, "relay-ghost": false, "other-c": false} {
		err := e.rep.p.checkPod(context.Background(), pod)
		if (err == nil) != ok {
			t.Errorf("%s: %v", pod, err)
		}
	}
}
