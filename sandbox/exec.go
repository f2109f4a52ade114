package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/sandboxd/sandboxd/internal/engine"
)

// execOutput runs a helper command in the container as the session's user
// and returns its output. The user matters: with no capabilities, only a
// process of the same uid may signal the command's processes.
func (s *Session) execOutput(ctx context.Context, cmd []string) ([]byte, error) {
	return s.execOutputAs(ctx, s.user, cmd)
}

// execOutputAs is execOutput as user.
func (s *Session) execOutputAs(ctx context.Context, user string, cmd []string) ([]byte, error) {
	// A command of the session can write into the output of a helper of
	// its user (/proc/PID/fd/1 is open to it): what sandboxd keeps is
	// bounded, and a helper that says more has failed.
	res, err := engine.Exec(ctx, s.m.cli, s.contID, engine.ExecCreateOptions{User: user, Cmd: cmd}, maxHelperOutput)
	switch {
	case err != nil:
		return res.Stdout, fmt.Errorf("session %s: %s: %w", s.ID, cmd[0], err)
	case res.ExitCode != 0:
		return res.Stdout, &execError{cmd: cmd[0], code: res.ExitCode, stderr: string(bytes.TrimSpace(res.Stderr)), output: string(res.Stdout) + string(res.Stderr)}
	}
	return res.Stdout, nil
}

// maxHelperOutput bounds what sandboxd reads from one of its own commands
// in a container, far above what any of them writes: mountinfo of some
// thousand mounts, or the kill script's pairs for some hundred thousand
// processes.
const maxHelperOutput = 4 << 20

// execError is a command of sandboxd's own that ran in a container and
// failed.
type execError struct {
	cmd    string
	code   int
	stderr string
	output string // all it wrote, for missing
}

func (e *execError) Error() string {
	if e.stderr == "" {
		return fmt.Sprintf("%s exited with %d", e.cmd, e.code)
	}
	return fmt.Sprintf("%s exited with %d: %.500s", e.cmd, e.code, e.stderr)
}

// missing reports whether the image does not have the command: the
// engine says so with 126 or 127 and its reason.
func (e *execError) missing() bool {
	return (e.code == 126 || e.code == 127) && (strings.Contains(e.output, "executable file not found") || strings.Contains(e.output, "no such file or directory"))
}
