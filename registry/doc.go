// Package registry forwards the OCI distribution API (/v2/) from nodes to the registry upstream
// (SPEC §10), streaming, with a digest-verified disk cache that serves content only after the
// upstream authorized the same request.
package registry
