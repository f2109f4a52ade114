package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/sandboxd/sandboxd/internal/console"
	"github.com/sandboxd/sandboxd/internal/engine"
	"github.com/sandboxd/sandboxd/sandbox"
)

// cmdRun runs one command in a session of its own and returns its exit code.
func cmdRun(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	fs := newFlagSet("run", "run [flags] -- CMD [ARGS...]",
		"Runs one command in a fresh sandbox with the current directory as its\nworkspace, streams its output and exits with its exit code (128+n for\nsignal n). The container is removed afterwards.", stderr)
	var f runFlags
	f.register(fs)
	if err := parseFlags(fs, args, stdout); err != nil {
		return 0, err
	}
	if fs.NArg() == 0 {
		return 0, usageError{errors.New("no command given: sandboxd run [flags] -- CMD [ARGS...]")}
	}
	f.interactive, f.tty = f.interactive || f.both, f.tty || f.both
	in, _ := stdin.(*os.File)
	if f.interactive && f.tty && (in == nil || !console.IsTerminal(int(in.Fd()))) {
		return 0, usageError{errors.New("-i with -t: stdin is not a terminal (leave out -t to pass it as it is)")}
	}
	spec, err := f.session.spec()
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
	cmd, err := f.command(fs.Args(), wd, stdout, stderr)
	if err != nil {
		return 0, err
	}
	mounts, err := f.mounts(wd)
	if err != nil {
		return 0, err
	}
	log, closeLog, err := f.common.logger(stderr)
	if err != nil {
		return 0, err
	}
	defer closeLog()
	m, err := f.common.setup(ctx, stderr, log, spec.Image, nil, f.override(spec, mounts))
	if err != nil {
		return 0, err
	}
	defer closeManager(m, log)
	// Known once the engine is: its host's memory, and the budget made of
	// it. (The configured default was checked as the manager started.)
	if spec.Limits.Memory != 0 {
		if err := m.CheckMemory(spec.Limits.Memory); err != nil {
			return 0, overrideError(err)
		}
	}
	opts, restore := f.terminal(ctx, &cmd, in, stdin, stdout)
	defer restore()
	var closeInput func() error
	if f.interactive {
		opts.Stdin = func(exited <-chan struct{}) io.Reader {
			// The user's terminal is read only until the command exits,
			// so that keys typed after it reach the user's shell.
			if file, ok := stdin.(*os.File); ok {
				if in, err := console.NewInput(file, exited); err == nil {
					closeInput = in.Close
					return in
				}
			}
			return stdin
		}
	}
	defer func() {
		if closeInput != nil {
			closeInput()
		}
	}()
	return sandbox.Run(ctx, m, spec, cmd, opts)
}

// runFlags are the flags of run.
type runFlags struct {
	common                           common
	session                          sessionFlags
	interactive, tty, both, readOnly bool
	env, volumes                     stringList
	workdir                          nonEmpty
}

// register adds the flags to fs.
func (f *runFlags) register(fs *flag.FlagSet) {
	f.common.register(fs, "warn")
	f.session.register(fs)
	fs.Var(&f.env, "e", "set `NAME=VALUE` in the command's environment (NAME alone: its value here, if set; repeatable)")
	fs.Var(&f.workdir, "w", "run in `dir`, at or below the workspace (default: the workspace)")
	fs.Var(&f.volumes, "v", "mount a host path as `SRC:DST[:ro|rw]` (read-write unless :ro; repeatable)")
	fs.BoolVar(&f.readOnly, "read-only", false, "mount the workspace read-only")
	fs.BoolVar(&f.interactive, "i", false, "pass stdin to the command")
	fs.BoolVar(&f.tty, "t", false, "run the command on a terminal of the size of yours")
	fs.BoolVar(&f.both, "it", false, "-i and -t: an interactive shell, say")
	fs.BoolVar(&f.both, "ti", false, "the same as -it")
}

// command is argv to run in the workspace wd (or -w), with -e's
// environment; a command the engine would not take is a usageError.
func (f *runFlags) command(argv []string, wd string, stdout, stderr io.Writer) (sandbox.Command, error) {
	cmd := sandbox.Command{Command: argv[0], Args: argv[1:], Cwd: wd, Stdout: stdout, Stderr: stderr}
	var err error
	if cmd.Env, err = envFlags(f.env); err != nil {
		return cmd, err
	}
	if f.workdir != "" {
		if cmd.Cwd, err = sandbox.WorkDir(wd, string(f.workdir)); err != nil {
			return cmd, usageError{fmt.Errorf("-w: %w", err)}
		}
	}
	if err := cmd.Check(); err != nil {
		return cmd, usageError{errors.New(sandbox.Reason(err))}
	}
	return cmd, nil
}

// mounts reads -v, with relative sources in the workspace wd.
func (f *runFlags) mounts(wd string) ([]sandbox.Mount, error) {
	// A relative source is taken from the workspace as it really is: the
	// way there may pass links of the user's, which a grant may not.
	base := wd
	if real, err := filepath.EvalSymlinks(wd); err == nil {
		base = real
	}
	return volumeFlags(f.volumes, base)
}

// override is run's check for setup: it makes the configuration run's
// (the workspace, --read-only, the -v mounts) and refuses a spec or mount
// the configuration does not allow.
func (f *runFlags) override(spec sandbox.SessionSpec, mounts []sandbox.Mount) func(*sandbox.Config) error {
	return func(cfg *sandbox.Config) error {
		// run's workspace is where it runs, whatever session.workspace
		// says: that is the one checked at start (as the directory
		// sandboxd runs in, no setting of the file).
		cfg.Session.Workspace = ""
		if f.readOnly {
			cfg.Session.WorkspaceMode = "ro"
		}
		if len(mounts) > 0 {
			cli, err := engine.New()
			if err != nil {
				return err
			}
			defer cli.Close()
			for _, mt := range mounts {
				if err := cfg.AddMount(mt, engine.Socket(cli)); err != nil {
					return usageError{err}
				}
			}
		}
		if _, err := sandbox.ValidateSpec(*cfg, runtime.NumCPU(), spec); err != nil {
			return overrideError(err)
		}
		return nil
	}
}

// terminal sets cmd up for -t, on a terminal of the user's terminal's
// size, and returns Run's options: that size's changes and, with -i, the
// raw mode of the user's terminal in, which restore ends.
func (f *runFlags) terminal(ctx context.Context, cmd *sandbox.Command, in *os.File, stdin io.Reader, stdout io.Writer) (opts sandbox.RunOptions, restore func()) {
	var resize <-chan sandbox.Size
	if f.tty {
		// The size is that of the terminal the user sees: the input's,
		// else the output's; with neither, a terminal's usual 80x24.
		cmd.TTY, cmd.Stderr, cmd.Cols, cmd.Rows = true, nil, 80, 24
		for _, std := range []any{stdin, stdout} {
			if file, ok := std.(*os.File); ok && console.IsTerminal(int(file.Fd())) {
				// Watched first: a change while the size is read is
				// sent, not lost.
				resize = watchSize(ctx, int(file.Fd()))
				if size, err := console.SizeOf(int(file.Fd())); err == nil {
					cmd.Cols, cmd.Rows = size.Cols, size.Rows
				}
				break
			}
		}
	}
	opts = sandbox.RunOptions{Resize: resize}
	var state *console.State
	restore = func() {
		if state != nil {
			state.Restore()
		}
	}
	if f.tty && f.interactive {
		// Raw only once the container is ready: while it starts, Ctrl-C
		// is sandboxd's, and stops the run before the command runs.
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
	return opts, restore
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

// watchSize brings each new size of the terminal fd, the latest only, until
// ctx is done.
func watchSize(ctx context.Context, fd int) <-chan sandbox.Size {
	sizes := console.Watch(ctx, fd)
	out := make(chan sandbox.Size, 1)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case size := <-sizes:
				select {
				case <-out:
				default:
				}
				out <- sandbox.Size{Cols: size.Cols, Rows: size.Rows}
			}
		}
	}()
	return out
}
