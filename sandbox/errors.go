package sandbox

import (
	"errors"
	"fmt"
	"strings"
)

// ErrNotFound is returned for a session or terminal id that does not exist
// (or no longer does).
var ErrNotFound = errors.New("not found")

// ErrInvalid is returned for a request that is wrong in itself: a relative
// cwd, a NUL byte, a limit above the maximum. Its message names the field.
var ErrInvalid = errors.New("invalid request")

// Reason returns err's message without its leading "invalid request: ":
// the words for a bad flag or setting rather than a peer's request.
func Reason(err error) string {
	return strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": ")
}

// ErrLimit is returned when a configured maximum (sessions, terminals) is
// reached.
var ErrLimit = errors.New("limit reached")

// ConfigError names the file, line and key of a bad setting.
type ConfigError struct {
	File string
	Line int // 0 when unknown
	Key  string
	Err  error
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	if e.Key != "" {
		fmt.Fprintf(&b, ": %s", e.Key)
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	return b.String()
}

func (e *ConfigError) Unwrap() error { return e.Err }

// RemoveError is GC failing to remove some of the containers it listed:
// unlike its other errors, it comes with a complete account of what was
// removed.
type RemoveError struct{ Err error }

func (e *RemoveError) Error() string { return e.Err.Error() }

func (e *RemoveError) Unwrap() error { return e.Err }
