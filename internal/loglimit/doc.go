// Package loglimit keeps a flood of one kind of log line, which a peer can
// cause, down to one line a second that counts the lines left out.
package loglimit
