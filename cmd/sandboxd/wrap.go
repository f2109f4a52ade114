package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
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
		"Starts an ACP agent and relays between it and the editor on stdin/stdout,\ntelling the agent that the client supports terminals and running every\nterminal command in the session's container. With --contain the agent\nitself runs in a container, with no way out but the egress proxy.", stderr)
	var c common
	c.register(fs, "info")
	grace := fs.Duration("agent-grace", 5*time.Second, "how long the agent has between SIGTERM and SIGKILL when the editor goes away")
	var sf sessionFlags
	sf.register(fs)
	var ah ahpFlags
	ah.register(fs)
	var cf containFlags
	cf.register(fs)
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
	wd, err := os.Getwd()
	if err != nil {
		return 0, err
	}
	cont, err := cf.check(wd)
	if err != nil {
		return 0, err
	}
	if cf.contain {
		// The egress proxy is the contained agent's only way out.
		if defaults.Network != "" && defaults.Network != "none" {
			return 0, usageError{fmt.Errorf("--network %s: with --contain the network is none, and --allow-host what the agent may reach", defaults.Network)}
		}
		defaults.Network = "none"
	}
	// Before connecting to the engine: a typo in the editor's settings
	// should say so at once.
	if cf.contain {
		err = containedAgent(argv)
	} else {
		_, err = exec.LookPath(argv[0])
	}
	if err != nil {
		return 0, fmt.Errorf("start agent %q: %w", argv[0], err)
	}
	log, closeLog, err := c.logger(stderr)
	if err != nil {
		return 0, err
	}
	defer closeLog()
	var (
		workspace       string
		egressL, agentL net.Listener
		cleanup         = func() {}
	)
	defer func() { cleanup() }()
	m, err := c.setup(ctx, stderr, log, defaults.Image, ah.private(), func(cfg *sandbox.Config) error {
		if cf.contain {
			el, al, remove, err := cont.configure(ctx, cfg)
			if err != nil {
				return err
			}
			egressL, agentL, cleanup = el, al, remove
		} else {
			// An editor may start its agent anywhere, the user's home
			// included; its sessions name their own directories. AHP's
			// terminals need the served workspace, though.
			cfg.FallbackWorkspace = ah.listen == ""
		}
		var err error
		if workspace, err = cfg.ServedWorkspace(); err != nil {
			return err
		}
		check := defaults
		check.Workspace = workspace
		if _, err := sandbox.ValidateSpec(*cfg, runtime.NumCPU(), check); err != nil {
			return overrideError(err)
		}
		// Last: the file is made once every other check passed.
		return cont.openAudit(string(cf.audit), *cfg)
	})
	if err != nil {
		return 0, err
	}
	var terms *acp.Terminals
	defer func() {
		closeManager(m, log)
		// The ends of the commands the close killed, then the file.
		if terms != nil {
			terms.WaitAudit(10 * time.Second)
		}
		cont.audit.Close()
	}()
	// The relay's two readers spend their idle time blocked in read(2),
	// each holding a P. With no P left idle the runtime takes theirs away,
	// and every message then wakes a second thread on its way back from
	// the read; two spare Ps keep that path short (measured: 1.5x direct
	// latency down to 1.4x).
	runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + 2)
	agent := acp.Agent{Argv: argv, Dir: wd, Stderr: stderr, Grace: *grace, Audit: cont.audit}
	scope := m.NewScope("wrap", workspace, defaults)
	terms = acp.NewTerminals(scope)
	terms.SetAudit(cont.audit)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if cf.contain {
		// Served from now until the manager has removed the container:
		// the deferred calls run in the reverse order.
		waitEgress := cont.serveEgress(ctx, egressL, containSession, log)
		defer waitEgress()
		defer cancel()
		spec := defaults
		spec.ID, spec.Dir = containSession, wd
		s, err := scope.Pin(ctx, spec)
		if err != nil {
			agentL.Close()
			return 0, err
		}
		agent.Session, agent.Env, agent.Stdio = s, cont.env, agentL
	} else {
		// Should sandboxd have to stop at once, the agent on the host
		// goes with it; a contained one goes with its container.
		agent.Started = func(pid int) func() {
			abort.set(func() {
				syscall.Kill(-pid, syscall.SIGKILL)
				syscall.Kill(pid, syscall.SIGKILL)
			})
			return func() { abort.set(nil) }
		}
	}
	waitAHP, err := ah.start(ctx, scope, log, stderr)
	if err != nil {
		return 0, err
	}
	defer waitAHP()
	defer cancel()
	editor := acp.NewStdio(stdin, stdout)
	defer editor.Close()
	return acp.Wrap(ctx, terms, editor, agent, log)
}

// containSession is the id of a contained agent's session: its
// container's label.
const containSession = "contain"
