// Package platform is the relay's Corestore platform agent (docs/platform.md): it carries Cloudly's
// platform desired state to each node's Corestore, database backups off the cluster and restores
// onto it, over the relay's one Cloudly socket, for a cluster nothing may dial into.
//
// What it owns:
//
//   - The desired state: getClusterPlatformDesiredState pulled on attach, after each
//     configuration push and every 60 s, split per node by each placement's nodeId, and handed
//     to that node's Corestore (PUT /platform/desired-state), the newest only, retried with
//     backoff while the Corestore cannot be reached.
//   - Backups, node → Cloudly: each Corestore's ready backups listed (first within 5 s of attach,
//     then every 30 s); each closure read from Corestore and written into
//     backupServiceDatabaseClosure as a VirtualStream it opens; Corestore is told the backup was
//     delivered only on { accepted: true }.
//   - Restores, Cloudly → node: each Corestore's wanted restores listed; for each,
//     restoreServiceDatabaseClosure with that node's id, and the closure Cloudly streams back
//     written into Corestore (PUT /platform/restores/<id>/closure).
//   - The credential: after each attach it enrols as a secret recipient (an X25519 key pair in
//     memory, beginSecretRecipientEnrollment, completeSecretRecipientEnrollment); Cloudly then
//     pushes each node's Corestore credential sealed to that key (pushCorestoreCredential), which
//     it presents as Authorization: Bearer to that node's Corestore only.
//
// How: one goroutine pair per node with a Corestore (its desired state; its listings and
// closures, up to two at once), so that one node's slow or absent Corestore never delays another's;
// closures in flight bounded across nodes; every closure byte in flight charged to the relay's
// peer memory budget (feature.Memory) and never held whole; a closure past 256 MiB aborted and
// refused relay-request-invalid to the side that sent it.
//
// What it never does: log, store or show a credential, a key, a descriptor, a binding or a chunk;
// write anything to disk; judge the opaque members it forwards (capabilities, providerConfigs,
// binding, descriptor are Cloudly's and Corestore's bytes, passed on untouched); act when the
// configuration names no Corestore.
package platform
