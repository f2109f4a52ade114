// Package egress is the only way out of a contained agent's container: an
// HTTP proxy (CONNECT and plain HTTP forwarding) on a unix socket that lets
// through only the destinations an allowlist names, resolving names itself
// and refusing private and loopback addresses unless listed exactly. The
// forwarder the container runs to reach it is built from forward/main.go.
package egress
