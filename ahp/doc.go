// Package ahp serves the Agent Host Protocol terminal channel: shared PTY
// terminals in a session container over WebSocket.
package ahp
