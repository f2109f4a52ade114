package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/internal/audit"
	"github.com/sandboxd/sandboxd/internal/egress"
	"github.com/sandboxd/sandboxd/internal/engine"
	"github.com/sandboxd/sandboxd/sandbox"
)

// containFlags are wrap's flags that run the agent itself in a container.
type containFlags struct {
	contain             bool
	volumes, env, allow stringList
	audit               nonEmpty
}

// register adds the flags to fs.
func (f *containFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.contain, "contain", false, "run the agent itself in the container, its only way out the egress proxy")
	fs.Var(&f.volumes, "v", "with --contain: mount a host path as `SRC:DST[:ro|rw]`, as run -v does (repeatable)")
	fs.Var(&f.env, "env", "with --contain: pass the variable `NAME` of sandboxd's environment to the agent (repeatable); the commands it runs can read it")
	fs.Var(&f.allow, "allow-host", "with --contain: let the agent connect to `HOST[:PORT]` (port 443 unless given; *.SUFFIX for the names below SUFFIX; repeatable)")
	fs.Var(&f.audit, "audit", "append the audit log (JSON Lines) to `file`")
}

// containment is what --contain needs that is checked before the engine
// is asked: the agent's environment and grants, the allowlist, and the
// audit log.
type containment struct {
	env    []sandbox.EnvVar
	mounts []sandbox.Mount
	allow  []string
	audit  *audit.Log
}

// check reads the flags: a name --env gives that is not set, a -v or an
// allowlist entry that is malformed, a flag of --contain's given without
// it, is a usageError. wd is the workspace.
func (f *containFlags) check(wd string) (*containment, error) {
	c := &containment{}
	if !f.contain {
		for name, l := range map[string]stringList{"-v": f.volumes, "--env": f.env, "--allow-host": f.allow} {
			if len(l) > 0 {
				return nil, usageError{fmt.Errorf("%s needs --contain: without it the agent runs on the host", name)}
			}
		}
	}
	for _, name := range f.env {
		value, ok := os.LookupEnv(name)
		e := sandbox.EnvVar{Name: name, Value: value}
		if err := sandbox.CheckEnvVar("--env", e); err != nil || !ok {
			// Never the value: it is a secret, as often as not.
			why := "is not set in sandboxd's environment"
			if err != nil {
				why = "cannot be passed: " + sandbox.Reason(err)
			}
			return nil, usageError{fmt.Errorf("--env %.200q %s", name, why)}
		}
		c.env = append(c.env, e)
	}
	if _, err := egress.ParseAllowlist(f.allow); err != nil {
		return nil, usageError{fmt.Errorf("--allow-host %w", err)}
	}
	c.allow = f.allow
	base := wd
	if real, err := filepath.EvalSymlinks(wd); err == nil {
		base = real
	}
	var err error
	if c.mounts, err = volumeFlags(f.volumes, base); err != nil {
		return nil, err
	}
	return c, nil
}

// openAudit opens the audit log that --audit, or else the configuration,
// names; nil for none. A file in the workspace or a grant is refused: a
// command could replace it, or a directory on its way, with a link.
func (c *containment) openAudit(flag string, cfg sandbox.Config) error {
	file := flag
	if file == "" {
		file = cfg.Audit.File
	}
	if file == "" {
		return nil
	}
	abs, err := filepath.Abs(file)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	var roots []string
	if !cfg.FallbackWorkspace {
		// Else sessions name their own workspaces, which cannot be
		// known yet.
		ws, err := cfg.ServedWorkspace()
		if err != nil {
			return err
		}
		roots = append(roots, ws)
	}
	for _, mt := range cfg.Session.Mounts {
		roots = append(roots, mt.Source)
	}
	for _, root := range roots {
		real, err := filepath.EvalSymlinks(root)
		if err != nil {
			real = root
		}
		for _, r := range []string{root, real} {
			if sandbox.Within(filepath.Clean(r), abs) {
				return usageError{fmt.Errorf("audit log %.200q lies in %.200q, which commands can write: name a file outside the workspace and the grants", file, r)}
			}
		}
	}
	l, err := audit.Open(file)
	if err != nil {
		return usageError{err}
	}
	c.audit = l
	return nil
}

// configure makes cfg the contained agent's: the workspace is where
// sandboxd runs, the -v grants are added as run adds them, and the
// gateway is prepared: the forwarder found or built, and the sockets of
// the egress proxy and of the agent's stdio made in a private directory
// of sandboxd's. It returns their listeners; cleanup removes them.
func (c *containment) configure(ctx context.Context, cfg *sandbox.Config) (egressL, agentL net.Listener, cleanup func(), err error) {
	cfg.Session.Workspace = ""
	cfg.FallbackWorkspace = false
	cli, err := engine.New()
	if err != nil {
		return nil, nil, nil, err
	}
	defer cli.Close()
	socket := engine.Socket(cli)
	if socket == "" {
		return nil, nil, nil, errors.New("--contain needs a local engine: the gateway's sockets are mounted into the container")
	}
	for _, mt := range c.mounts {
		if sandbox.Within(filepath.Clean(mt.Target), sandbox.GatewayDir) || sandbox.Within(sandbox.GatewayDir, filepath.Clean(mt.Target)) {
			return nil, nil, nil, usageError{fmt.Errorf("%s: target %q is where the container has sandboxd's egress gateway (%s)", mt.Origin, mt.Target, sandbox.GatewayDir)}
		}
		if err := cfg.AddMount(mt, socket); err != nil {
			return nil, nil, nil, usageError{err}
		}
	}
	allow, err := egress.ParseAllowlist(append(cfg.Egress.Allow, c.allow...))
	if err != nil {
		return nil, nil, nil, usageError{err}
	}
	c.allow = nil
	for _, r := range allow {
		c.allow = append(c.allow, r.String())
	}
	cache, err := forwarderCacheDir()
	if err != nil {
		return nil, nil, nil, err
	}
	fw, err := egress.Forwarder(ctx, cache)
	if err != nil {
		return nil, nil, nil, err
	}
	dir, err := os.MkdirTemp("", "sandboxd-gateway-")
	if err != nil {
		return nil, nil, nil, fmt.Errorf("gateway: %w", err)
	}
	cleanup = func() { os.RemoveAll(dir) }
	var ls []net.Listener
	for _, name := range []string{"egress.sock", "agent.sock"} {
		l, err := net.Listen("unix", filepath.Join(dir, name))
		if err == nil {
			// Reached from the container as its users, not sandboxd's:
			// the directory, 0700, keeps everyone else on the host out.
			err = os.Chmod(filepath.Join(dir, name), 0o666)
		}
		if err != nil {
			for _, l := range ls {
				l.Close()
			}
			cleanup()
			return nil, nil, nil, fmt.Errorf("gateway: %w", err)
		}
		ls = append(ls, l)
	}
	cfg.Private = append(cfg.Private, dir)
	cfg.Gateway = &sandbox.Gateway{Forwarder: fw, Socket: filepath.Join(dir, "egress.sock"), Agent: filepath.Join(dir, "agent.sock")}
	return ls[0], ls[1], cleanup, nil
}

// serveEgress serves the egress proxy on l until ctx ends; wait waits for
// it. Each request is recorded in the audit log as the session's.
func (c *containment) serveEgress(ctx context.Context, l net.Listener, session string, log *slog.Logger) (wait func()) {
	allow, _ := egress.ParseAllowlist(c.allow) // checked in configure
	p := &egress.Proxy{Allow: allow, Log: log.With("session", session), Report: func(ev egress.Event) {
		sent, received := ev.Sent, ev.Received
		a := audit.Event{Event: audit.Egress, Session: session, Method: ev.Method, Host: ev.Host, Port: ev.Port,
			Allowed: &ev.Allowed, Reason: ev.Reason, BytesSent: &sent, BytesReceived: &received, LeftOut: ev.LeftOut}
		a.Duration(ev.Duration)
		c.audit.Write(a)
	}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := p.Serve(ctx, l); err != nil {
			log.Error("egress proxy", "err", err)
		}
	}()
	return func() { <-done }
}

// forwarderCacheDir is where a forwarder built for the containers is
// kept: beside the package cache of the base image, and as private.
func forwarderCacheDir() (string, error) {
	dir, err := images.CacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory for the egress forwarder: %w", err)
	}
	return forwarderCache(dir), nil
}

// forwarderCache is the forwarder's cache beside the package cache debs.
func forwarderCache(debs string) string { return filepath.Join(filepath.Dir(debs), "forward") }

// containedAgent is the agent's command line checked for the container:
// it is looked up there, on the image's PATH, so not on the host's.
func containedAgent(argv []string) error {
	if err := (sandbox.Command{Command: argv[0], Args: argv[1:]}).Check(); err != nil {
		return usageError{fmt.Errorf("agent: %s", sandbox.Reason(err))}
	}
	return nil
}
