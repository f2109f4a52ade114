// Command sandboxd runs AI agents' shell commands in hardened per-session
// containers. It parses flags and wires the packages that do the work.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd"
	"github.com/sandboxd/sandboxd/acp"
	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/internal/console"
	"github.com/sandboxd/sandboxd/limits"
	"github.com/sandboxd/sandboxd/sandbox"
)

const usage = `sandboxd runs AI agents' shell commands in hardened per-session containers.

Usage:
  sandboxd wrap [--config FILE] [--cpus N] [--memory SIZE] [--pids N] [--network NAME] [--image REF] [--agent-grace D] [--ahp-listen ADDR] [flags] -- AGENT [ARGS...]
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
		err = cmdPrint("config", "Prints the embedded default configuration, sandbox.toml, which --config FILE\noverrides key by key.",
			sandboxd.DefaultConfig, args[1:], stdout, stderr)
	case "version":
		err = cmdPrint("version", "Prints the module version, the commit the build recorded and the Go version.",
			version()+"\n", args[1:], stdout, stderr)
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
// the engine. Signals that come with the first are the same request (a
// closed terminal sends SIGHUP twice, Ctrl-C reaches npm and the sandboxd
// it runs), and SIGHUP never escalates.
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

type usageError struct{ error }

// flagError is a bad flag.
type flagError struct{ error }

// parseFlags parses args into fs; -h is flag.ErrHelp, a bad flag a
// flagError.
//
// Asked for, the command's usage goes to stdout, to be paged or searched;
// after a mistake, stderr gets the one error and where to read more, not
// the whole list.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.Usage = usage
	defer fs.SetOutput(out)
	switch {
	case errors.Is(err, flag.ErrHelp):
		// Whole, so that a failed write is told.
		var b bytes.Buffer
		fs.SetOutput(&b)
		fs.Usage()
		if _, werr := stdout.Write(b.Bytes()); werr != nil {
			return fmt.Errorf("write: %w", werr)
		}
		return err
	case err != nil:
		return flagError{fmt.Errorf("%w (see 'sandboxd %s -h')", err, fs.Name())}
	}
	return nil
}

// newFlagSet returns a flag set whose -h prints the command's synopsis and
// what it does before its flags.
func newFlagSet(name, synopsis, about string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: sandboxd %s\n\n%s\n", synopsis, about)
		hasFlags := false
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprint(fs.Output(), "\nFlags:\n")
			fs.PrintDefaults()
		}
	}
	return fs
}

// common holds the flags every command that opens sessions shares.
type common struct {
	config   nonEmpty
	logLevel string
	logFile  nonEmpty
}

func (c *common) register(fs *flag.FlagSet, defaultLevel string) {
	fs.Var(&c.config, "config", "configuration `file` (default: the embedded sandbox.toml)")
	fs.StringVar(&c.logLevel, "log-level", defaultLevel, "log level: debug, info, warn or error")
	fs.Var(&c.logFile, "log", "write logs to `file` instead of stderr")
}

// logger builds the logger; logs never go to stdout, which may carry ACP.
func (c *common) logger(stderr io.Writer) (*slog.Logger, func(), error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		return nil, nil, usageError{fmt.Errorf("--log-level: %q is not debug, info, warn or error", c.logLevel)}
	}
	w, closeFn := stderr, func() {}
	if c.logFile != "" {
		// Not through a link, nor into what is no file: a link put in
		// its place would have sandboxd append to whatever it names.
		// Nor wait for a reader: a FIFO there would hold sandboxd up.
		f, err := os.OpenFile(string(c.logFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o600)
		if err != nil {
			return nil, nil, usageError{fmt.Errorf("--log: %w", err)}
		}
		if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
			f.Close()
			return nil, nil, usageError{fmt.Errorf("--log: %s is not a regular file", c.logFile)}
		}
		w, closeFn = f, func() { f.Close() }
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})), closeFn, nil
}

func engineClient() (*client.Client, error) {
	cli, err := client.New(client.FromEnv)
	if err != nil {
		return nil, fmt.Errorf("docker client: %w", err)
	}
	return cli, nil
}

// setup loads the configuration, hands it to check (nil: none), which
// refuses flags it does not allow before anything reaches the engine, and
// starts the manager with the image in place. private are the places of
// sandboxd's own endpoints, which no container may see.
func (c *common) setup(ctx context.Context, stderr io.Writer, log *slog.Logger, image string, private []string, check func(*sandbox.Config) error) (*sandbox.Manager, error) {
	cfg, err := sandbox.LoadConfig(sandboxd.DefaultConfig, string(c.config), runtime.NumCPU())
	if err != nil {
		return nil, err
	}
	// sandboxd's own files besides the endpoints: a command that could
	// change them would choose sandboxd's next configuration, or the
	// packages the next image build runs on the host. (The log is not one:
	// it is opened neither through a link nor as anything but a file.)
	if c.config != "" {
		private = append(private, string(c.config))
	}
	if dir, err := images.CacheDir(); err == nil {
		private = append(private, dir)
	}
	cfg.Private = private
	if check != nil {
		if err := check(&cfg); err != nil {
			return nil, err
		}
	}
	cli, err := engineClient()
	if err != nil {
		return nil, err
	}
	m, err := sandbox.NewManager(ctx, cli, cfg, log)
	if err != nil {
		return nil, err
	}
	if image == "" {
		image = cfg.Session.Image
	}
	b := images.Builder{Client: cli, Progress: stderr}
	if err := b.Ensure(ctx, image); err != nil {
		m.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return m, nil
}

func parseSize(v string) (int64, error) { return limits.ParseBytes(v) }

func closeManager(m *sandbox.Manager, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.Close(ctx); err != nil {
		log.Error("shutdown", "err", err)
	}
}

func cmdServe(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", "serve [--listen stdio|unix:PATH] [flags]",
		"Answers the ACP terminal methods (terminal/create, output, wait_for_exit, kill,\nrelease) and _sandboxd/session/open|close, running every command in the\nsession's container.", stderr)
	var c common
	c.register(fs, "info")
	listen := fs.String("listen", "stdio", "where to serve ACP: stdio, or unix:PATH")
	var ah ahpFlags
	ah.register(fs)
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
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
	terms := acp.NewTerminals(m, "ahp", workspace, sandbox.SessionSpec{})
	if *listen == "stdio" {
		terms = acp.NewTerminals(m, "stdio", workspace, sandbox.SessionSpec{})
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waitAHP, err := ah.start(ctx, terms, workspace, log, stderr)
	if err != nil {
		return err
	}
	defer waitAHP()
	defer cancel()
	if *listen == "stdio" {
		log.Info("serving ACP on stdio")
		peer := acp.NewStdio(stdin, stdout)
		defer peer.Close()
		return acp.Serve(ctx, peer, terms, log)
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

func cmdRun(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	fs := newFlagSet("run", "run [flags] -- CMD [ARGS...]",
		"Runs one command in a fresh sandbox with the current directory as its\nworkspace, streams its output and exits with its exit code (128+n for\nsignal n). The container is removed afterwards.", stderr)
	var c common
	c.register(fs, "warn")
	var sf sessionFlags
	sf.register(fs)
	var interactive, tty, both, readOnly bool
	var env, volumes stringList
	var workdir nonEmpty
	fs.Var(&env, "e", "set `NAME=VALUE` in the command's environment (NAME alone: its value here, if set; repeatable)")
	fs.Var(&workdir, "w", "run in `dir`, at or below the workspace (default: the workspace)")
	fs.Var(&volumes, "v", "mount a host path as `SRC:DST[:ro|rw]` (read-write unless :ro; repeatable)")
	fs.BoolVar(&readOnly, "read-only", false, "mount the workspace read-only")
	fs.BoolVar(&interactive, "i", false, "pass stdin to the command")
	fs.BoolVar(&tty, "t", false, "run the command on a terminal of the size of yours")
	fs.BoolVar(&both, "it", false, "-i and -t: an interactive shell, say")
	fs.BoolVar(&both, "ti", false, "the same as -it")
	if err := parseFlags(fs, args, stdout); err != nil {
		return 0, err
	}
	if fs.NArg() == 0 {
		return 0, usageError{errors.New("no command given: sandboxd run [flags] -- CMD [ARGS...]")}
	}
	interactive, tty = interactive || both, tty || both
	in, _ := stdin.(*os.File)
	if interactive && tty && (in == nil || !console.IsTerminal(int(in.Fd()))) {
		return 0, usageError{errors.New("-i with -t: stdin is not a terminal (leave out -t to pass it as it is)")}
	}
	spec, err := sf.spec()
	if err != nil {
		return 0, err
	}
	spec.ID = "run"
	wd, err := os.Getwd()
	if err != nil {
		return 0, err
	}
	spec.Workspace = wd
	// Checked before the engine is asked, as every flag is.
	argv := fs.Args()
	cmd := sandbox.Command{Command: argv[0], Args: argv[1:], Cwd: wd, Stdout: stdout, Stderr: stderr}
	if cmd.Env, err = envFlags(env); err != nil {
		return 0, err
	}
	if workdir != "" {
		if cmd.Cwd, err = sandbox.WorkDir(wd, string(workdir)); err != nil {
			return 0, usageError{fmt.Errorf("-w: %w", err)}
		}
	}
	if err := cmd.Check(); err != nil {
		return 0, usageError{errors.New(sandbox.Reason(err))}
	}
	// A relative source is taken from the workspace as it really is: the
	// way there may pass links of the user's, which a grant may not.
	base := wd
	if real, err := filepath.EvalSymlinks(wd); err == nil {
		base = real
	}
	mounts, err := volumeFlags(volumes, base)
	if err != nil {
		return 0, err
	}
	log, closeLog, err := c.logger(stderr)
	if err != nil {
		return 0, err
	}
	defer closeLog()
	m, err := c.setup(ctx, stderr, log, spec.Image, nil, func(cfg *sandbox.Config) error {
		// run's workspace is where it runs, whatever session.workspace
		// says: that is the one checked at start (as the directory
		// sandboxd runs in, no setting of the file).
		cfg.Session.Workspace = ""
		if readOnly {
			cfg.Session.WorkspaceMode = "ro"
		}
		if len(mounts) > 0 {
			cli, err := engineClient()
			if err != nil {
				return err
			}
			defer cli.Close()
			for _, mt := range mounts {
				if err := cfg.AddMount(mt, sandbox.EngineSocket(cli)); err != nil {
					return usageError{err}
				}
			}
		}
		if _, err := sandbox.ValidateSpec(*cfg, runtime.NumCPU(), spec); err != nil {
			return overrideError(err)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	defer closeManager(m, log)
	if interactive {
		cmd.Stdin = stdin
	}
	var resize <-chan console.Size
	if tty {
		// The size is that of the terminal the user sees: the input's,
		// else the output's; with neither, a terminal's usual 80x24.
		cmd.TTY, cmd.Stderr, cmd.Cols, cmd.Rows = true, nil, 80, 24
		for _, f := range []any{stdin, stdout} {
			if f, ok := f.(*os.File); ok && console.IsTerminal(int(f.Fd())) {
				// Watched first: a change while the size is read is
				// sent, not lost.
				resize = console.Watch(ctx, int(f.Fd()))
				if size, err := console.SizeOf(int(f.Fd())); err == nil {
					cmd.Cols, cmd.Rows = size.Cols, size.Rows
				}
				break
			}
		}
	}
	opts := sandbox.RunOptions{Resize: resize}
	if tty && interactive {
		// Raw only once the container is ready: while it starts, Ctrl-C
		// is sandboxd's, and stops the run before the command runs.
		var state *console.State
		defer func() {
			if state != nil {
				state.Restore()
			}
		}()
		opts.Starting = func() error {
			raw, err := console.MakeRaw(int(in.Fd()))
			if err != nil {
				return err
			}
			state = raw
			// Also at the first signal: a second one may end sandboxd at
			// once, past every deferred call.
			context.AfterFunc(ctx, func() { raw.Restore() })
			return nil
		}
	}
	return sandbox.Run(ctx, m, spec, cmd, opts)
}

func cmdImage(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	// build is its only command: its help is the command's.
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		args = []string{"build", "-h"}
	}
	if len(args) == 0 || args[0] != "build" {
		return usageError{errors.New("usage: sandboxd image build [--ref REF]")}
	}
	fs := newFlagSet("image build", "image build [--ref REF]",
		"Builds the base image from Debian's busybox-static and bash-static packages,\nreproducibly and without a registry.", stderr)
	ref := fs.String("ref", images.DefaultRef, "image reference to build")
	if err := parseFlags(fs, args[1:], stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	cli, err := engineClient()
	if err != nil {
		return err
	}
	b := images.Builder{Client: cli, Progress: stderr}
	_, err = b.Build(ctx, *ref)
	return err
}

// overrideError words a session override that ValidateSpec refused as the
// fault of the flag that asked for it: its messages start with the
// setting's name ("cpus 3 is too many"), which is the flag's.
func overrideError(err error) error {
	return usageError{errors.New("--" + sandbox.Reason(err))}
}

// maxVolumeFlag bounds a -v value, which errors quote.
const maxVolumeFlag = 4096

// volumeFlags reads run's -v values, SRC:DST[:ro|rw] as docker run takes
// them; a relative SRC is taken from dir. Paths with a colon cannot be
// given this way (session.mounts takes them).
func volumeFlags(values []string, dir string) ([]sandbox.Mount, error) {
	var mounts []sandbox.Mount
	for _, v := range values {
		if len(v) > maxVolumeFlag {
			return nil, usageError{fmt.Errorf("-v %.50q...: longer than %d bytes", v, maxVolumeFlag)}
		}
		// As the engine's API can carry it: as the command's strings are.
		if err := sandbox.CheckString("-v", v); err != nil {
			return nil, usageError{errors.New(sandbox.Reason(err))}
		}
		parts := strings.Split(v, ":")
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
			return nil, usageError{fmt.Errorf("-v %.200q: want SRC:DST[:ro|rw] (a path with a colon in it only in session.mounts)", v)}
		}
		m := sandbox.Mount{Source: parts[0], Target: parts[1], Mode: "rw", Origin: fmt.Sprintf("-v %q", v)}
		if len(parts) == 3 {
			if parts[2] != "ro" && parts[2] != "rw" {
				return nil, usageError{fmt.Errorf("-v %.200q: mode %.50q is not ro or rw", v, parts[2])}
			}
			m.Mode = parts[2]
		}
		if !filepath.IsAbs(m.Source) {
			m.Source = filepath.Join(dir, m.Source)
		}
		mounts = append(mounts, m)
	}
	return mounts, nil
}

// envFlags reads run's -e values as docker run does: NAME=VALUE, or NAME
// alone for the value it has here (left out when it has none).
func envFlags(values []string) ([]sandbox.EnvVar, error) {
	var env []sandbox.EnvVar
	for _, v := range values {
		name, value, ok := strings.Cut(v, "=")
		// An empty one (-e "$VAR" with VAR empty) is refused below, as
		// docker run refuses it, not passed over.
		if !ok && name != "" {
			if value, ok = os.LookupEnv(name); !ok {
				continue
			}
		}
		e := sandbox.EnvVar{Name: name, Value: value}
		if err := sandbox.CheckEnvVar("env", e); err != nil {
			return nil, usageError{fmt.Errorf("-e %.200q: %s", v, sandbox.Reason(err))}
		}
		env = append(env, e)
	}
	return env, nil
}

// cmdPrint is a command without flags or arguments that prints text.
func cmdPrint(name, about, text string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, name, about, stderr)
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	if _, err := fmt.Fprint(stdout, text); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

func cmdGC(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("gc", "gc [--all]",
		"Removes the containers of sandboxd instances that are no longer running\n(every start does this too).", stderr)
	all := fs.Bool("all", false, "remove every sandboxd container, even of instances still running")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	cli, err := engineClient()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	removed, err := sandbox.GC(ctx, cli, log, sandbox.GCOptions{All: *all})
	var out bytes.Buffer
	for _, id := range removed {
		fmt.Fprintf(&out, "removed %.12s\n", id)
	}
	// A count is only known once the containers were listed: without the
	// engine, "0 removed" would be a claim about containers never seen.
	if err == nil || errors.As(err, new(*sandbox.RemoveError)) {
		fmt.Fprintf(&out, "%d container(s) removed\n", len(removed))
	}
	if _, werr := stdout.Write(out.Bytes()); werr != nil {
		err = errors.Join(err, fmt.Errorf("write: %w", werr))
	}
	return err
}

// version names the module version sandboxd was built from, and the VCS
// revision when the build recorded one.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "sandboxd (version unknown)"
	}
	v := "sandboxd " + bi.Main.Version
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v += " " + s.Value[:min(12, len(s.Value))]
		case "vcs.modified":
			if s.Value == "true" {
				v += " (modified)"
			}
		}
	}
	return v + " " + bi.GoVersion
}
