// Package restore carries the five isolated-restore control methods from Cloudly to a node's
// Corestore (docs/protocol.md#isolated-restore-and-corestore): prepareIsolatedRestoreOnNode, stageIsolatedRestoreArchive,
// getIsolatedRestoreProgressOnNode, executeIsolatedRestoreOnNode and cleanupIsolatedRestoreOnNode,
// each { nodeId, control } → { progress }.
//
// Flow of one call: read { nodeId, control } exactly, the control unparsed and refused only above
// 1 MiB (relay-request-invalid; Corestore enforces isolatedRestoreContractLimits); find the node's
// Corestore origin (from the newest pushClusterRelayConfig), else restore-node-not-carried; take a
// slot of the per-node and overall call bounds, else relay-node-busy; then, on its own goroutine,
// post the control to Corestore through the Corestore port and answer { progress } = Corestore's
// summary + the carried nodeId, checked with normalizeIsolatedRestoreProgress, or the refusal
// restore-node-unreachable / restore-node-refused.
//
// The control holds a bearer grant. The package forwards it byte for byte, adds nothing to it,
// never parses it, and never logs, stores or quotes a control: logs name the node, method,
// sizes and outcome only. It does not tie an answer to its restore: the control names neither,
// so that is Cloudly's bindIsolatedRestoreProgressToNode.
package restore
