// Package integration tests sandboxd end to end: the real binary, a real
// Docker Engine and real protocol peers.
package integration
