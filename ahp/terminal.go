package ahp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/ahp/osc633"
	"github.com/sandboxd/sandboxd/sandbox"
)

// terminal is one PTY exec in a session container, with the state the
// server keeps for its channel (guarded by the server's lock).
type terminal struct {
	uri     string
	s       *Server
	session *sandbox.Session
	t       *sandbox.Terminal
	state   TerminalState
	// since is the serverSeq before the terminal was made: a client that
	// saw no later one knew another terminal, if any, under this URI.
	since int64
	// unfolded is terminal data not yet reduced into state: appending to
	// the state's last part copies it, so data is gathered here and
	// reduced in one go, when the state is read or this reaches the cap.
	unfolded []byte

	// ready is closed once state is set up; output waits for it.
	ready chan struct{}

	// input carries client input to the PTY, in the order the actions
	// were numbered, written by a goroutine of the terminal's own: a
	// program that does not read its terminal must not hold up the
	// client that typed. inputBytes is what it holds (guarded by s.mu).
	input      chan []byte
	inputBytes int
	// resizing is held from a resize's engine call until the lock is
	// held again to emit it.
	resizing sync.Mutex
	// nonce is typed for the launcher when it asks (OSC 633 R;nonce);
	// until it has it (R;ready) or wants none (R;none), input waits in
	// input, and opened (guarded by s.mu) is false. gate is closed when
	// it turns true, once.
	nonce    string
	opened   bool
	gate     chan struct{}
	openOnce sync.Once
	// typing orders the nonce typed for a launcher that asks only after
	// the launch timeout against the input that then flows: wroteInput
	// says some went in first (the launcher has read that line instead).
	typing     sync.Mutex
	wroteInput bool

	// Used by the exec's output goroutine only, then by wait.
	parser    *osc633.Parser
	asked     bool // the launcher asked for the nonce
	launched  bool // it has it (R;ready) or wants none (R;none)
	detecting bool
	line      string
	// armed says a command line came with the nonce (E) and its start
	// (C) may follow: the script sends the two together, and a C or D
	// without it is a program's output forging commands.
	armed   bool
	cmdID   int
	started time.Time
	running bool
	carry   []byte // a character cut in half at the end of a read
}

const (
	// maxURI bounds a terminal's channel URI, which every action carries.
	maxURI = 1024
	// maxSize bounds a terminal's columns and rows.
	maxSize = 10000
	// maxTitle bounds a terminal's title: one a client sets is refused
	// past it, one a program sets is cut.
	maxTitle = 4096
	// maxInput bounds the input waiting for a terminal's program to read
	// it, in bytes and in actions; a single larger action is taken when
	// nothing waits.
	maxInput, maxInputActions = 1 << 20, 1024
)

// reserveTerminal checks a createTerminal's params and reserves its
// channel; start starts the shell there, which may wait for the
// container's start, and must be called: a start that fails gives the
// channel back.
func (s *Server) reserveTerminal(params json.RawMessage) (start func(context.Context) *rpcError, rerr *rpcError) {
	var p createParams
	if err := json.Unmarshal(params, &p); err != nil {
		return nil, invalid("createTerminal: %v", err)
	}
	// The scheme of a channel selects its reducer and state: a terminal
	// under another would be served as what that scheme names.
	// Spelled as given, not as url.Parse folds a scheme: clients tell
	// channels apart by the URI as it is written.
	if u, err := url.Parse(p.Channel); err != nil || !strings.HasPrefix(p.Channel, "ahp-terminal:") || u.Opaque == "" && u.Path == "" || len(p.Channel) > maxURI {
		return nil, invalid("createTerminal: channel %.100q is not a terminal URI (ahp-terminal:/<id>, at most %d bytes)", p.Channel, maxURI)
	}
	if why := p.Claim.check(); why != "" {
		return nil, invalid("createTerminal: %s", why)
	}
	if p.Cols > maxSize || p.Rows > maxSize {
		return nil, invalid("createTerminal: cols and rows must be at most %d", maxSize)
	}
	if len(p.Name) > maxTitle {
		// The name is the terminal's first title, bounded like any.
		return nil, invalid("createTerminal: name longer than %d bytes", maxTitle)
	}
	if len(p.Cwd) > maxURI {
		// Refused here, as what refuses it later may quote it whole.
		return nil, invalid("createTerminal: cwd longer than %d bytes", maxURI)
	}
	dir := s.cfg.Workspace
	if p.Cwd != "" {
		var err error
		if dir, err = pathOf(p.Cwd); err != nil {
			return nil, invalid("createTerminal: %v", err)
		}
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return nil, &rpcError{Code: codeInternal, Message: "createTerminal: the server is closing"}
	}
	if _, ok := s.terms[p.Channel]; ok {
		s.mu.Unlock()
		return nil, &rpcError{Code: codeAlreadyExists, Message: fmt.Sprintf("terminal %.200q already exists", p.Channel)}
	}
	// Reserve the URI while the exec starts; Close waits until it is
	// served or released.
	t := &terminal{uri: p.Channel, s: s, since: s.seq, ready: make(chan struct{}), input: make(chan []byte, maxInputActions), gate: make(chan struct{})}
	s.terms[p.Channel] = t
	s.wg.Add(1)
	s.mu.Unlock()
	return func(ctx context.Context) *rpcError { return s.startTerminal(ctx, t, p, dir) }, nil
}

// createParams are createTerminal's params.
type createParams struct {
	Channel string `json:"channel"`
	Claim   *Claim `json:"claim"`
	Name    string `json:"name"`
	Cwd     string `json:"cwd"`
	Cols    uint   `json:"cols"`
	Rows    uint   `json:"rows"`
}

// startTerminal starts the shell of t, which reserveTerminal reserved for
// p, in dir.
func (s *Server) startTerminal(ctx context.Context, t *terminal, p createParams, dir string) *rpcError {
	defer s.wg.Done()
	fail := func(e *rpcError) *rpcError {
		s.mu.Lock()
		if s.terms[p.Channel] == t {
			delete(s.terms, p.Channel)
		}
		s.mu.Unlock()
		close(t.ready)
		return e
	}
	sess, err := s.cfg.Sessions(ctx, dir)
	if err != nil {
		return fail(sandboxError("createTerminal", err))
	}
	nonce := make([]byte, 16)
	rand.Read(nonce)
	t.nonce = hex.EncodeToString(nonce)
	t.parser = osc633.NewParser(t.nonce)
	cols, rows := termSize(p.Cols, p.Rows)
	// The output goes to the terminal as it arrives, in the goroutine that
	// reads it: every hop between the PTY and the clients adds latency to
	// each keystroke. The exec's own buffer keeps nothing.
	var limit int64
	run, err := sess.Start(ctx, sandbox.Command{
		Command: "/bin/sh", Args: []string{"-c", shellLauncher},
		Env: []sandbox.EnvVar{
			{Name: "SANDBOXD_SHELL_INTEGRATION", Value: ShellIntegration},
			{Name: "TERM", Value: "xterm-256color"},
		},
		Cwd: dir, TTY: true, Cols: cols, Rows: rows, OutputLimit: &limit,
		Stdout: ptyOutput{t},
	})
	if err != nil {
		return fail(sandboxError("createTerminal", err))
	}
	title := p.Name
	if title == "" {
		title = "bash"
	}
	s.mu.Lock()
	if s.terms[p.Channel] != t {
		// The server closed while the exec started. Its output, which
		// waits for ready, is let go first (and dropped): the kill waits
		// for it.
		s.mu.Unlock()
		close(t.ready)
		sess.Release(context.WithoutCancel(ctx), run.ID)
		return &rpcError{Code: codeInternal, Message: "createTerminal: the server is closing"}
	}
	t.session, t.t = sess, run
	t.state = TerminalState{Title: title, Cwd: fileURI(dir), Cols: int(cols), Rows: int(rows), Content: []ContentPart{}, Claim: *p.Claim}
	s.terminalsChangedLocked()
	s.wg.Add(2)
	s.mu.Unlock()
	close(t.ready)
	go func() {
		defer s.wg.Done()
		t.wait()
	}()
	go func() {
		defer s.wg.Done()
		t.writeInput()
	}()
	time.AfterFunc(launchTimeout, func() {
		select {
		case <-t.gate:
		case <-t.t.Done():
		default:
			s.log.Warn("ahp terminal: the shell's launcher did not answer; input goes in unguarded", "terminal", t.uri)
			t.open()
		}
	})
	return nil
}

// writeInput writes queued input to the PTY until the terminal ends,
// once the launcher has had the nonce.
func (t *terminal) writeInput() {
	select {
	case <-t.gate:
	case <-t.t.Done():
		return
	case <-t.s.ctx.Done():
		return
	}
	for {
		select {
		case p := <-t.input:
			t.typing.Lock()
			t.wroteInput = true
			err := t.t.Input(p)
			t.typing.Unlock()
			t.s.mu.Lock()
			t.inputBytes -= len(p)
			t.s.mu.Unlock()
			if err != nil {
				t.s.log.Debug("ahp terminal input lost", "terminal", t.uri, "err", err)
			}
		case <-t.t.Done():
			return
		case <-t.s.ctx.Done():
			return
		}
	}
}

// sandboxError answers a failure of the sandbox: the client's fault when
// the sandbox found the request invalid, else the server's.
func sandboxError(op string, err error) *rpcError {
	code := codeInternal
	if errors.Is(err, sandbox.ErrInvalid) {
		code = codeInvalidParams
	}
	return &rpcError{Code: code, Message: fmt.Sprintf("%s: %v", op, err)}
}

// removeTerminal takes the terminal a disposeTerminal names out of the
// list at once and returns what kills its processes, which may take the
// kill's grace period. The server waits for that kill when it closes.
func (s *Server) removeTerminal(params json.RawMessage) (kill func(context.Context) *rpcError, rerr *rpcError) {
	var p struct {
		Channel string `json:"channel"`
	}
	if err := json.Unmarshal(params, &p); err != nil || p.Channel == "" {
		return nil, invalid("disposeTerminal: channel is required")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.terms[p.Channel]
	if !ok || t.t == nil {
		return nil, &rpcError{Code: codeNotFound, Message: fmt.Sprintf("disposeTerminal: unknown terminal %.200q", p.Channel)}
	}
	if s.closing {
		// Close disposes it, and waits for nothing added now.
		return nil, &rpcError{Code: codeInternal, Message: "disposeTerminal: the server is closing"}
	}
	s.removeLocked(t)
	s.wg.Add(1)
	return func(ctx context.Context) *rpcError {
		defer s.wg.Done()
		// Once the terminal is out of the list its processes must go,
		// even when the client that asked leaves meanwhile.
		if err := t.release(context.WithoutCancel(ctx)); err != nil {
			return &rpcError{Code: codeInternal, Message: err.Error()}
		}
		return nil
	}, nil
}

// dispose kills the terminal's processes and removes it.
func (t *terminal) dispose(ctx context.Context) error {
	s := t.s
	s.mu.Lock()
	if s.terms[t.uri] != t {
		s.mu.Unlock()
		return nil
	}
	s.removeLocked(t)
	s.mu.Unlock()
	return t.release(ctx)
}

// release kills the processes of a terminal taken out of the list.
func (t *terminal) release(ctx context.Context) error {
	t.s.mu.Lock()
	run, sess := t.t, t.session
	t.s.mu.Unlock()
	if run == nil {
		return nil // still starting: createTerminal releases it
	}
	// A terminal of a session closed meanwhile (the agent's, under wrap)
	// is gone with it: disposed all the same.
	if err := sess.Release(ctx, run.ID); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
		return fmt.Errorf("dispose terminal %s: %w", t.uri, err)
	}
	return nil
}

// check returns why the claim is not well formed, or "".
func (c *Claim) check() string {
	switch {
	case c == nil:
		return "claim is required"
	case c.Kind == "client" && c.ClientID == "":
		return "a client claim needs a clientId"
	case c.Kind == "session" && c.Session == "":
		return "a session claim needs a session"
	case c.Kind != "client" && c.Kind != "session":
		return fmt.Sprintf("claim kind %.50q is neither client nor session", c.Kind)
	case len(c.ClientID)+len(c.Session)+len(c.TurnID)+len(c.ToolCallID) > maxURI:
		return fmt.Sprintf("claim longer than %d bytes", maxURI)
	}
	return ""
}

// appendData adds terminal data to the state, keeping at most max bytes of
// content. s.mu must be held.
func (t *terminal) appendData(data string, max int) {
	t.unfolded = append(t.unfolded, data...)
	if len(t.unfolded) >= max {
		t.fold(max)
	}
}

// fold reduces the gathered data into the state. s.mu must be held.
func (t *terminal) fold(max int) {
	if len(t.unfolded) == 0 {
		return
	}
	data := t.unfolded
	if len(data) > max {
		// All older content goes anyway; only the last max bytes matter.
		cut := len(data) - max
		for cut < len(data) && !utf8.RuneStart(data[cut]) {
			cut++
		}
		data = data[cut:]
	}
	reduceTerminal(&t.state, Action{Type: "terminal/data", Data: string(data)})
	TrimContent(&t.state, max)
	t.unfolded = t.unfolded[:0]
}

// apply carries out a client's action on a channel: it takes effect and is
// echoed to every subscriber, or it is echoed to the client alone with the
// reason it was rejected. Either echo is queued under the lock, so that it
// keeps its place among the actions the client receives.
func (s *Server) apply(from *conn, channel string, a Action, raw json.RawMessage, origin *Origin) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if reason := s.applyLocked(from, channel, a, origin); reason != "" {
		s.rejectLocked(from, channel, raw, origin, reason)
	}
}

// applyLocked carries out an action and returns why it was rejected, or ""
// when it took effect. s.mu must be held; resize leaves it meanwhile.
func (s *Server) applyLocked(from *conn, channel string, a Action, origin *Origin) string {
	if channel == RootURI {
		return fmt.Sprintf("%.200s on the root channel is not supported by this server", a.Type)
	}
	t, ok := s.terms[channel]
	if !ok || t.t == nil {
		return fmt.Sprintf("unknown terminal %.200q", channel)
	}
	switch a.Type {
	case "terminal/input":
		if t.t.Exited() {
			return fmt.Sprintf("terminal %.200q has exited", channel)
		}
		data := []byte(a.Data)
		if t.inputBytes == 0 && t.opened {
			// Nothing waits: straight to the PTY, without a hop to the
			// input goroutine, unless the PTY does not take it at once.
			n, err := t.t.TryInput(data)
			if err != nil {
				return err.Error()
			}
			data = data[n:]
		}
		if len(data) > 0 {
			if t.inputBytes > 0 && t.inputBytes+len(data) > maxInput {
				return fmt.Sprintf("terminal %.200q is not reading its input: %d bytes wait", channel, t.inputBytes)
			}
			select {
			case t.input <- data:
				t.inputBytes += len(data)
			default:
				return fmt.Sprintf("terminal %.200q is not reading its input: %d actions wait", channel, len(t.input))
			}
		}
	case "terminal/resized":
		if a.Cols <= 0 || a.Rows <= 0 || a.Cols > maxSize || a.Rows > maxSize {
			return fmt.Sprintf("cols and rows must be between 1 and %d", maxSize)
		}
		// An engine round trip: not under the lock, and not for ever.
		// resizing keeps two clients' resizes in one order for the
		// engine and for the actions: it is let go only once the lock,
		// under which the action is emitted, is held again.
		s.mu.Unlock()
		t.resizing.Lock()
		ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
		err := t.t.Resize(ctx, uint(a.Cols), uint(a.Rows))
		cancel()
		s.mu.Lock()
		t.resizing.Unlock()
		if err != nil {
			return err.Error()
		}
		if s.terms[channel] != t {
			return fmt.Sprintf("terminal %.200q was disposed", channel)
		}
	case "terminal/claimed":
		if why := a.Claim.check(); why != "" {
			return why
		}
		// The holder of a client claim may change it. A session's
		// claim is held by no client; a client may only narrow it within
		// the session (detach a tool call's terminal to the background,
		// as the protocol's flow shows), never tie it to a turn or tool
		// call it was not tied to: that is the agent host's to say.
		cur, want := t.state.Claim, a.Claim
		holder := cur.Kind == "client" && cur.ClientID == origin.ClientID
		narrows := cur.Kind == "session" && want.Kind == "session" && want.Session == cur.Session &&
			(want.TurnID == "" || want.TurnID == cur.TurnID) && (want.ToolCallID == "" || want.ToolCallID == cur.ToolCallID)
		if !holder && !narrows {
			return fmt.Sprintf("only the holder of the claim may change it, and a session's claim may only be narrowed (held by %.200s %.200s%.200s)", cur.Kind, cur.ClientID, cur.Session)
		}
	case "terminal/titleChanged":
		if len(a.Title) > maxTitle {
			return fmt.Sprintf("title longer than %d bytes", maxTitle)
		}
	case "terminal/cleared":
	default:
		return fmt.Sprintf("%.200s cannot be dispatched by a client", a.Type)
	}
	// The echo to the client that sent it leaves from its reader.
	from.hold()
	s.emitLocked(channel, a, origin)
	if a.Type == "terminal/claimed" || a.Type == "terminal/titleChanged" {
		s.listedChangedLocked()
	}
	return ""
}

// ptyOutput turns the exec's output into actions: data with the shell
// integration's sequences stripped, and the command, cwd and title events
// they carried.
type ptyOutput struct{ t *terminal }

func (o ptyOutput) Write(p []byte) (int, error) {
	<-o.t.ready
	o.t.process(p, false)
	return len(p), nil
}

// wait reports the terminal's exit once its output is all processed.
func (t *terminal) wait() {
	s := t.s
	select {
	case <-t.t.Done():
	case <-s.ctx.Done():
		return
	}
	if len(t.carry) > 0 {
		t.process(nil, true)
	}
	// The shell ended during a command (exit, exec, a kill): so did the
	// command, its code unknown; clients would show it running for ever.
	t.finishCommand(nil)
	_, _, st := t.t.Output()
	a := Action{Type: "terminal/exited"}
	if st != nil {
		// A terminal's exitCode is what tells clients it exited: one
		// killed by a signal gets the shell's 128+n, not none.
		code := sandbox.ExitCode(*st)
		a.ExitCode = &code
	}
	t.emitListed(a, true)
}

// finishCommand reports the end of the command that runs, if one does.
func (t *terminal) finishCommand(exitCode *int) {
	if !t.running {
		return
	}
	t.running = false
	d := time.Since(t.started).Milliseconds()
	t.emit(Action{Type: "terminal/commandFinished", CommandID: "cmd-" + strconv.Itoa(t.cmdID), ExitCode: exitCode, DurationMs: &d})
}

// emit emits an action of the terminal's own while it is served: the
// output of one disposed, still read while its processes are killed, must
// not reach a terminal made again under its URI.
func (t *terminal) emit(a Action) {
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.terms[t.uri] == t {
		s.emitLocked(t.uri, a, nil)
	}
}

// emitListed emits an action that changes what the root channel lists of
// the terminal, and the new list with it: at once, or within listInterval.
func (t *terminal) emitListed(a Action, now bool) {
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.terms[t.uri] != t {
		return
	}
	s.emitLocked(t.uri, a, nil)
	if now {
		s.terminalsChangedLocked()
	} else {
		s.listedChangedLocked()
	}
}

// process feeds output to the parser and emits what comes out. Unless the
// output is final, a character cut in half at its end waits for the rest.
func (t *terminal) process(data []byte, final bool) {
	data = append(t.carry, data...)
	t.carry = nil
	if cut := sandbox.IncompleteTail(data); cut > 0 && !final {
		t.carry = append([]byte(nil), data[len(data)-cut:]...)
		data = data[:len(data)-cut]
	}
	out, events := t.parser.Feed(data)
	from := 0
	for _, ev := range events {
		// The data goes out in two parts only around an event that may
		// be an action of its own, and never with a character cut in
		// two: clients would each get half a character (replaced, in
		// JSON), while the state joined the halves.
		if strings.IndexByte("ABE", ev.Kind) < 0 && ev.Offset > from {
			cut := ev.Offset - sandbox.IncompleteTail(out[from:ev.Offset])
			if cut > from {
				t.emit(Action{Type: "terminal/data", Data: string(out[from:cut])})
				from = cut
			}
		}
		t.event(ev)
	}
	if from < len(out) {
		t.emit(Action{Type: "terminal/data", Data: string(out[from:])})
	}
}

// event acts on one event. A, B and E make no action of their own but
// for the first commandDetectionAvailable, which does not mind the data
// around it (process splits the data only at the others).
func (t *terminal) event(ev osc633.Event) {
	if ev.Kind == 'R' {
		t.launch(ev.Value)
		return
	}
	// Announced on the first event only the shell integration can send:
	// a shell without the nonce (no stty) still marks its prompts.
	if strings.IndexByte("CDEP", ev.Kind) >= 0 && !t.detecting {
		t.detecting = true
		t.emit(Action{Type: "terminal/commandDetectionAvailable"})
	}
	switch ev.Kind {
	case 'E':
		t.line = ev.CommandLine
		t.armed = true
	case 'C':
		if !t.armed {
			return
		}
		t.armed = false
		t.cmdID++
		t.started = time.Now()
		t.running = true
		t.emit(Action{Type: "terminal/commandExecuted", CommandID: "cmd-" + strconv.Itoa(t.cmdID), CommandLine: t.line, Timestamp: t.started.UnixMilli()})
		t.line = ""
	case 'D':
		t.finishCommand(ev.ExitCode)
	case 'P':
		if ev.Key == "Cwd" && len(ev.Value) > 0 && ev.Value[0] == '/' {
			uri := fileURI(ev.Value)
			if !t.stateIs(func(st TerminalState) bool { return st.Cwd == uri }) {
				t.emit(Action{Type: "terminal/cwdChanged", Cwd: uri})
			}
		}
	case 'T':
		// Bounded as a client's title is, cut at a character: each one
		// goes to every client with the list of the terminals.
		title := ev.Title
		if len(title) > maxTitle {
			title = title[:maxTitle]
			title = title[:len(title)-sandbox.IncompleteTail([]byte(title))]
		}
		// A program that sets its title in a loop (a progress display)
		// costs each client a list of the terminals per change; the same
		// title again changes nothing.
		if !t.stateIs(func(st TerminalState) bool { return st.Title == title }) {
			t.emitListed(Action{Type: "terminal/titleChanged", Title: title}, false)
		}
	}
}

// stateIs reports whether the terminal is still served and its state
// satisfies is, for events that change nothing when it already does.
func (t *terminal) stateIs(is func(TerminalState) bool) bool {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	return t.s.terms[t.uri] == t && is(t.state)
}

// launch answers the launcher, the first thing to run in the terminal:
// with the nonce when it asks (echo is off then), and lets input flow once
// it has read it (or wants none). Only its first request counts; a
// program that prints one later gets nothing. A launcher that asks only
// after launchTimeout (a container short of CPU) still gets the nonce,
// unless input went in first: it reads that line instead, finds no nonce
// in it and starts the shell without command detection.
func (t *terminal) launch(say string) {
	if t.t == nil || t.launched {
		return // the server closed while the exec started, or launched
	}
	switch {
	case say == "nonce" && !t.asked:
		t.asked = true
		t.typing.Lock()
		defer t.typing.Unlock()
		if t.wroteInput {
			t.s.log.Warn("ahp terminal: the shell's launcher asked for the nonce after input went in; no command detection", "terminal", t.uri)
			return
		}
		if err := t.t.Input([]byte(t.nonce + "\n")); err != nil {
			t.s.log.Debug("ahp terminal: nonce not typed", "terminal", t.uri, "err", err)
		}
	case say == "ready" && t.asked, say == "none":
		t.launched = true
		t.open()
	}
}

// launchTimeout is how long input waits for a launcher that says nothing
// (an image whose sh cannot print), before it goes in all the same.
const launchTimeout = 10 * time.Second

// open lets the input flow.
func (t *terminal) open() {
	t.openOnce.Do(func() {
		t.s.mu.Lock()
		t.opened = true
		t.s.mu.Unlock()
		close(t.gate)
	})
}

// termSize is the size a new terminal gets: what the client asked, the
// usual 80x24 in place of what it did not.
func termSize(cols, rows uint) (uint, uint) {
	if cols == 0 {
		cols = 80
	}
	if rows == 0 {
		rows = 24
	}
	return cols, rows
}
