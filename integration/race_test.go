//go:build race

package integration

// raceEnabled builds sandboxd with the race detector when the tests run
// with it, so `go test -race ./integration` checks the daemon too.
const raceEnabled = true
