package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
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
	var reaperMsg *reaperMessage
	if m.reaper && cmd.Stderr != nil {
		image := spec.Image
		if image == "" {
			image = m.cfg.Session.Image
		}
		reaperMsg = &reaperMessage{w: cmd.Stderr, image: image}
		cmd.Stderr = reaperMsg
		// What it holds back goes out once the command is done.
		defer reaperMsg.flush()
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

// reaperMessage passes a command's stderr on, but says in sandboxd's words
// what the reaper says in its own when the command cannot be started
// ("[FATAL tini (7)] exec x failed: No such file or directory"): a name
// of sandboxd's inner workings is no help to whoever typed x.
type reaperMessage struct {
	w     io.Writer
	image string
	head  []byte // the output's start, while it may still be that line
	done  bool   // it is not, or was rewritten: the rest passes
}

var reaperFailure = regexp.MustCompile(`^\[FATAL tini \(\d+\)\] exec (.*) failed: (.*)\n`)

func (r *reaperMessage) Write(p []byte) (int, error) {
	if r.done {
		return r.w.Write(p)
	}
	r.head = append(r.head, p...)
	const prefix = "[FATAL tini ("
	n := min(len(r.head), len(prefix))
	nl := bytes.IndexByte(r.head, '\n')
	if string(r.head[:n]) == prefix[:n] && nl < 0 && len(r.head) < 4096 {
		return len(p), nil // more to come before it can tell
	}
	if err := r.flush(); err != nil {
		return 0, err
	}
	return len(p), nil
}

// flush writes what is held back, rewritten if it is the reaper's line,
// and lets the rest pass.
func (r *reaperMessage) flush() error {
	r.done = true
	head := r.head
	r.head = nil
	if m := reaperFailure.FindSubmatch(head); m != nil {
		msg := fmt.Sprintf("sandboxd: %s: %s (in %s, whose PATH is searched)\n", m[1], m[2], r.image)
		head = append([]byte(msg), head[len(m[0]):]...)
	}
	if len(head) == 0 {
		return nil
	}
	_, err := r.w.Write(head)
	return err
}
