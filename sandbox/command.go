package sandbox

import (
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MarkerEnv is set in every command's environment to the terminal id. Every
// process the command starts inherits it, including ones that leave its
// process group or session, which is how a kill finds them all without host
// pids, so it works with a remote engine too.
const MarkerEnv = "SANDBOXD_TERMINAL"

// EnvVar is one environment variable for a command.
type EnvVar struct {
	Name  string
	Value string
}

// Command is what a terminal runs.
type Command struct {
	// Command is run with Args as given. With no Args and shell syntax in
	// Command (spaces, quotes, pipes, ...), it runs as `/bin/sh -c Command`,
	// which is what agents that send a whole command line expect.
	Command string
	Args    []string
	Env     []EnvVar
	// Cwd is an absolute path at or below the workspace; empty means the
	// workspace.
	Cwd string
	// OutputLimit is the byte limit of the output buffer; 0 means the
	// configured default.
	OutputLimit *int64
	// TTY runs the command on a pseudo-terminal (AHP terminals).
	TTY bool
	// Cols and Rows size the TTY.
	Cols, Rows uint
	// Stdout and Stderr, when set, also get the output live, each stream
	// to its own writer (sandboxd run). Their errors never stop the command.
	Stdout, Stderr io.Writer
	// Stdin, when set, is copied to the command's input, which is closed
	// when Stdin ends (sandboxd run -i).
	Stdin io.Reader
}

const shellChars = " \t\n|&;<>()$`\\\"'*?[]#~=%{}!"

// Argv returns the argument vector the command runs with.
func (c Command) Argv() []string {
	if len(c.Args) == 0 && strings.ContainsAny(c.Command, shellChars) {
		return []string{"/bin/sh", "-c", c.Command}
	}
	return append([]string{c.Command}, c.Args...)
}

// mergeStderr is the exec's entry point when output is merged: one pipe for
// both streams keeps their true order, which two pipes read by the engine
// cannot. Before the command it prints, alone on the exec's stderr, the
// /proc stat line of the shell, which the command then is (exec): the
// session the command leads and its start time, by which a kill finds
// what the command started also when the command removed its marker
// (killScript). dash, bash and busybox sh all have local.
const mergeStderr = `f() { local l; read -r l 2>/dev/null </proc/$$/stat && printf '%s\n' "$l" >&2; }; f; exec "$@" 2>&1`

// ttySize is a TTY command's entry point on an engine before API 1.42,
// which ignores the size given with the exec and is resized only once the
// command started: a program that asks at once (stty size, a full-screen
// editor) would mostly find 0x0. It sizes the terminal from inside before
// the command runs; an image without stty keeps that race, one without
// sh cannot run TTY commands there. A resize that comes before it ran is
// made again once the command's output begins (sizeAgain).
const ttySize = `stty rows "$1" cols "$2" 2>/dev/null; shift 2; exec "$@"`

// reaperPath is the engine's init (tini), which it mounts into every
// container started with init. A command whose streams are kept apart
// (sandboxd run) runs behind one of its own: run says in its own words
// what the reaper says when it cannot start the command. Others run as
// the exec's first process: a reaper is a process of the commands' user,
// which a command can kill (`kill -9 -1`) and go on, and the engine would
// report the reaper's death as the command's status.
const reaperPath = "/sbin/docker-init"

// execArgv is what the engine runs: Argv, behind mergeStderr unless the
// streams are kept apart (sandboxd run) or a TTY merges them already, and,
// when the streams are kept apart and the container has one, behind the
// reaper.
func (c Command) execArgv(reaper, sizeInside bool) []string {
	argv := c.Argv()
	if c.merged() {
		argv = append([]string{"/bin/sh", "-c", mergeStderr, "sh"}, argv...)
	}
	if sizeInside && c.TTY && c.Cols > 0 && c.Rows > 0 {
		argv = append([]string{"/bin/sh", "-c", ttySize, "sh", strconv.FormatUint(uint64(c.Rows), 10), strconv.FormatUint(uint64(c.Cols), 10)}, argv...)
	}
	if reaper && !c.TTY && !c.merged() {
		argv = append([]string{reaperPath, "-s", "--"}, argv...)
	}
	return argv
}

// merged says the command's stdout and stderr go into one pipe of its own
// (mergeStderr): it has no TTY, and no writers of its own for them.
func (c Command) merged() bool {
	return !c.TTY && c.Stdout == nil && c.Stderr == nil
}

// MaxArgLen is the longest single argument or environment string Linux
// execve takes (MAX_ARG_STRLEN).
const MaxArgLen = 128 << 10

// CheckString rejects what cannot cross execve: NUL bytes and strings
// longer than MaxArgLen; and bytes that are not UTF-8, which cannot cross
// the engine's API. field names v in the error.
func CheckString(field, v string) error {
	return checkString(field, v, fmt.Sprintf("%.200q", v))
}

// checkString is CheckString naming v as shown, which can keep a secret
// out of the error.
func checkString(field, v, shown string) error {
	if strings.IndexByte(v, 0) >= 0 {
		return fmt.Errorf("%w: %s: contains a NUL byte", ErrInvalid, field)
	}
	if len(v) >= MaxArgLen {
		return fmt.Errorf("%w: %s: %d bytes is longer than the %d an argument may have", ErrInvalid, field, len(v), MaxArgLen-1)
	}
	if !utf8.ValidString(v) {
		// The engine's API carries it as a JSON string, in which such
		// bytes become U+FFFD: `rm $'caf\xe9'` would name another file.
		return fmt.Errorf("%w: %s: %s holds bytes that are not UTF-8, which the engine's API cannot carry", ErrInvalid, field, shown)
	}
	return nil
}

// maxExecBytes bounds what a command, its args and env take in execve:
// Linux's usual ARG_MAX (a quarter of the default 8 MiB stack), less room
// for the container's own environment and the entry points sandboxd puts
// in front. Past it the engine's exec fails with "argument list too long".
const maxExecBytes = 2<<20 - 64<<10

// execBytes is what c takes in execve: each string with its NUL and its
// pointer.
func execBytes(c Command) int {
	n := 0
	for _, a := range c.Argv() {
		n += len(a) + 1 + 8
	}
	for _, e := range c.Env {
		n += len(e.Name) + 1 + len(e.Value) + 1 + 8
	}
	return n
}

// CheckEnvVar rejects an environment variable a command cannot be given:
// a name that is empty, holds '=' or NUL, or is sandboxd's marker, and a
// NAME=value that CheckString refuses. field names e in the error.
func CheckEnvVar(field string, e EnvVar) error {
	switch {
	case e.Name == "":
		return fmt.Errorf("%w: %s.name: must not be empty", ErrInvalid, field)
	case strings.ContainsAny(e.Name, "=\x00"):
		return fmt.Errorf("%w: %s.name: %.200q must not contain '=' or NUL", ErrInvalid, field, e.Name)
	case e.Name == MarkerEnv:
		return fmt.Errorf("%w: %s.name: %s is reserved by sandboxd", ErrInvalid, field, MarkerEnv)
	}
	// The value is named, never shown: it is a secret as often as not.
	shown := fmt.Sprintf("the value of %.200q", e.Name)
	if !utf8.ValidString(e.Name) {
		shown = fmt.Sprintf("the name %.200q", e.Name)
	}
	return checkString(field, e.Name+"="+e.Value, shown)
}

// Check refuses a command that cannot run as given, whatever the session:
// an empty or option-like command, strings execve cannot take, a reserved
// or malformed environment variable.
func (c Command) Check() error {
	if c.Command == "" {
		return fmt.Errorf("%w: command: must not be empty", ErrInvalid)
	}
	if err := CheckString("command", c.Command); err != nil {
		return err
	}
	if c.Cwd != "" {
		if err := CheckString("cwd", c.Cwd); err != nil {
			return err
		}
	}
	if c.Command[0] == '-' {
		// sh's exec (mergeStderr) would take it as an option of its own,
		// and dash's takes no "--" to say otherwise; no program is named
		// so.
		return fmt.Errorf("%w: command: %.200q starts with '-'", ErrInvalid, c.Command)
	}
	for i, a := range c.Args {
		if err := CheckString(fmt.Sprintf("args[%d]", i), a); err != nil {
			return err
		}
	}
	for i, e := range c.Env {
		if err := CheckEnvVar(fmt.Sprintf("env[%d]", i), e); err != nil {
			return err
		}
	}
	if n := execBytes(c); n > maxExecBytes {
		return fmt.Errorf("%w: command, args and env together take %d bytes, more than the %d a command may be given (Linux's ARG_MAX, less what sandboxd adds)", ErrInvalid, n, maxExecBytes)
	}
	return nil
}

// validate checks a command against the session and configuration and
// returns the cwd and output limit it will run with.
func (s *Session) validate(c Command) (cwd string, limit int, err error) {
	if err := c.Check(); err != nil {
		return "", 0, err
	}
	cwd = s.Dir()
	if c.Cwd != "" {
		if err := CheckString("cwd", c.Cwd); err != nil {
			return "", 0, err
		}
		if !strings.HasPrefix(c.Cwd, "/") {
			return "", 0, fmt.Errorf("%w: cwd: %.200q is not an absolute path", ErrInvalid, c.Cwd)
		}
		cwd = filepath.Clean(c.Cwd)
		if !s.inMounts(cwd) {
			return "", 0, fmt.Errorf("%w: cwd: %.200q is outside the session's workspace %s", ErrInvalid, c.Cwd, s.spec.Workspace)
		}
		if err := CheckIsDir(cwd); err != nil {
			return "", 0, err
		}
	}
	tc := s.m.cfg.Terminal
	limit = int(tc.OutputByteLimit)
	if c.OutputLimit != nil {
		switch {
		case *c.OutputLimit < 0:
			return "", 0, fmt.Errorf("%w: outputByteLimit: %d is negative", ErrInvalid, *c.OutputLimit)
		case *c.OutputLimit > int64(tc.MaxOutputByteLimit):
			return "", 0, fmt.Errorf("%w: outputByteLimit: %d is above the maximum %d (terminal.max_output_byte_limit)", ErrInvalid, *c.OutputLimit, int64(tc.MaxOutputByteLimit))
		}
		limit = int(*c.OutputLimit)
	}
	return cwd, limit, nil
}

func (s *Session) inMounts(p string) bool {
	for _, root := range append([]string{s.spec.Workspace}, s.spec.ExtraDirs...) {
		if Within(root, p) {
			return true
		}
	}
	return false
}

// Within reports whether the clean absolute path p is root or below it.
func Within(root, p string) bool {
	return p == root || strings.HasPrefix(p, strings.TrimSuffix(root, "/")+"/")
}

// startLine takes, from the stderr of a command behind mergeStderr, the
// line its shell prints before the command runs, and passes on what comes
// after it (nothing of the command's: its stderr is joined to its stdout).
// A first line of another form is passed on too.
type startLine struct {
	t    *Terminal
	w    io.Writer
	head []byte
	done bool
}

// maxStartLine is longer than any /proc stat line of a shell.
const maxStartLine = 1024

func (l *startLine) Write(p []byte) (int, error) {
	if l.done {
		return l.w.Write(p)
	}
	l.head = append(l.head, p...)
	i := bytes.IndexByte(l.head, '\n')
	if i < 0 && len(l.head) < maxStartLine {
		return len(p), nil
	}
	rest := l.head
	top, ok := sessionLed(l.head[:max(i, 0)])
	if ok {
		rest = l.head[i+1:]
	}
	l.t.setTop(top)
	l.head, l.done = nil, true
	if len(rest) > 0 {
		if _, err := l.w.Write(rest); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// flush passes on what is held back once the stream has ended.
func (l *startLine) flush() {
	if !l.done && len(l.head) > 0 {
		l.w.Write(l.head)
	}
	l.head, l.done = nil, true
	l.t.setTop("")
}

// setTop records the session the command leads ("": none known), once.
func (t *Terminal) setTop(top string) {
	t.topOnce.Do(func() {
		t.mu.Lock()
		t.top = top
		t.mu.Unlock()
		if t.topSaid != nil {
			close(t.topSaid)
		}
	})
}

// sessionLed reads a /proc/PID/stat line and returns the session the
// process leads, as killScript takes it ("%SID:start "); ok is false when
// the line is no such line, or the process leads no session.
func sessionLed(line []byte) (string, bool) {
	pid, _, ok := bytes.Cut(line, []byte(" ("))
	end := bytes.LastIndexByte(line, ')')
	if !ok || end < 0 {
		return "", false
	}
	f := strings.Fields(string(line[end+1:]))
	if len(f) < 20 || f[3] != string(pid) {
		return "", false
	}
	for _, n := range []string{f[3], f[19]} {
		if _, err := strconv.ParseUint(n, 10, 64); err != nil {
			return "", false
		}
	}
	return "%" + f[3] + ":" + f[19] + " ", true
}
