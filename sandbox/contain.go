package sandbox

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"
)

// Agent is a contained agent's process in its session's container.
type Agent struct {
	t *Terminal
}

// agentConnectTimeout bounds the wait for a contained agent to connect its
// stdio.
const agentConnectTimeout = 30 * time.Second

// StartAgent runs a contained agent, argv, in the session's container as
// its commands run: as the commands' user, behind the reaper, marked so
// that a stop finds all it started, in dir, with env added to the
// container's environment (the gateway's proxy included). argv[0] is
// looked up on the image's PATH. Its stdin and stdout are a connection to
// stdio, the listener of the gateway's agent socket, which it returns: the
// agent's messages do not pass through the engine. Its stderr, and what
// keeps it from starting, go to stderr.
func (s *Session) StartAgent(ctx context.Context, stdio net.Listener, argv []string, env []EnvVar, dir string, stderr io.Writer) (*Agent, *os.File, error) {
	defer stdio.Close() // one agent, one connection
	if len(argv) == 0 {
		return nil, nil, fmt.Errorf("%w: no agent command given", ErrInvalid)
	}
	if s.m.cfg.Gateway == nil {
		return nil, nil, fmt.Errorf("start agent %s: the session has no gateway", argv[0])
	}
	conns := make(chan net.Conn, 1)
	go func() {
		c, err := stdio.Accept()
		if err == nil {
			conns <- c
		}
	}()
	none := int64(0) // its stderr is passed on, not kept
	run := agentArgv(argv)
	t, err := s.Start(ctx, Command{Command: run[0], Args: run[1:], Env: env, Cwd: dir, OutputLimit: &none, Stdout: stderr, Stderr: stderr})
	if err != nil {
		return nil, nil, err
	}
	a := &Agent{t: t}
	timeout := time.NewTimer(agentConnectTimeout)
	defer timeout.Stop()
	var c net.Conn
	select {
	case c = <-conns:
	case <-t.Done():
		return nil, nil, fmt.Errorf("start agent %s: it exited with %d as it started (its reason is above)", argv[0], a.ExitCode())
	case <-timeout.C:
		err = fmt.Errorf("start agent %s: it did not connect within %v", argv[0], agentConnectTimeout)
	case <-ctx.Done():
		err = fmt.Errorf("start agent %s: %w", argv[0], context.Cause(ctx))
	}
	if err != nil {
		a.Stop(ctx, 0)
		return nil, nil, err
	}
	// A blocking file, read and written without the poller: a reader
	// blocked in read(2) is woken by the kernel itself, as the pipes of
	// an agent on the host are.
	f, err := c.(*net.UnixConn).File()
	c.Close()
	if err != nil {
		a.Stop(ctx, 0)
		return nil, nil, fmt.Errorf("start agent %s: %w", argv[0], err)
	}
	syscall.SetNonblock(int(f.Fd()), false)
	return a, f, nil
}

// ID is the agent's terminal id, its processes' marker.
func (a *Agent) ID() string { return a.t.ID }

// Done is closed once the agent has exited and its output is all passed
// on.
func (a *Agent) Done() <-chan struct{} { return a.t.Done() }

// ExitCode is the agent's exit code once Done, 128+n for signal n, 255
// when the engine could not tell.
func (a *Agent) ExitCode() int { return ExitCode(a.t.status) }

// Stop ends the agent and every process it started: SIGTERM, and SIGKILL
// to what is left after grace. It returns once the agent has exited; what
// an agent that exited by itself left running goes with the container.
func (a *Agent) Stop(ctx context.Context, grace time.Duration) error {
	t := a.t
	if t.Exited() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace+time.Minute)
	defer cancel()
	if grace > 0 {
		if err := t.signalAll(ctx, syscall.SIGTERM); err != nil {
			return fmt.Errorf("stop agent %s: %w", t.ID, err)
		}
		select {
		case <-t.done:
		case <-time.After(grace):
		}
	}
	// Also when it exited on the SIGTERM: what it started must not run
	// on.
	if err := t.signalAll(ctx, syscall.SIGKILL); err != nil {
		return fmt.Errorf("stop agent %s: %w", t.ID, err)
	}
	select {
	case <-t.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("stop agent %s: still running after SIGKILL", t.ID)
	}
}
