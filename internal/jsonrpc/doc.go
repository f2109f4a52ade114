// Package jsonrpc defines the JSON-RPC 2.0 error codes that sandboxd's
// protocols answer with, once for both ACP and AHP.
package jsonrpc
