package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/console"
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

// ExitStatus is how a command ended: ExitCode for a normal exit, Signal
// (e.g. "SIGKILL") when sandboxd sent the signal or the memory cgroup's OOM
// killer did. Both are nil when the engine could not tell.
type ExitStatus struct {
	ExitCode *int
	Signal   *string
}

// Terminal is one command running as a docker exec in a session.
type Terminal struct {
	ID      string
	session *Session
	execID  string
	cmd     Command
	out     *OutputBuffer
	conn    client.HijackedResponse

	// reserved is what the output buffer counts against
	// server.max_output_memory until the terminal has left its session
	// and its command has ended: a released command that outlives its
	// kill still fills the buffer. holds counts which of the two is left.
	reserved int
	holds    atomic.Int32

	done   chan struct{} // closed once status is set
	status ExitStatus

	mu   sync.Mutex
	sent uint64 // bit n set once sandboxd sent signal n
	// signalled is what the last signal reached, as pid:start-time pairs
	// (signalMarked).
	signalled string
	kill      *killing // the kill in progress or done, nil after one failed
	// closed is set once the connection is closed, or is to be as soon
	// as start has it.
	closed bool
	// resizing orders resizes: the size recorded is the one the engine
	// was told last.
	resizing sync.Mutex
	// cols and rows are the size last made (Resize), which the command's
	// own sizing (ttySize) may have undone; guarded by resizing.
	cols, rows uint
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
// cannot.
const mergeStderr = `exec "$@" 2>&1`

// ttySize is a TTY command's entry point on an engine before API 1.42,
// which ignores the size given with the exec and is resized only once the
// command started: a program that asks at once (stty size, a full-screen
// editor) would mostly find 0x0. It sizes the terminal from inside before
// the command runs; an image without stty keeps that race, one without
// sh cannot run TTY commands there. A resize that comes before it ran is
// made again once the command's output begins (sizeAgain).
const ttySize = `stty rows "$1" cols "$2" 2>/dev/null; shift 2; exec "$@"`

// reaperPath is the engine's init (tini), which it mounts into every container
// started with init. Each command runs behind one of its own, registered as
// the subreaper of what the command starts: a process orphaned while the
// command runs becomes its child, not the container's init's, so the kill
// still finds it among the descendants of a marked process even if it
// removed the marker (killScript). The reaper exits with its child's
// status, 128+n for signal n.
const reaperPath = "/sbin/docker-init"

// execArgv is what the engine runs: Argv, behind mergeStderr unless the
// streams are kept apart (sandboxd run) or a TTY merges them already, and
// behind the reaper when the container has one.
func (c Command) execArgv(reaper, sizeInside bool) []string {
	argv := c.Argv()
	if !c.TTY && c.Stdout == nil && c.Stderr == nil {
		argv = append([]string{"/bin/sh", "-c", mergeStderr, "sh"}, argv...)
	}
	if sizeInside && c.TTY && c.Cols > 0 && c.Rows > 0 {
		argv = append([]string{"/bin/sh", "-c", ttySize, "sh", strconv.FormatUint(uint64(c.Rows), 10), strconv.FormatUint(uint64(c.Cols), 10)}, argv...)
	}
	if reaper {
		argv = append([]string{reaperPath, "-s", "--"}, argv...)
	}
	return argv
}

// MaxArgLen is the longest single argument or environment string Linux
// execve takes (MAX_ARG_STRLEN).
const MaxArgLen = 128 << 10

// CheckString rejects what cannot cross execve: NUL bytes and strings
// longer than MaxArgLen; and bytes that are not UTF-8, which cannot cross
// the engine's API. field names v in the error.
func CheckString(field, v string) error {
	if strings.IndexByte(v, 0) >= 0 {
		return fmt.Errorf("%w: %s: contains a NUL byte", ErrInvalid, field)
	}
	if len(v) >= MaxArgLen {
		return fmt.Errorf("%w: %s: %d bytes is longer than the %d an argument may have", ErrInvalid, field, len(v), MaxArgLen-1)
	}
	if !utf8.ValidString(v) {
		// The engine's API carries it as a JSON string, in which such
		// bytes become U+FFFD: `rm $'caf\xe9'` would name another file.
		return fmt.Errorf("%w: %s: %.200q holds bytes that are not UTF-8, which the engine's API cannot carry", ErrInvalid, field, v)
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
	return CheckString(field, e.Name+"="+e.Value)
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

// Start runs a command in the session's container. It returns once the
// engine has started the process; output and exit are collected in the
// background.
func (s *Session) Start(ctx context.Context, c Command) (*Terminal, error) {
	cwd, limit, err := s.validate(c)
	if err != nil {
		return nil, err
	}
	id, err := randomID(8)
	if err != nil {
		return nil, err
	}
	id = "term_" + id
	if err := s.m.reserveOutput(s.ID, limit); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.m.releaseOutput(limit)
		return nil, fmt.Errorf("session %s: %w", s.ID, ErrNotFound)
	}
	if max := int(s.m.cfg.Terminal.MaxTerminals); len(s.terminals) >= max {
		s.mu.Unlock()
		s.m.releaseOutput(limit)
		return nil, fmt.Errorf("session %s: %w: %d terminals are open (terminal.max_terminals); release some", s.ID, ErrLimit, max)
	}
	t := &Terminal{ID: id, session: s, cmd: c, out: NewOutputBuffer(limit), done: make(chan struct{}), reserved: limit}
	t.holds.Store(2) // its place in the session, and its command
	// Reserve the slot so concurrent creates respect the maximum.
	s.terminals[id] = t
	s.lastUsed = time.Now()
	s.ran = true
	s.mu.Unlock()

	if err := t.start(ctx, cwd); err != nil {
		s.forgetTerminal(t)
		t.unhold() // no command runs
		if s.isClosed() {
			// The engine's words for a container removed under the
			// start (an upgrade it refused) mean this.
			return nil, fmt.Errorf("create terminal in session %s: %w: the session was closed meanwhile", s.ID, ErrNotFound)
		}
		return nil, err
	}
	return t, nil
}

// forgetTerminal removes t from the session, once; it reports whether t
// was there.
func (s *Session) forgetTerminal(t *Terminal) bool {
	s.mu.Lock()
	there := s.terminals[t.ID] == t
	if there {
		delete(s.terminals, t.ID)
	}
	s.mu.Unlock()
	if there {
		t.unhold()
	}
	return there
}

// unhold gives up one of what keeps the output reservation; the last
// gives it back.
func (t *Terminal) unhold() {
	if t.holds.Add(-1) == 0 {
		t.session.m.releaseOutput(t.reserved)
	}
}

func (t *Terminal) start(ctx context.Context, cwd string) error {
	s := t.session
	cli := s.m.cli
	// The engine goes on with an exec whose caller gave up, and a process
	// started that way would be nobody's: the terminal sees both calls
	// through.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	env := make([]string, 0, len(t.cmd.Env)+1)
	for _, e := range t.cmd.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	env = append(env, MarkerEnv+"="+t.ID)
	size := client.ConsoleSize{Height: t.cmd.Rows, Width: t.cmd.Cols}
	ex, err := cli.ExecCreate(ctx, s.contID, client.ExecCreateOptions{
		User:         s.user,
		TTY:          t.cmd.TTY,
		ConsoleSize:  size,
		AttachStdin:  t.cmd.TTY || t.cmd.Stdin != nil,
		AttachStdout: true,
		AttachStderr: true,
		Env:          env,
		WorkingDir:   cwd,
		Cmd:          t.cmd.execArgv(s.m.reaper, s.m.sizedFromInside()),
	})
	if err != nil {
		if isNotFound(err) {
			return fmt.Errorf("create terminal in session %s: the session's container is gone: %w", s.ID, err)
		}
		return fmt.Errorf("create terminal in session %s: %w", s.ID, EngineError(err))
	}
	t.execID = ex.ID
	att, err := cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{TTY: t.cmd.TTY, ConsoleSize: size})
	if err != nil {
		// The engine may have started the command all the same (the
		// attach timed out): the sweep ends what carries its marker.
		s.sweepLater(t.ID)
		return fmt.Errorf("start terminal %s: %w", t.ID, EngineError(err))
	}
	t.mu.Lock()
	closed := t.closed
	t.conn = att.HijackedResponse
	t.mu.Unlock()
	// The session's close drops its terminals at once but closes them
	// only once the container is gone: it may be under way.
	if closed || s.isClosed() {
		// The session closed meanwhile, and with it the container: the
		// peer must not get the id of a terminal the session dropped.
		att.Close()
		return fmt.Errorf("start terminal %s: %w: the session was closed meanwhile", t.ID, ErrNotFound)
	}
	if t.cmd.TTY && t.cmd.Cols > 0 && t.cmd.Rows > 0 {
		// API 1.41 ignores ConsoleSize, so size the PTY explicitly.
		if err := t.Resize(ctx, t.cmd.Cols, t.cmd.Rows); err != nil {
			s.m.log.Debug("initial resize", "terminal", t.ID, "err", err)
		}
	}
	if t.cmd.Stdin != nil {
		go t.feed()
	}
	go t.collect()
	return nil
}

// feed copies Stdin to the command, and closes its input when Stdin ends,
// or fails (a directory, say: the command would wait for ever). A file
// (the user's terminal) is read only until the command exits, so that
// keys typed after it reach the user's shell (console.Input); a read of
// another reader cannot be interrupted, and feed may outlive the command
// until Stdin ends or the process does.
func (t *Terminal) feed() {
	src := t.cmd.Stdin
	if f, ok := src.(*os.File); ok {
		if in, err := console.NewInput(f, t.done); err == nil {
			defer in.Close()
			src = in
		}
	}
	in := &readErr{r: src}
	if _, err := io.Copy(t.conn.Conn, in); err != nil {
		if in.err == nil {
			// The command's side went away: it is done reading.
			t.session.m.log.Debug("terminal input", "terminal", t.ID, "err", err)
			return
		}
		t.session.m.log.Warn("reading the command's input failed; closing it", "terminal", t.ID, "err", in.err)
	}
	if err := t.conn.CloseWrite(); err != nil {
		t.session.m.log.Debug("terminal input", "terminal", t.ID, "err", err)
	}
}

// sizeAgain makes the size last asked for once more, when it is not the
// one the command started with: ttySize, running after a resize that came
// early, set the first size again.
func (t *Terminal) sizeAgain() {
	t.resizing.Lock()
	defer t.resizing.Unlock()
	cols, rows := t.cols, t.rows
	if cols == 0 || cols == t.cmd.Cols && rows == t.cmd.Rows {
		return
	}
	if err := t.resizeLocked(t.session.m.ctx, cols, rows); err != nil {
		t.session.m.log.Debug("resize again", "terminal", t.ID, "err", err)
	}
}

// firstRead calls then, in a goroutine of its own, once r first gave
// something.
type firstRead struct {
	r    io.Reader
	then func()
	done bool
}

func (f *firstRead) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if n > 0 && !f.done {
		f.done = true
		go f.then()
	}
	return n, err
}

// readErr remembers the error its reader gave, to tell it from a write's.
type readErr struct {
	r   io.Reader
	err error
}

func (r *readErr) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		r.err = err
	}
	return n, err
}

// collect drains the output until EOF, then records the exit status. It
// must drain continuously: a command whose output is not read blocks.
func (t *Terminal) collect() {
	var err error
	if t.cmd.TTY {
		var src io.Reader = t.conn.Reader
		if t.session.m.sizedFromInside() {
			src = &firstRead{r: src, then: t.sizeAgain}
		}
		_, err = io.Copy(tee(t.out, t.cmd.Stdout), src)
	} else {
		// One buffer for both streams keeps their arrival order.
		_, err = stdcopy.StdCopy(tee(t.out, t.cmd.Stdout), tee(t.out, t.cmd.Stderr), t.conn.Reader)
	}
	s := t.session
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) {
		s.m.log.Debug("terminal stream", "terminal", t.ID, "err", err)
	}
	// The command is done with its streams; a terminal kept unreleased
	// must not keep a connection to the engine.
	t.close()
	code, err := waitExec(s.m.ctx, s.m.cli, t.execID)
	if err != nil {
		if t.wasSent(syscall.SIGKILL) {
			// The session's container was removed under the command.
			name := SignalName(syscall.SIGKILL)
			t.finish(ExitStatus{Signal: &name})
			return
		}
		s.m.log.Warn("terminal exit status unknown", "terminal", t.ID, "err", err)
		t.finish(ExitStatus{})
		return
	}
	t.finish(t.exitStatus(code))
}

// tee writes to the buffer and, best effort, to w.
func tee(b *OutputBuffer, w io.Writer) io.Writer {
	if w == nil {
		return b
	}
	return teeWriter{b, w}
}

type teeWriter struct {
	b *OutputBuffer
	w io.Writer
}

func (t teeWriter) Write(p []byte) (int, error) {
	t.w.Write(p)
	return t.b.Write(p)
}

// exitStatus turns the exec's exit code into a status. Exit code 128+n looks
// the same whether signal n killed the process or it ran `exit 128+n`, so a
// signal is only reported when sandboxd sent it or the OOM killer did.
func (t *Terminal) exitStatus(code int) ExitStatus {
	if code == 126 {
		code = shellCode(code, t.out.Head())
	}
	var sig syscall.Signal
	switch {
	case code > 128 && code < 128+64 && t.wasSent(syscall.Signal(code-128)):
		sig = syscall.Signal(code - 128)
	case code == 128+int(syscall.SIGKILL) && t.session.oomKillsRose(t.session.m.ctx):
		sig = syscall.SIGKILL
	}
	if sig != 0 {
		name := SignalName(sig)
		return ExitStatus{Signal: &name}
	}
	return ExitStatus{ExitCode: &code}
}

// shellCode turns the engine's exit code 126 for a command it could not
// find into a shell's 127: the engine gives 126 for every command it could
// not start, with its reason as the output, where a shell (and an agent
// reading the status) tells "no such command" (127) from "cannot run it"
// (126).
func shellCode(code int, head []byte) int {
	if code != 126 || !bytes.HasPrefix(head, []byte("OCI runtime exec failed")) {
		return code
	}
	if bytes.Contains(head, []byte("chdir to cwd")) {
		return code // the command may be there; the directory is not
	}
	if bytes.Contains(head, []byte("executable file not found")) || bytes.Contains(head, []byte("no such file or directory")) {
		return 127
	}
	return code
}

// SignalName returns the conventional name of a signal, e.g. "SIGKILL".
func SignalName(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGHUP:
		return "SIGHUP"
	case syscall.SIGQUIT:
		return "SIGQUIT"
	}
	return fmt.Sprintf("SIG%d", int(sig))
}

// markSent records that sandboxd sent sig, before sending it.
func (t *Terminal) markSent(sig syscall.Signal) {
	t.mu.Lock()
	t.sent |= 1 << uint(sig)
	t.mu.Unlock()
}

func (t *Terminal) wasSent(sig syscall.Signal) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sent&(1<<uint(sig)) != 0
}

func (t *Terminal) finish(st ExitStatus) {
	t.status = st
	// Before done: whoever sees the command end may count on its
	// buffer being free once it is released.
	t.unhold()
	close(t.done)
}

// Done is closed when the command has exited and its output is complete.
func (t *Terminal) Done() <-chan struct{} { return t.done }

// Exited reports whether the command has exited.
func (t *Terminal) Exited() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// Output returns the retained output, whether any was dropped, and the exit
// status once the command has exited. It never waits. The output is text
// as ACP sends it: valid UTF-8 (each run of bytes that are no part of a
// character shown as one U+FFFD), and still within the buffer's limit.
func (t *Terminal) Output() (out []byte, truncated bool, status *ExitStatus) {
	// Read the status before the output: once done is closed the output is
	// final, so a status never comes with output that is still growing.
	if t.Exited() {
		st := t.status
		status = &st
	}
	out, truncated = t.out.Snapshot()
	if status == nil {
		// The rest of a character cut in half by the read is still on
		// its way: shown now it would be U+FFFD, and a different text
		// next time.
		out = out[:len(out)-IncompleteTail(out)]
	}
	if !utf8.Valid(out) {
		// JSON would turn each bad byte into three: the replacement is
		// made here, and the text cut again to the limit.
		out = []byte(strings.ToValidUTF8(string(out), string(utf8.RuneError)))
		if limit := t.out.Limit(); len(out) > limit {
			out, truncated = cutToRuneStart(out[len(out)-limit:]), true
		}
	}
	return out, truncated, status
}

// Buffer returns the terminal's output buffer, for watchers.
func (t *Terminal) Buffer() *OutputBuffer { return t.out }

// Command returns what the terminal runs.
func (t *Terminal) Command() Command { return t.cmd }

// Wait blocks until the command exits or ctx ends.
func (t *Terminal) Wait(ctx context.Context) (ExitStatus, error) {
	select {
	case <-t.done:
		return t.status, nil
	case <-ctx.Done():
		return ExitStatus{}, ctx.Err()
	}
}

// Kill stops the command and every process it started: SIGTERM (SIGHUP for
// a TTY, a terminal being closed, which interactive shells obey and SIGTERM
// they ignore), then after the grace period SIGKILL. It returns once the command has exited. Killing
// a command that has exited does nothing.
func (t *Terminal) Kill(ctx context.Context) error {
	t.mu.Lock()
	if k := t.kill; k != nil {
		// Under way: the command may have exited, what it left that
		// ignores SIGTERM not yet.
		t.mu.Unlock()
		select {
		case <-k.done:
			return k.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if t.Exited() {
		t.mu.Unlock()
		return nil
	}
	k := &killing{done: make(chan struct{})}
	t.kill = k
	t.mu.Unlock()
	err := t.killOnce(ctx)
	k.err = err
	if err != nil {
		// The next kill tries again rather than take this one's word.
		t.mu.Lock()
		t.kill = nil
		t.mu.Unlock()
	}
	close(k.done)
	return err
}

// killing is a kill in progress, which concurrent kills wait for.
type killing struct {
	done chan struct{}
	err  error // set before done is closed
}

func (t *Terminal) killOnce(ctx context.Context) error {
	// The kill must finish even if the caller gives up: a half-killed
	// command is worse than a slow reply. An engine that hangs must not
	// hold the caller (and every kill waiting on this one) for ever.
	grace := time.Duration(t.session.m.cfg.Terminal.KillGrace)
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace+time.Minute)
	defer cancel()
	if grace > 0 {
		stop := syscall.SIGTERM
		if t.cmd.TTY {
			stop = syscall.SIGHUP
		}
		if err := t.signalAll(kctx, stop, false); err != nil {
			return fmt.Errorf("kill terminal %s: %w", t.ID, err)
		}
		select {
		case <-t.done:
		case <-time.After(grace):
		}
	}
	// Always finish with SIGKILL: children forked while SIGTERM was on its
	// way, or that ignore it, would otherwise outlive the command.
	if err := t.signalAll(kctx, syscall.SIGKILL, grace > 0); err != nil {
		return fmt.Errorf("kill terminal %s: %w", t.ID, err)
	}
	select {
	case <-t.done:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("kill terminal %s: still running after SIGKILL", t.ID)
	}
	return nil
}

// signalAll signals every process of the command. Those the kill found
// before are found again by pid and start time, so that one which removed
// the marker and whose parent then died of the first signal still gets the
// second.
// The start and groups the pass before printed (killScript) are passed on
// only when fresh, from this kill's own first pass: an older kill's would
// widen what the SIGKILL takes to all it started since.
func (t *Terminal) signalAll(ctx context.Context, sig syscall.Signal, fresh bool) error {
	t.markSent(sig)
	t.mu.Lock()
	if !fresh {
		// Also dropped where they are kept: a pass that fails leaves
		// none behind for the next.
		t.signalled = pairsOnly(t.signalled)
	}
	known := t.signalled
	t.mu.Unlock()
	found, err := t.session.signalMarked(ctx, sig, []string{t.ID}, known)
	if err == nil && found != "" {
		t.mu.Lock()
		t.signalled = found
		t.mu.Unlock()
	}
	if err != nil && (t.Exited() || t.session.isClosed()) {
		// Gone already, or going with its container.
		return nil
	}
	return err
}

// pairsOnly drops from a kill's known processes the start and groups of
// the pass that printed them.
func pairsOnly(known string) string {
	var b strings.Builder
	for f := range strings.FieldsSeq(known) {
		if f[0] != '@' && f[0] != '%' {
			b.WriteString(f + " ")
		}
	}
	return b.String()
}

// Resize changes the size of a TTY terminal.
func (t *Terminal) Resize(ctx context.Context, cols, rows uint) error {
	t.resizing.Lock()
	defer t.resizing.Unlock()
	return t.resizeLocked(ctx, cols, rows)
}

func (t *Terminal) resizeLocked(ctx context.Context, cols, rows uint) error {
	_, err := t.session.m.cli.ExecResize(ctx, t.execID, client.ExecResizeOptions{Width: cols, Height: rows})
	if err != nil {
		return fmt.Errorf("resize terminal %s: %w", t.ID, err)
	}
	t.cols, t.rows = cols, rows
	return nil
}

// Input writes to a TTY terminal's input.
func (t *Terminal) Input(p []byte) error {
	if !t.cmd.TTY {
		return fmt.Errorf("input to terminal %s: %w: not a TTY", t.ID, ErrInvalid)
	}
	if _, err := t.conn.Conn.Write(p); err != nil {
		return fmt.Errorf("input to terminal %s: %w", t.ID, err)
	}
	return nil
}

// TryInput writes as much of p to a TTY terminal's input as the connection
// takes without waiting, and returns how much that was: a program that
// does not read its terminal fills the connection, and whoever types must
// then not wait for it. It writes nothing when the connection cannot be
// written that way; Input then writes.
func (t *Terminal) TryInput(p []byte) (int, error) {
	if !t.cmd.TTY {
		return 0, fmt.Errorf("input to terminal %s: %w: not a TTY", t.ID, ErrInvalid)
	}
	sc, ok := t.conn.Conn.(syscall.Conn)
	if !ok {
		return 0, nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, nil
	}
	var n int
	var werr error
	err = rc.Write(func(fd uintptr) bool {
		n, werr = syscall.Write(int(fd), p)
		return true // one attempt, never a wait
	})
	if errors.Is(werr, syscall.EAGAIN) || errors.Is(werr, syscall.EINTR) {
		return 0, nil
	}
	if err == nil {
		err = werr
	}
	if err != nil {
		return 0, fmt.Errorf("input to terminal %s: %w", t.ID, err)
	}
	return n, nil
}

// close frees the terminal's connection. The output stays readable to
// whoever still holds the terminal.
func (t *Terminal) close() {
	t.mu.Lock()
	conn, was := t.conn, t.closed
	t.closed = true
	t.mu.Unlock()
	if !was && conn.Conn != nil {
		conn.Close()
	}
}
