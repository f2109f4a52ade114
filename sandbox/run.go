package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"

	"github.com/sandboxd/sandboxd/console"
)

// Run runs one command in a fresh session and removes the session's
// container afterwards. It returns the exit code to pass on: the command's
// own, or 128+n when signal n ended it. When ctx ends (Ctrl-C), the command
// is killed and its status returned as usual.
//
// A write to cmd.Stdout or cmd.Stderr that fails with EPIPE (the reader of
// `sandboxd run ... | head` went away; sandboxd does not die of SIGPIPE)
// ends the command the same way, and Run returns 128+SIGPIPE, what a
// shell reports for a command that SIGPIPE ended.
//
// A TTY command is resized to each size that comes on resize, which may be
// nil.
func Run(ctx context.Context, m *Manager, spec SessionSpec, cmd Command, resize <-chan console.Size) (int, error) {
	// The session must be removed even when ctx is already cancelled.
	cleanup := context.WithoutCancel(ctx)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	for _, w := range []*io.Writer{&cmd.Stdout, &cmd.Stderr} {
		if *w != nil {
			*w = pipeWriter{*w, cancel}
		}
	}
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
	t, err := s.Start(ctx, cmd)
	if err != nil {
		return 0, err
	}
	if cmd.TTY && resize != nil {
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
		st, err = t.Wait(cleanup)
		if err != nil {
			return 0, err
		}
		if errors.Is(context.Cause(ctx), errBrokenPipe) {
			return 128 + int(syscall.SIGPIPE), nil
		}
	}
	return ExitCode(st), nil
}

var errBrokenPipe = errors.New("output reader went away")

// pipeWriter passes writes on to w and ends the run at the first that
// fails with EPIPE.
type pipeWriter struct {
	w      io.Writer
	cancel context.CancelCauseFunc
}

func (p pipeWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	if errors.Is(err, syscall.EPIPE) {
		p.cancel(errBrokenPipe)
	}
	return n, err
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
