package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sandboxd/sandboxd/acp"
	"github.com/sandboxd/sandboxd/sandbox"
)

// cmdServe answers ACP's terminal methods on stdio or a unix socket until
// ctx ends or the peer goes away.
func cmdServe(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", "serve [--listen stdio|unix:PATH] [flags]",
		"Answers the ACP terminal methods (terminal/create, output, wait_for_exit, kill,\nrelease) and _sandboxd/session/open|close, running every command in the\nsession's container.", stderr)
	var c common
	c.register(fs, "info")
	listen := fs.String("listen", "stdio", "where to serve ACP: stdio, or unix:PATH")
	var ah ahpFlags
	ah.register(fs)
	if err := parseNoArgs(fs, args, stdout); err != nil {
		return err
	}
	if err := ah.check(); err != nil {
		return err
	}
	if *listen != "stdio" && (!strings.HasPrefix(*listen, "unix:") || *listen == "unix:") {
		return usageError{fmt.Errorf("--listen %q: want stdio or unix:PATH", *listen)}
	}
	log, closeLog, err := c.logger(stderr)
	if err != nil {
		return err
	}
	defer closeLog()
	private := ah.private()
	// An abstract socket (@name) is in no directory, and a container,
	// with a network namespace of its own, cannot reach it.
	if path := strings.TrimPrefix(*listen, "unix:"); *listen != "stdio" && !strings.HasPrefix(path, "@") {
		private = append(private, path)
	}
	m, err := c.setup(ctx, stderr, log, "", private, nil)
	if err != nil {
		return err
	}
	defer closeManager(m, log)
	workspace, err := m.Config().ServedWorkspace()
	if err != nil {
		return err
	}
	// On stdio AHP terminals share the one peer's sessions, so a person
	// types where the agent works; the socket's peers are kept apart from
	// each other and from AHP.
	scope := m.NewScope("ahp", workspace, sandbox.SessionSpec{})
	if *listen == "stdio" {
		scope = m.NewScope("stdio", workspace, sandbox.SessionSpec{})
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waitAHP, err := ah.start(ctx, scope, log, stderr)
	if err != nil {
		return err
	}
	defer waitAHP()
	defer cancel()
	if *listen == "stdio" {
		log.Info("serving ACP on stdio")
		peer := acp.NewStdio(stdin, stdout)
		defer peer.Close()
		return acp.Serve(ctx, peer, acp.NewTerminals(scope), log)
	}
	path := strings.TrimPrefix(*listen, "unix:")
	ln, err := acp.ListenUnix(path, log)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	log.Info("serving ACP", "socket", path)
	return acp.ServeListener(ctx, ln, m, workspace, log)
}
