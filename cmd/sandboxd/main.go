package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// usage is what `sandboxd help` prints.
const usage = `sandboxd runs AI agents' shell commands in hardened per-session containers.

Usage:
  sandboxd wrap [--config FILE] [--cpus N] [--memory SIZE] [--pids N] [--network NAME] [--image REF] [--agent-grace D] [--ahp-listen ADDR] [--contain [--allow-host H[:P]] [--env NAME] [-v SRC:DST[:ro|rw]]] [--audit FILE] [flags] -- AGENT [ARGS...]
  sandboxd serve [--listen stdio|unix:PATH] [--config FILE] [--ahp-listen ADDR] [flags]
  sandboxd run [-i] [-t] [-e NAME=VALUE] [-w DIR] [-v SRC:DST[:ro|rw]] [--read-only] [--cpus N] [--memory SIZE] [--pids N] [--network NAME] [--image REF] [--config FILE] [flags] -- CMD [ARGS...]
  sandboxd image build [--ref REF]
  sandboxd gc [--all]
  sandboxd config
  sandboxd version

Run 'sandboxd COMMAND -h' (or 'sandboxd help COMMAND') for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run runs the command args name and returns sandboxd's exit code.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	if args[0] == "help" && len(args) > 1 && args[1] != "help" {
		return run([]string{args[1], "-h"}, stdin, stdout, stderr)
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		if _, err := fmt.Fprint(stdout, usage); err != nil {
			fmt.Fprintf(stderr, "sandboxd: write: %v\n", err)
			return 1
		}
		return 0
	}
	if args[0] == "--version" {
		args = append([]string{"version"}, args[1:]...)
	}
	// SIGHUP too: closing the terminal sandboxd runs in must not leave
	// its containers behind; and SIGQUIT (Ctrl-\), whose default, Go's
	// goroutine dump, would leave them as well. A signal ignored at start
	// (nohup, a background job of a script) stays ignored.
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 1)
	for _, sig := range []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT} {
		if !signal.Ignored(sig) {
			signal.Notify(sigs, sig)
		}
	}
	defer signal.Stop(sigs)
	finished := make(chan struct{})
	defer close(finished)
	var abort abortHook
	go watchSignals(sigs, cancel, finished, &abort, stderr)
	// A write to a peer or pipe that went away must fail, not kill
	// sandboxd before it removed its containers. Notify rather than
	// Ignore: an ignored SIGPIPE would be inherited by what it starts.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	var err error
	code := 0
	switch args[0] {
	case "serve":
		err = cmdServe(ctx, args[1:], stdin, stdout, stderr)
	case "run":
		code, err = cmdRun(ctx, args[1:], stdin, stdout, stderr)
	case "wrap":
		code, err = cmdWrap(ctx, args[1:], stdin, stdout, stderr, &abort)
	case "image":
		err = cmdImage(ctx, args[1:], stdout, stderr)
	case "gc":
		err = cmdGC(ctx, args[1:], stdout, stderr)
	case "config":
		err = cmdConfig(args[1:], stdout, stderr)
	case "version":
		err = cmdVersion(args[1:], stdout, stderr)
	default:
		fmt.Fprintf(stderr, "sandboxd: unknown command %q (see 'sandboxd help')\n", args[0])
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "sandboxd %s: %v\n", args[0], err)
		switch {
		case errors.As(err, new(usageError)) || errors.As(err, new(flagError)):
			code = 2
		case args[0] == "run" || args[0] == "wrap":
			// Their code is otherwise the command's or the agent's:
			// sandboxd's own failure (no engine, no image) says so with
			// a code of its own, as `docker run` does.
			code = exitFailed
		default:
			code = 1
		}
	}
	c, signalled := context.Cause(ctx).(signalCause)
	if signalled && args[0] == "wrap" && code == 0 {
		// The agent was stopped for the signal, not because the
		// conversation ended.
		code = 128 + int(c.sig.(syscall.Signal))
	}
	if signalled && c.sig == syscall.SIGINT {
		// Cleaned up: now die of the SIGINT, so that a shell running
		// sandboxd in a loop or a script stops too (it goes on after a
		// child that merely exited).
		signal.Stop(sigs)
		raise(syscall.SIGINT)
		return 128 + int(syscall.SIGINT)
	}
	return code
}

// exitFailed is what run and wrap exit with when sandboxd itself fails,
// not the command or the agent.
const exitFailed = 125

// signalCause is a signal that asked sandboxd to shut down.
type signalCause struct{ sig os.Signal }

func (c signalCause) Error() string { return "signal: " + c.sig.String() }

// watchSignals turns the first signal into an orderly shutdown, with the
// signal as the cause, and lets a second SIGINT or SIGTERM end sandboxd
// the usual way once that shutdown has had a while, for one that hangs on
// the engine. Signals that come with the first are the same request, and
// SIGHUP never escalates.
func watchSignals(sigs <-chan os.Signal, cancel context.CancelCauseFunc, finished <-chan struct{}, abort *abortHook, stderr io.Writer) {
	select {
	case sig := <-sigs:
		cancel(signalCause{sig})
		if key, typed := map[os.Signal]string{os.Interrupt: "Ctrl-C", syscall.SIGQUIT: "Ctrl-\\"}[sig]; typed {
			// A person pressed it: the command's grace period may be
			// long, and sandboxd says what it is doing meanwhile.
			fmt.Fprintf(stderr, "sandboxd: stopping (the command, then its container); %s again, 2 s from now, stops at once\n", key)
		}
	case <-finished:
		return
	}
	patience := time.After(2 * time.Second)
	for {
		select {
		case <-patience:
			patience = nil
		case sig := <-sigs:
			// One within the 2 s repeats the first request: a closed
			// terminal sends SIGHUP twice, Ctrl-C reaches npm and the
			// sandboxd it runs.
			if patience != nil || sig == syscall.SIGHUP {
				continue
			}
			fmt.Fprintln(stderr, "sandboxd: stopping at once; what it leaves behind goes at the next start, or with `sandboxd gc`")
			abort.run()
			s := sig.(syscall.Signal)
			if s != syscall.SIGQUIT {
				// Not SIGQUIT: Go's own answer to it is a dump of every
				// goroutine.
				raise(s)
			}
			os.Exit(128 + int(s))
		case <-finished:
			return
		}
	}
}

// abortHook is what must be done even when sandboxd stops at once: the
// processes it started on the host (wrap's agent) are killed, not left
// running unsandboxed. Containers are left to the next start, or gc.
type abortHook struct {
	mu sync.Mutex
	fn func()
}

// set makes fn what run does.
func (h *abortHook) set(fn func()) {
	h.mu.Lock()
	h.fn = fn
	h.mu.Unlock()
}

// run runs the hook, holding it: a set(nil) waits, so the hook never acts
// on what set(nil) says is gone.
func (h *abortHook) run() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fn != nil {
		h.fn()
	}
}

// raise ends sandboxd by sig, as if it had no handler for it, so that its
// parent sees that signal. As the init of a container it returns: the
// kernel drops a signal an init sends itself.
func raise(sig syscall.Signal) {
	signal.Reset(sig)
	if pid := syscall.Getpid(); pid != 1 {
		// To this very thread: delivered before the call returns, not to
		// another while this one exits with a code.
		runtime.LockOSThread()
		syscall.Tgkill(pid, syscall.Gettid(), sig)
	}
}
