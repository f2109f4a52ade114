// Package acp speaks the Agent Client Protocol for sandboxd: it serves the
// terminal methods over newline-delimited JSON-RPC 2.0, backed by sandbox
// sessions, and proxies between an editor and the agent it starts.
package acp
