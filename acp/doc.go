// Package acp serves the Agent Client Protocol terminal methods over
// newline-delimited JSON-RPC 2.0, backed by sandbox sessions.
package acp
