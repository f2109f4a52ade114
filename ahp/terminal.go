package ahp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/ahp/osc633"
	"github.com/sandboxd/sandboxd/internal/jsonrpc"
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
		return nil, &rpcError{Code: jsonrpc.InternalError, Message: "createTerminal: the server is closing"}
	}
	if _, ok := s.terms[p.Channel]; ok {
		s.mu.Unlock()
		return nil, &rpcError{Code: jsonrpc.AlreadyExists, Message: fmt.Sprintf("terminal %.200q already exists", p.Channel)}
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
		return &rpcError{Code: jsonrpc.InternalError, Message: "createTerminal: the server is closing"}
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

// sandboxError answers a failure of the sandbox: the client's fault when
// the sandbox found the request invalid, else the server's.
func sandboxError(op string, err error) *rpcError {
	code := jsonrpc.InternalError
	if errors.Is(err, sandbox.ErrInvalid) {
		code = jsonrpc.InvalidParams
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
		return nil, &rpcError{Code: jsonrpc.NotFound, Message: fmt.Sprintf("disposeTerminal: unknown terminal %.200q", p.Channel)}
	}
	if s.closing {
		// Close disposes it, and waits for nothing added now.
		return nil, &rpcError{Code: jsonrpc.InternalError, Message: "disposeTerminal: the server is closing"}
	}
	s.removeLocked(t)
	s.wg.Add(1)
	return func(ctx context.Context) *rpcError {
		defer s.wg.Done()
		// Once the terminal is out of the list its processes must go,
		// even when the client that asked leaves meanwhile.
		if err := t.release(context.WithoutCancel(ctx)); err != nil {
			return &rpcError{Code: jsonrpc.InternalError, Message: err.Error()}
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
