// Package testenv is the top floor of the house: the simulated peers (sim) and the relay
// harnesses (relaytest, kubeapi) that tests, `relay-dev` and the benchmarks stand on. Its
// packages may import any part of the relay; no part of the relay imports them, so test support
// never sits below what it tests.
package testenv
