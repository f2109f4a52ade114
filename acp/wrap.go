package acp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
)

// Agent says how to start the agent a wrap contains.
type Agent struct {
	Argv   []string
	Dir    string
	Stderr io.Writer // the agent's stderr goes here
	// Grace is how long the agent has between SIGTERM and SIGKILL when the
	// editor goes away.
	Grace time.Duration
}

// Wrap starts the agent and relays between it and the editor through a
// Proxy until one side ends. It returns the agent's exit code (128+n for a
// signal) when the agent ended, and 0 when the editor did; the caller then
// closes the manager, which removes every container of the wrap.
func Wrap(ctx context.Context, terms *Terminals, editor io.ReadWriteCloser, agent Agent, log *slog.Logger) (int, error) {
	if len(agent.Argv) == 0 {
		return 0, errors.New("no agent command given")
	}
	cmd := exec.Command(agent.Argv[0], agent.Argv[1:]...)
	cmd.Dir = agent.Dir
	cmd.Stderr = agent.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return 0, fmt.Errorf("start agent: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, fmt.Errorf("start agent: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start agent %q: %w", agent.Argv[0], err)
	}
	log = log.With("agent", agent.Argv[0], "agent_pid", cmd.Process.Pid)
	log.Info("agent started")
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()

	// Editors usually start the agent in the project they open a session
	// for: have that session's container running before it is asked for.
	terms.m.KeepSpare(sandbox.SessionSpec{ID: "spare", Workspace: terms.workspace})
	p := NewProxy(terms, editor, pipe{stdout, stdin}, log)
	ended := make(chan error, 1)
	go func() { ended <- p.Run(ctx) }()
	var why error
	select {
	case why = <-ended:
	case <-ctx.Done():
		why = ctx.Err()
	}
	if errors.Is(why, ErrAgentClosed) {
		<-exited
		code := exitCode(cmd)
		log.Info("agent exited", "code", code)
		return code, nil
	}
	// The editor is gone (or sandboxd was told to stop): so is the agent.
	log.Info("stopping the agent", "why", why)
	stdin.Close()
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(agent.Grace):
		cmd.Process.Kill()
		<-exited
	}
	return 0, nil
}

func exitCode(cmd *exec.Cmd) int {
	st := cmd.ProcessState
	if st == nil {
		return 1
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return st.ExitCode()
}

// pipe joins the agent's stdout and stdin into one connection.
type pipe struct {
	io.ReadCloser
	w io.WriteCloser
}

func (p pipe) Write(b []byte) (int, error) { return p.w.Write(b) }

func (p pipe) Close() error {
	p.w.Close()
	return p.ReadCloser.Close()
}
