// Package corestore is the relay's HTTP client for node Corestores (SPEC §9): TLS-verified, with
// bounded time and response size, no redirects, and errors classified as unreachable or refused.
package corestore
