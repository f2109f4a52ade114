package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/moby/moby/api/pkg/stdcopy"

	"github.com/sandboxd/sandboxd/internal/engine"
)

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
	conn    engine.HijackedResponse

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
	// signalled is what the last signal reached, as sessions and
	// pid:start-time pairs (signalMarked).
	signalled string
	// top is the session the command's first process leads, as
	// "%SID:start ", once its shell said (mergeStderr); topSaid is closed
	// once it said, or will not.
	top     string
	topSaid chan struct{}
	topOnce sync.Once
	kill    *killing // the kill in progress or done, nil after one failed
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
	t := &Terminal{ID: id, session: s, cmd: c, out: NewOutputBuffer(limit), done: make(chan struct{}), topSaid: make(chan struct{}), reserved: limit}
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
	// A create that the engine does not answer may be held by an exec
	// whose start a command stopped: sandboxd frees the engine, and the
	// create goes on.
	watch := time.AfterFunc(startWatch, func() { s.unwedge("create terminal " + t.ID) })
	defer watch.Stop()
	env := make([]string, 0, len(t.cmd.Env)+1)
	for _, e := range t.cmd.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	env = append(env, MarkerEnv+"="+t.ID)
	size := engine.ConsoleSize{Height: t.cmd.Rows, Width: t.cmd.Cols}
	ex, err := cli.ExecCreate(ctx, s.contID, engine.ExecCreateOptions{
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
		if engine.IsNotFound(err) {
			return fmt.Errorf("create terminal in session %s: the session's container is gone: %w", s.ID, err)
		}
		return fmt.Errorf("create terminal in session %s: %w", s.ID, engine.Error(err))
	}
	t.execID = ex.ID
	att, err := cli.ExecAttach(ctx, ex.ID, engine.ExecAttachOptions{TTY: t.cmd.TTY, ConsoleSize: size})
	if err != nil {
		// The engine may have started the command all the same (the
		// attach timed out): the sweep ends what carries its marker.
		s.sweepLater(t.ID)
		return fmt.Errorf("start terminal %s: %w", t.ID, engine.Error(err))
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
// or fails (a directory, say: the command would wait for ever). A read of
// Stdin cannot be interrupted, so feed may outlive the command until
// Stdin ends or the process does.
func (t *Terminal) feed() {
	in := &readErr{r: t.cmd.Stdin}
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
		stderr := tee(t.out, t.cmd.Stderr)
		var start *startLine
		if t.cmd.merged() {
			start = &startLine{t: t, w: stderr}
			stderr = start
		}
		_, err = stdcopy.StdCopy(tee(t.out, t.cmd.Stdout), stderr, t.conn.Reader)
		if start != nil {
			start.flush()
		}
	}
	s := t.session
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) {
		s.m.log.Debug("terminal stream", "terminal", t.ID, "err", err)
	}
	// The command is done with its streams; a terminal kept unreleased
	// must not keep a connection to the engine.
	t.close()
	code, err := engine.WaitExec(s.m.ctx, s.m.cli, t.execID)
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

// Resize changes the size of a TTY terminal.
func (t *Terminal) Resize(ctx context.Context, cols, rows uint) error {
	t.resizing.Lock()
	defer t.resizing.Unlock()
	return t.resizeLocked(ctx, cols, rows)
}

func (t *Terminal) resizeLocked(ctx context.Context, cols, rows uint) error {
	_, err := t.session.m.cli.ExecResize(ctx, t.execID, engine.ExecResizeOptions{Width: cols, Height: rows})
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
