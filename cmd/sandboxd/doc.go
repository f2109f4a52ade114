// Command sandboxd runs AI agents' shell commands in hardened per-session
// containers. It parses flags and wires the packages that do the work.
package main
