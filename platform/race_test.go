//go:build race

package platform_test

// raceEnabled: under the race detector a 200 MiB closure takes minutes; the large tests run a
// smaller closure there and the full size without it.
const raceEnabled = true
