//go:build !linux

package registry

import "os"

// preallocate is a no-op where the standard library offers no fallocate: a full disk is then
// found by the first write that fails.
func preallocate(*os.File, int64) error { return nil }
