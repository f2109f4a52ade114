package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Size is a terminal's size in characters.
type Size struct {
	Cols, Rows uint
}

// RunOptions are what a run needs of the user's terminal, if any.
type RunOptions struct {
	// Resize brings each new size of a TTY command's terminal; nil for
	// none.
	Resize <-chan Size
	// Stdin, when set, returns the command's input; exited is closed
	// when the command exits, where a reader of the user's terminal
	// stops, so that keys typed after it reach the user's shell.
	Stdin func(exited <-chan struct{}) io.Reader
	// Starting, when set, is called once the container is ready, just
	// before the command starts (to put the user's terminal in raw
	// mode: until then Ctrl-C is sandboxd's); an error ends the run.
	Starting func() error
}

// Run runs one command in a fresh session and removes the session's
// container afterwards. It returns the exit code to pass on: the command's
// own, or 128+n when signal n ended it. When ctx ends (Ctrl-C), the command
// is killed and its status returned as usual. A TTY command is resized to
// each size that comes on opts.Resize.
//
// A write to cmd.Stdout or cmd.Stderr that fails ends the command the same
// way: with EPIPE (the reader of `sandboxd run ... | head` went away;
// sandboxd does not die of SIGPIPE) Run returns 128+SIGPIPE, what a shell
// reports for a command that SIGPIPE ended, whether or not the command was
// done by then; with another error (a full disk) it returns that error.
// Output that a reader stopped taking does not hold the run up once it is
// stopping (runOutput).
func Run(ctx context.Context, m *Manager, spec SessionSpec, cmd Command, opts RunOptions) (int, error) {
	// The session must be removed even when ctx is already cancelled.
	cleanup := context.WithoutCancel(ctx)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var outputs []*runOutput
	for _, w := range []*io.Writer{&cmd.Stdout, &cmd.Stderr} {
		if *w != nil {
			o := newRunOutput(*w, cancel, ctx.Done())
			outputs = append(outputs, o)
			*w = o
		}
	}
	image := spec.Image
	if image == "" {
		image = m.cfg.Session.Image
	}
	// The reaper's line comes on stderr; on a terminal, where the command
	// runs behind a shell that sizes it (ttySize), the shell's.
	var msg *reaperMessage
	switch {
	case cmd.Stderr != nil:
		msg = &reaperMessage{w: cmd.Stderr, image: image}
		cmd.Stderr = msg
	case cmd.TTY && cmd.Stdout != nil:
		msg = &reaperMessage{w: cmd.Stdout, image: image, terminal: true}
		cmd.Stdout = msg
	}
	code, err := run(ctx, cleanup, m, spec, cmd, opts)
	// What is held back and queued goes out before the code is known: a
	// write that fails at the very end fails the run too.
	if msg != nil {
		msg.flush()
	}
	for _, o := range outputs {
		o.close(outputGrace)
	}
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, syscall.EPIPE):
		// Also when the command was done by then: not all of its
		// output reached the reader.
		return 128 + int(syscall.SIGPIPE), nil
	case errors.As(cause, new(*outputError)):
		return 0, cause
	}
	return code, err
}

func run(ctx, cleanup context.Context, m *Manager, spec SessionSpec, cmd Command, opts RunOptions) (int, error) {
	s, err := m.Open(ctx, "run\x00"+spec.ID, spec)
	if err != nil {
		return 0, err
	}
	defer s.Close(cleanup)
	// Interrupted while the container started (which sees itself through
	// whatever the caller does): the command is not to run at all.
	if ctx.Err() != nil {
		return 0, fmt.Errorf("stopped before the command started (%w)", context.Cause(ctx))
	}
	zero := int64(0)
	if cmd.OutputLimit == nil {
		cmd.OutputLimit = &zero
	}
	if opts.Starting != nil {
		if err := opts.Starting(); err != nil {
			return 0, err
		}
	}
	exited := make(chan struct{})
	if opts.Stdin != nil {
		cmd.Stdin = opts.Stdin(exited)
	}
	t, err := s.Start(ctx, cmd)
	if err != nil {
		close(exited)
		return 0, err
	}
	go func() {
		<-t.Done()
		close(exited)
	}()
	if resize := opts.Resize; cmd.TTY && resize != nil {
		go func() {
			for {
				select {
				case size := <-resize:
					if err := t.Resize(ctx, size.Cols, size.Rows); err != nil {
						m.log.Debug("resize", "terminal", t.ID, "err", err)
					}
				case <-t.Done():
					return
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	st, err := t.Wait(ctx)
	if err != nil {
		if kerr := t.Kill(cleanup); kerr != nil {
			return 0, kerr
		}
		if st, err = t.Wait(cleanup); err != nil {
			return 0, err
		}
	}
	if st == (ExitStatus{}) {
		// The engine could not say (it went away): no code of the
		// command's, 255 say, may stand for it.
		return 0, errors.New("the command's exit status is unknown: the engine did not give it (if sandboxd cannot remove its container now, `sandboxd gc` will)")
	}
	return ExitCode(st), nil
}

// WorkDir returns where a run in workspace whose -w names dir (relative to
// workspace unless absolute) is to run, as the container shows it (the
// workspace at its own path). Links are resolved as the host would, in
// both: a link in the workspace that leads out of it is refused, and a
// path into the workspace through another link is taken.
func WorkDir(workspace, dir string) (string, error) {
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(workspace, dir)
	}
	realWS, err := filepath.EvalSymlinks(workspace)
	if err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(realWS, real)
	if err != nil || !Within(realWS, real) {
		if filepath.Clean(dir) != real {
			return "", fmt.Errorf("%s leads to %s, outside the workspace %s", dir, real, workspace)
		}
		return "", fmt.Errorf("%s is outside the workspace %s", dir, workspace)
	}
	inside := filepath.Join(workspace, rel)
	if err := CheckIsDir(inside); err != nil {
		return "", errors.New(strings.TrimPrefix(Reason(err), "cwd: "))
	}
	return inside, nil
}

// outputGrace is how long a run that is stopping waits for a reader to
// take the output still queued for it.
const outputGrace = 2 * time.Second

// outputError is the cause of a run ended by a failed write of its output.
type outputError struct{ err error }

func (e *outputError) Error() string { return "writing the command's output: " + e.err.Error() }

func (e *outputError) Unwrap() error { return e.err }

// runOutput passes a run's output on to w from a goroutine of its own, so
// that a reader that stops reading (`sandboxd run ... | less`, a FIFO
// nobody opens) never stops the stream from the engine being read: the
// kill of a stopping run waits for that stream, and Ctrl-C would do
// nothing. Writes wait for room while the run goes on; once it is
// stopping, what finds no room is dropped. The first write that fails ends
// the run (fail), with an outputError as its cause.
type runOutput struct {
	w        io.Writer
	fail     context.CancelCauseFunc
	stopping <-chan struct{}
	queue    chan []byte
	done     chan struct{}

	mu     sync.Mutex
	closed bool
}

func newRunOutput(w io.Writer, fail context.CancelCauseFunc, stopping <-chan struct{}) *runOutput {
	o := &runOutput{w: w, fail: fail, stopping: stopping, queue: make(chan []byte, 16), done: make(chan struct{})}
	go o.write()
	return o
}

func (o *runOutput) write() {
	defer close(o.done)
	failed := false
	for b := range o.queue {
		if failed {
			continue
		}
		if _, err := o.w.Write(b); err != nil {
			failed = true
			o.fail(&outputError{err})
		}
	}
}

// Write queues a copy of p; it never fails, for the stream must go on
// being read whatever becomes of the output.
func (o *runOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return len(p), nil
	}
	b := bytes.Clone(p)
	select {
	case o.queue <- b:
	case <-o.stopping:
		select {
		case o.queue <- b:
		default:
		}
	}
	return len(p), nil
}

// close waits for what is queued to be written; once the run is stopping,
// for no longer than grace. Later writes are dropped.
func (o *runOutput) close(grace time.Duration) {
	o.mu.Lock()
	o.closed = true
	close(o.queue)
	o.mu.Unlock()
	select {
	case <-o.done:
	case <-o.stopping:
		select {
		case <-o.done:
		case <-time.After(grace):
		}
	}
}

// ExitCode is the shell's view of a status: the exit code, 128+n for a
// signal, and 255 when nothing is known.
func ExitCode(st ExitStatus) int {
	switch {
	case st.ExitCode != nil:
		return *st.ExitCode
	case st.Signal != nil:
		for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT} {
			if SignalName(sig) == *st.Signal {
				return 128 + int(sig)
			}
		}
		var n int
		if _, err := fmt.Sscanf(*st.Signal, "SIG%d", &n); err == nil {
			return 128 + n
		}
	}
	return 255
}

// reaperMessage passes a command's stderr on, but says in sandboxd's words
// what the reaper says in its own when the command cannot be started
// ("[FATAL tini (7)] exec x failed: No such file or directory"), or, on a
// terminal, the shell in front of the command that sizes it (ttySize):
// "sh: exec: line 0: x: not found". A name of sandboxd's inner workings is
// no help to whoever typed x.
type reaperMessage struct {
	w     io.Writer
	image string
	// terminal says the output is a terminal's. There nothing is held
	// back: a prompt or a key echoed must show at once, and the shell's
	// line comes in one write. Elsewhere the reaper's line may come in
	// pieces and is held back until it is whole; no shell stands in front
	// of the command, so a line of the shell's form is the command's own.
	terminal bool

	// mu orders the flush at the run's end after a write of a command
	// whose kill failed, which may still go on.
	mu   sync.Mutex
	head []byte // the output's start, while it may still be that line
	done bool   // it is not, or was rewritten: the rest passes
}

var (
	reaperFailure = regexp.MustCompile(`^\[FATAL tini \(\d+\)\] exec (.*) failed: (.*?)(\r?\n)`)
	shellFailure  = regexp.MustCompile(`^sh: (?:exec: line \d+|\d+: exec|line \d+: exec): (.*): (.*?)(\r?\n)`)
)

// reaperPrefix starts the line reaperFailure reads.
const reaperPrefix = "[FATAL tini ("

func (r *reaperMessage) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return r.w.Write(p)
	}
	r.head = append(r.head, p...)
	if !r.terminal && bytes.IndexByte(r.head, '\n') < 0 && len(r.head) < 4096 {
		if n := min(len(r.head), len(reaperPrefix)); string(r.head[:n]) == reaperPrefix[:n] {
			return len(p), nil // more to come before it can tell
		}
	}
	if err := r.flushLocked(); err != nil {
		return 0, err
	}
	return len(p), nil
}

// flush writes what is held back, rewritten if it is the reaper's line,
// and lets the rest pass.
func (r *reaperMessage) flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.flushLocked()
}

func (r *reaperMessage) flushLocked() error {
	r.done = true
	head := r.head
	r.head = nil
	m := reaperFailure.FindSubmatch(head)
	if m == nil && r.terminal {
		m = shellFailure.FindSubmatch(head)
	}
	if m != nil {
		msg := fmt.Sprintf("sandboxd: %s: %s (in %s, whose PATH is searched)%s", m[1], m[2], r.image, m[3])
		head = append([]byte(msg), head[len(m[0]):]...)
	}
	if len(head) == 0 {
		return nil
	}
	_, err := r.w.Write(head)
	return err
}
