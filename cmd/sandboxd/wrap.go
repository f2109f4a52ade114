package main

import (
	"context"
	"errors"
	"io"
	"os"
	"time"

	"github.com/sandboxd/sandboxd/acp"
)

func cmdWrap(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	fs := newFlagSet("wrap", "wrap [flags] -- AGENT [ARGS...]",
		"Starts an ACP agent and relays between it and the editor on stdin/stdout,\ntelling the agent that the client supports terminals and running every\nterminal command in the session's container.", stderr)
	var c common
	c.register(fs, "info")
	grace := fs.Duration("agent-grace", 5*time.Second, "how long the agent has between SIGTERM and SIGKILL when the editor goes away")
	var ah ahpFlags
	ah.register(fs)
	if err := fs.Parse(args); err != nil {
		return 0, err
	}
	if fs.NArg() == 0 {
		return 0, usageError{errors.New("no agent given: sandboxd wrap [flags] -- AGENT [ARGS...]")}
	}
	log, closeLog, err := c.logger(stderr)
	if err != nil {
		return 0, err
	}
	defer closeLog()
	m, err := c.setup(ctx, stderr, log, "")
	if err != nil {
		return 0, err
	}
	defer closeManager(m, log)
	workspace, err := defaultWorkspace(m.Config())
	if err != nil {
		return 0, err
	}
	agent := acp.Agent{Argv: fs.Args(), Stderr: stderr, Grace: *grace}
	if wd, err := os.Getwd(); err == nil {
		agent.Dir = wd
	}
	terms := acp.NewTerminals(m, "wrap", workspace)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waitAHP, err := ah.start(ctx, terms, workspace, log, stderr)
	if err != nil {
		return 0, err
	}
	defer waitAHP()
	defer cancel()
	return acp.Wrap(ctx, terms, stdio{stdin, stdout}, agent, log)
}
