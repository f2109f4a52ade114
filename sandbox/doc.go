// Package sandbox runs commands for one agent session inside a hardened
// per-session container: Session is the container, Terminal one docker exec
// in it, OutputBuffer the byte-limited tail of a terminal's output.
package sandbox
