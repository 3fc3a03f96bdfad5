// Package registry forwards the OCI distribution API (/v2/) from nodes to the registry upstream
// (docs/protocol.md#registry-forwarding), streaming, with a digest-verified disk cache that serves content only after the
// upstream authorized the same request. It holds no credential of its own and never reads,
// stores or logs a caller's: Authorization goes upstream untouched, the registry's challenge and
// errors come back untouched.
//
// A request under /v2/ is judged once (ServeHTTP):
//
//	not a clean /v2 path                          → 400 registry-path-invalid, nothing forwarded
//	HEAD, a tag, an upload, a query, sha512, …    → forwarded as it is (forward.go)
//	GET blob|manifest by sha256 with Range        → stored: authorize, then serve the range
//	                                                 from the file; else forwarded
//	GET blob|manifest by sha256                   → one of (cache.acquire):
//	    stored object   authorize (HEAD, caller's credentials) → 2xx: serve the file
//	                                                            → else: forward the caller's request
//	    fill running    authorize → join: tail the fill's file as it grows
//	    nothing         lead: a new fill sends the caller's GET upstream; a cacheable 200 is
//	                    written to a temporary file that the leader and later joiners tail,
//	                    hashed, and published by rename once it verifies (fill.go)
//
// Every caller of a fill gets the object's last byte only after the whole object hashed to its
// digest; a fill that fails cuts its callers' answers short of Content-Length, so a client sees
// a broken transfer, never a complete wrong one. The cache is bounded (LRU, cache.go); a
// directory that cannot be written is served around, uncached and counted.
//
// Every request sent upstream holds a slot (slots.go) charged to the caller's source address: at
// most 8 fetches (forwards and fills) per address and 64 in all, and a pool of its own for the
// authorization HEADs of hits and joins, so that a hit never waits behind misses. A wait for a
// slot is bounded (10 s), then refused 503 registry-upstream-busy with Retry-After. A caller that
// takes its answer slower than 64 KiB/s, judged on the time the relay spends writing to it over
// 30 s windows, is cut (progress.go), and with it goes the forward's upstream connection.
//
// It never caches tags, partial answers or anything but sha256, never serves a stored byte to a
// caller the upstream did not answer with a 2xx for that very request, never follows a redirect
// off the upstream's origin to plain http or to an address that is not public (redirect.go), and
// never lets a caller that stops reading or sending hold a handler past the progress timeout
// (progress.go).
package registry
