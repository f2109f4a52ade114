package engine

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
)

// ExecResult is what a command run by Exec wrote and how it ended.
type ExecResult struct {
	Stdout, Stderr []byte
	ExitCode       int
}

// Exec runs a command in container containerID as opts says, with its
// stdout and stderr attached, and waits for it to end. It fails when the
// command writes more than limit bytes to either stream; the result then
// holds what was read before. Exec returns when ctx is done.
func Exec(ctx context.Context, api API, containerID string, opts ExecCreateOptions, limit int) (ExecResult, error) {
	opts.AttachStdout, opts.AttachStderr = true, true
	ex, err := api.ExecCreate(ctx, containerID, opts)
	if err != nil {
		return ExecResult{}, err
	}
	att, err := api.ExecAttach(ctx, ex.ID, ExecAttachOptions{})
	if err != nil {
		return ExecResult{}, err
	}
	defer att.Close()
	// Reads of the hijacked connection do not watch ctx.
	defer context.AfterFunc(ctx, att.Close)()
	out, errOut := &cappedBuffer{max: limit}, &cappedBuffer{max: limit}
	_, err = stdcopy.StdCopy(out, errOut, att.Reader)
	res := ExecResult{Stdout: out.Bytes(), Stderr: errOut.Bytes()}
	if err != nil {
		return res, err
	}
	res.ExitCode, err = WaitExec(ctx, api, ex.ID)
	return res, err
}

// cappedBuffer is a bytes.Buffer that takes at most max bytes.
type cappedBuffer struct {
	bytes.Buffer
	max int
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.max {
		return 0, fmt.Errorf("wrote more than the %d bytes expected of it (a command of the session writing into it?)", b.max)
	}
	return b.Buffer.Write(p)
}

// inspectTimeout bounds one inspect of an exec. The engine answers in
// milliseconds, but not while the exec's start hangs: it holds the exec's
// lock until the start ends (see RemoveContainer).
const inspectTimeout = 10 * time.Second

// WaitExec waits until exec execID is no longer running and returns its
// exit code. It polls: the exec's stream ends first, and the engine
// records the exit a moment later (ExitCode reads 0 until then). An
// inspect that does not answer in time is made again, until ctx ends.
func WaitExec(ctx context.Context, api API, execID string) (int, error) {
	delay := 500 * time.Microsecond
	start := time.Now()
	for {
		ictx, cancel := context.WithTimeout(ctx, inspectTimeout)
		r, err := api.ExecInspect(ictx, execID, ExecInspectOptions{})
		late := ictx.Err() != nil && ctx.Err() == nil
		cancel()
		switch {
		case late:
			continue
		case err != nil:
			return 0, err
		case !r.Running:
			return r.ExitCode, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(delay*2, 50*time.Millisecond)
		// A process still running long after its stream ended (its
		// connection was closed by a release or a close, and it outlived
		// the kill) may run for as long as the container does.
		if time.Since(start) > 5*time.Second {
			delay = time.Second
		}
	}
}
