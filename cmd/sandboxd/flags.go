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
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd"
	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/internal/engine"
	"github.com/sandboxd/sandboxd/limits"
	"github.com/sandboxd/sandboxd/sandbox"
)

// usageError is a command line that asks for what cannot be done.
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

// parseNoArgs is parseFlags for a command that takes no arguments: one
// left after the flags is a usageError.
func parseNoArgs(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
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

// parseSize reads a size such as 1MiB, as the configuration takes it.
func parseSize(v string) (int64, error) { return limits.ParseBytes(v) }

// stringList is a repeatable flag: every value given, in order.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// nonEmpty is a flag that, when given, must have a value: an empty one
// would silently stand for the default it was meant to change.
type nonEmpty string

func (v *nonEmpty) String() string { return string(*v) }

func (v *nonEmpty) Set(s string) error {
	if strings.TrimSpace(s) == "" {
		return errors.New("empty or blank (leave the flag out for the default)")
	}
	*v = nonEmpty(s)
	return nil
}

// common holds the flags every command that opens sessions shares.
type common struct {
	config   nonEmpty
	logLevel string
	logFile  nonEmpty
}

// register adds the flags to fs, with defaultLevel as --log-level's default.
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
		private = append(private, dir, forwarderCache(dir))
	}
	cfg.Private = private
	if check != nil {
		if err := check(&cfg); err != nil {
			return nil, err
		}
	}
	cli, err := engine.New()
	if err != nil {
		return nil, err
	}
	m, err := sandbox.NewManager(ctx, cli, cfg, log)
	if err != nil {
		return nil, err
	}
	m.GCInBackground()
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

// closeManager closes m, allowing it a minute, and logs a failure.
func closeManager(m *sandbox.Manager, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.Close(ctx); err != nil {
		log.Error("shutdown", "err", err)
	}
}

// overrideError words a session override that ValidateSpec refused as the
// fault of the flag that asked for it: its messages start with the
// setting's name ("cpus 3 is too many"), which is the flag's.
func overrideError(err error) error {
	return usageError{errors.New("--" + sandbox.Reason(err))}
}

// sessionFlags override the configured image, network and limits of every
// session.
type sessionFlags struct {
	cpus, memory, pids, network, image nonEmpty
}

// register adds the flags to fs.
func (f *sessionFlags) register(fs *flag.FlagSet) {
	fs.Var(&f.cpus, "cpus", "`N` CPUs per session, e.g. 1.5 (default from config)")
	fs.Var(&f.memory, "memory", "memory per session, `SIZE` such as 512MiB (default from config)")
	fs.Var(&f.pids, "pids", "at most `N` processes per session (default from config)")
	fs.Var(&f.network, "network", "network `NAME`: none, or the configured network")
	fs.Var(&f.image, "image", "image `REF` (default from config)")
}

// spec returns the session overrides the flags ask for; a bad limit is a
// usageError.
func (f *sessionFlags) spec() (sandbox.SessionSpec, error) {
	spec := sandbox.SessionSpec{Image: string(f.image), Network: string(f.network)}
	for _, f := range []struct {
		name  string
		value nonEmpty
	}{{"cpus", f.cpus}, {"memory", f.memory}, {"pids", f.pids}} {
		if f.value == "" {
			continue
		}
		if err := spec.Limits.Set(f.name, string(f.value)); err != nil {
			return spec, usageError{fmt.Errorf("--%s: %w", f.name, err)}
		}
	}
	return spec, nil
}
