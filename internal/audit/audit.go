package audit

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
)

// Event kinds.
const (
	AgentStart   = "agent_start"
	AgentEnd     = "agent_end"
	CommandStart = "command_start"
	CommandEnd   = "command_end"
	Egress       = "egress"
)

// Event is one line of the log. Fields that do not apply to its kind are
// left out; docs/contain.md lists which apply to which.
type Event struct {
	Time  time.Time `json:"time"` // RFC 3339 with nanoseconds
	Event string    `json:"event"`
	// Session is the ACP session a command ran for, or the container's
	// session for the agent and its egress.
	Session  string   `json:"session,omitempty"`
	Terminal string   `json:"terminal,omitempty"`
	Argv     []string `json:"argv,omitempty"`
	Cwd      string   `json:"cwd,omitempty"`
	// ExitCode or Signal, at an end; neither when it is not known.
	ExitCode *int    `json:"exit_code,omitempty"`
	Signal   *string `json:"signal,omitempty"`
	// DurationMS is the time from start to end, in milliseconds.
	DurationMS *float64 `json:"duration_ms,omitempty"`
	// OutputBytes is all a command wrote, kept or not.
	OutputBytes *int64 `json:"output_bytes,omitempty"`

	Method  string `json:"method,omitempty"`
	Host    string `json:"host,omitempty"`
	Port    int    `json:"port,omitempty"`
	Allowed *bool  `json:"allowed,omitempty"`
	// Reason says why an egress request was refused, or failed.
	Reason string `json:"reason,omitempty"`
	// BytesSent and BytesReceived are to and from the destination.
	BytesSent     *int64 `json:"bytes_sent,omitempty"`
	BytesReceived *int64 `json:"bytes_received,omitempty"`
	// LeftOut counts the egress refusals not logged before this event,
	// which keeps a flood of them down.
	LeftOut int `json:"left_out,omitempty"`
}

// Duration sets DurationMS to d.
func (e *Event) Duration(d time.Duration) {
	ms := float64(d.Microseconds()) / 1000
	e.DurationMS = &ms
}

// Log appends events to a file. A nil *Log drops them.
type Log struct {
	mu  sync.Mutex
	f   *os.File
	err error // the first failed write, after which nothing is written
}

// Open opens (creating it, mode 0600) the log file to append to: a
// regular file, by a path with no symbolic link in any component, and
// without waiting for a reader should it be a FIFO.
func Open(path string) (*Log, error) {
	f, err := openNoLinks(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|syscall.O_NONBLOCK, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("audit log: %s is not a regular file", path)
	}
	return &Log{f: f}, nil
}

// Write appends ev, stamped with the time now unless it has one, as one
// line in one write: lines of concurrent writers, also of other
// processes appending to the same file, never interleave. It returns the
// first error writing met; later events are dropped.
func (l *Log) Write(ev Event) error {
	if l == nil {
		return nil
	}
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	b = append(b, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	if _, err := l.f.Write(b); err != nil {
		l.err = fmt.Errorf("audit log: %w", err)
		return l.err
	}
	return nil
}

// Close closes the file.
func (l *Log) Close() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Close()
}
