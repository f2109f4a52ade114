package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/acp"
	"github.com/sandboxd/sandboxd/sandbox"
)

// cmdWrap runs an ACP agent behind the relay and returns the agent's exit
// code. abort is set to kill the agent when sandboxd stops at once.
func cmdWrap(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, abort *abortHook) (int, error) {
	fs := newFlagSet("wrap", "wrap [flags] -- AGENT [ARGS...]",
		"Starts an ACP agent and relays between it and the editor on stdin/stdout,\ntelling the agent that the client supports terminals and running every\nterminal command in the session's container.", stderr)
	var c common
	c.register(fs, "info")
	grace := fs.Duration("agent-grace", 5*time.Second, "how long the agent has between SIGTERM and SIGKILL when the editor goes away")
	var sf sessionFlags
	sf.register(fs)
	var ah ahpFlags
	ah.register(fs)
	if err := parseFlags(fs, args, stdout); err != nil {
		return 0, err
	}
	if *grace < 0 {
		return 0, usageError{fmt.Errorf("--agent-grace: %v is negative", *grace)}
	}
	if fs.NArg() == 0 {
		return 0, usageError{errors.New("no agent given: sandboxd wrap [flags] -- AGENT [ARGS...]")}
	}
	if err := ah.check(); err != nil {
		return 0, err
	}
	defaults, err := sf.spec()
	if err != nil {
		return 0, err
	}
	argv := fs.Args()
	// Before connecting to the engine: a typo in the editor's settings
	// should say so at once.
	if _, err := exec.LookPath(argv[0]); err != nil {
		return 0, fmt.Errorf("start agent %q: %w", argv[0], err)
	}
	log, closeLog, err := c.logger(stderr)
	if err != nil {
		return 0, err
	}
	defer closeLog()
	var workspace string
	m, err := c.setup(ctx, stderr, log, defaults.Image, ah.private(), func(cfg *sandbox.Config) error {
		// An editor may start its agent anywhere, the user's home
		// included; its sessions name their own directories. AHP's
		// terminals need the served workspace, though.
		cfg.FallbackWorkspace = ah.listen == ""
		var err error
		if workspace, err = cfg.ServedWorkspace(); err != nil {
			return err
		}
		check := defaults
		check.Workspace = workspace
		if _, err := sandbox.ValidateSpec(*cfg, runtime.NumCPU(), check); err != nil {
			return overrideError(err)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	defer closeManager(m, log)
	// The relay's two readers spend their idle time blocked in read(2),
	// each holding a P. With no P left idle the runtime takes theirs away,
	// and every message then wakes a second thread on its way back from
	// the read; two spare Ps keep that path short (measured: 1.5x direct
	// latency down to 1.4x).
	runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + 2)
	agent := acp.Agent{Argv: argv, Stderr: stderr, Grace: *grace, Started: func(pid int) func() {
		abort.set(func() {
			syscall.Kill(-pid, syscall.SIGKILL)
			syscall.Kill(pid, syscall.SIGKILL)
		})
		return func() { abort.set(nil) }
	}}
	if wd, err := os.Getwd(); err == nil {
		agent.Dir = wd
	}
	scope := m.NewScope("wrap", workspace, defaults)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waitAHP, err := ah.start(ctx, scope, log, stderr)
	if err != nil {
		return 0, err
	}
	defer waitAHP()
	defer cancel()
	editor := acp.NewStdio(stdin, stdout)
	defer editor.Close()
	return acp.Wrap(ctx, acp.NewTerminals(scope), editor, agent, log)
}
