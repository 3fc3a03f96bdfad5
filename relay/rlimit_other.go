//go:build !unix

package relay

// descriptorLimit is unknown here: the downstream has no descriptor cap of its own.
func descriptorLimit() int { return 0 }
