package acp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"sync"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/sandboxd/sandboxd/limits"
	"github.com/sandboxd/sandboxd/sandbox"
)

// Method names this package answers.
const (
	MethodCreate       = "terminal/create"
	MethodOutput       = "terminal/output"
	MethodWaitForExit  = "terminal/wait_for_exit"
	MethodKill         = "terminal/kill"
	MethodRelease      = "terminal/release"
	MethodSessionOpen  = "_sandboxd/session/open"
	MethodSessionClose = "_sandboxd/session/close"
	MethodCancel       = "$/cancel_request"
)

// JSON-RPC and ACP error codes.
const (
	CodeParseError      = -32700
	CodeInvalidRequest  = -32600
	CodeMethodNotFound  = -32601
	CodeInvalidParams   = -32602
	CodeInternal        = -32603
	CodeResourceMissing = -32002
	CodeCancelled       = -32800
)

// IsTerminalMethod reports whether method is one of the five ACP terminal
// methods.
func IsTerminalMethod(method string) bool {
	switch method {
	case MethodCreate, MethodOutput, MethodWaitForExit, MethodKill, MethodRelease:
		return true
	}
	return false
}

// Terminals answers the ACP terminal methods for one peer connection. Each
// connection has its own namespace of sessions: a peer can neither see nor
// touch another connection's sessions and terminals, even if it guesses
// their ids.
type Terminals struct {
	m *sandbox.Manager
	// scope prefixes session keys in the manager.
	scope string
	// workspace is used when a session opens without a cwd, and bounds
	// the workspaces a peer may name.
	workspace string
	// defaults are the image, network and limits of sessions opened on
	// first use (a wrap's flags); zero fields keep the configuration's.
	defaults sandbox.SessionSpec

	mu sync.Mutex
	// sessions are the connection's sessions, each with the spec to open
	// it with again once the manager closed it for being idle (nil: as
	// a new one, from the request that comes).
	sessions map[string]*sandbox.SessionSpec
	// opening counts the requests opening each session: an open that
	// failed forgets the session only when no other is under way.
	opening map[string]int
	// closed says the connection ended: a request still under way opens
	// no session any more, which nothing would close.
	closed bool
	// ended are sessions the editor closed (a proxy's, in endedOrder):
	// a command naming one opens no container again, which nothing would
	// remove before the wrap ends, until the editor loads or resumes it.
	ended      map[string]bool
	endedOrder []string
	// shared says the AHP channel's own session (SessionFor) is open.
	shared bool
}

// maxEnded bounds how many closed sessions a connection remembers.
const maxEnded = 1024

// errClosed answers a request that comes through as the connection ends:
// RequestCancelled, which ACP gives to a request aborted by shutdown.
var errClosed = &jsonrpc2.Error{Code: CodeCancelled, Message: "the connection is closing"}

// NewTerminals returns the terminal service for one connection. scope must
// be unique per connection; workspace is the default workspace; defaults
// give sessions their image, network and limits where set.
func NewTerminals(m *sandbox.Manager, scope, workspace string, defaults sandbox.SessionSpec) *Terminals {
	return &Terminals{m: m, scope: scope, workspace: workspace, defaults: defaults,
		sessions: make(map[string]*sandbox.SessionSpec), opening: make(map[string]int), ended: make(map[string]bool)}
}

// Manager returns the sandbox manager behind the service.
func (t *Terminals) Manager() *sandbox.Manager { return t.m }

func (t *Terminals) key(sessionID string) string { return t.scope + "\x00" + sessionID }

// sharedKey is the manager's key of the AHP channel's own session: no
// peer's session id maps to it, so no peer can run commands in it or close
// it.
func (t *Terminals) sharedKey() string { return t.scope + "\x01ahp" }

// Handle answers one request. The error, if any, is a *jsonrpc2.Error.
func (t *Terminals) Handle(ctx context.Context, method string, params json.RawMessage) (any, error) {
	var (
		res any
		err error
	)
	switch method {
	case MethodCreate:
		res, err = t.create(ctx, params)
	case MethodOutput:
		res, err = t.output(ctx, params)
	case MethodWaitForExit:
		res, err = t.waitForExit(ctx, params)
	case MethodKill:
		res, err = t.kill(ctx, params)
	case MethodRelease:
		res, err = t.release(ctx, params)
	case MethodSessionOpen:
		res, err = t.openSession(ctx, params)
	case MethodSessionClose:
		res, err = t.closeSession(ctx, params)
	default:
		return nil, &jsonrpc2.Error{Code: CodeMethodNotFound, Message: fmt.Sprintf("method not found: %.100s", method)}
	}
	if err != nil {
		return nil, rpcError(ctx, err)
	}
	return res, nil
}

// rpcError maps errors to JSON-RPC errors; params errors are already one.
func rpcError(ctx context.Context, err error) *jsonrpc2.Error {
	var re *jsonrpc2.Error
	switch {
	case errors.As(err, &re):
		return re
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return &jsonrpc2.Error{Code: CodeCancelled, Message: "request cancelled"}
	case errors.Is(err, sandbox.ErrNotFound):
		return &jsonrpc2.Error{Code: CodeResourceMissing, Message: err.Error()}
	case errors.Is(err, sandbox.ErrInvalid):
		return &jsonrpc2.Error{Code: CodeInvalidParams, Message: err.Error()}
	case errors.Is(err, sandbox.ErrLimit):
		// ACP's RequestCancelled also covers a request aborted for
		// resource constraints.
		return &jsonrpc2.Error{Code: CodeCancelled, Message: err.Error()}
	}
	return &jsonrpc2.Error{Code: CodeInternal, Message: err.Error()}
}

func invalidParams(format string, args ...any) *jsonrpc2.Error {
	return &jsonrpc2.Error{Code: CodeInvalidParams, Message: "invalid params: " + fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) *jsonrpc2.Error {
	return &jsonrpc2.Error{Code: CodeResourceMissing, Message: fmt.Sprintf(format, args...)}
}

// session returns the connection's session with the given id.
func (t *Terminals) session(ctx context.Context, id string) (*sandbox.Session, error) {
	t.mu.Lock()
	_, ok := t.sessions[id]
	t.mu.Unlock()
	if !ok {
		return nil, notFound("unknown session %.200q", id)
	}
	s, err := t.m.Get(ctx, t.key(id))
	if errors.Is(err, sandbox.ErrNotFound) {
		return nil, notFound("unknown session %.200q (closed)", id)
	}
	return s, err
}

// terminal decodes sessionId and terminalId and finds the terminal.
func (t *Terminals) terminal(ctx context.Context, params json.RawMessage) (*sandbox.Session, *sandbox.Terminal, error) {
	f, err := decodeFields(params, "")
	if err != nil {
		return nil, nil, err
	}
	var sid, tid string
	if err := get(f, "sessionId", true, &sid); err != nil {
		return nil, nil, err
	}
	if err := get(f, "terminalId", true, &tid); err != nil {
		return nil, nil, err
	}
	s, err := t.session(ctx, sid)
	if err != nil {
		return nil, nil, err
	}
	term, err := s.Terminal(tid)
	if err != nil {
		return nil, nil, notFound("unknown terminal %.200q in session %.200q", tid, sid)
	}
	return s, term, nil
}

func (t *Terminals) create(ctx context.Context, params json.RawMessage) (any, error) {
	f, err := decodeFields(params, "")
	if err != nil {
		return nil, err
	}
	var (
		sid string
		cmd sandbox.Command
		cwd string
	)
	if err := get(f, "sessionId", true, &sid); err != nil {
		return nil, err
	}
	if err := get(f, "command", true, &cmd.Command); err != nil {
		return nil, err
	}
	// args, env and cwd are read as the schema says the reference SDK
	// reads them (x-deserialize-default-on-error, and for the arrays
	// x-deserialize-skip-invalid-items): a value of the wrong type counts
	// as absent, an item of the wrong shape is left out. What is there is
	// still checked, by the sandbox.
	// Checked here as well, so that a message names an item by its
	// place in what the peer sent, not among those kept.
	if cmd.Args, err = items(f, "args", sandbox.CheckString); err != nil {
		return nil, err
	}
	type envVariable struct {
		Name  *string `json:"name"`
		Value *string `json:"value"`
	}
	_, err = items(f, "env", func(field string, e envVariable) error {
		if e.Name == nil || e.Value == nil {
			return nil // no item, as the schema reads it
		}
		v := sandbox.EnvVar{Name: *e.Name, Value: *e.Value}
		cmd.Env = append(cmd.Env, v)
		return sandbox.CheckEnvVar(field, v)
	})
	if err != nil {
		return nil, err
	}
	if err := lenient(f, "cwd", &cwd); err != nil {
		return nil, err
	}
	cmd.Cwd = cwd
	// The schema has a value that does not decode as a uint64 taken as
	// absent (x-deserialize-default-on-error); one above what sandboxd
	// keeps for a terminal is held to that, and truncated reports it.
	var limit uint64
	if f.present("outputByteLimit") && get(f, "outputByteLimit", false, &limit) == nil {
		n := int64(min(limit, uint64(t.m.Config().Terminal.MaxOutputByteLimit)))
		cmd.OutputLimit = &n
	}

	s, err := t.sessionForCreate(ctx, sid, cwd)
	if err != nil {
		return nil, err
	}
	term, err := s.Start(ctx, cmd)
	if errors.Is(err, sandbox.ErrNotFound) {
		// Closed between the two, for being idle or by a close of the
		// peer's: it opens again, as for a create that came after, and
		// one the editor ended stays ended (sessionForCreate tells).
		if s, err = t.sessionForCreate(ctx, sid, cwd); err == nil {
			term, err = s.Start(ctx, cmd)
		}
	}
	if err != nil {
		return nil, err
	}
	return CreateTerminalResponse{TerminalID: term.ID}, nil
}

// sessionForCreate returns the named session, opening it with the
// configured defaults when the connection has none by that id. It mounts
// the connection's workspace, never the directory the peer names; a
// command that names no cwd runs in the workspace, whichever create
// happened to open the session (and open it again after an idle close).
func (t *Terminals) sessionForCreate(ctx context.Context, sid, cwd string) (*sandbox.Session, error) {
	t.mu.Lock()
	again, ok := t.sessions[sid]
	ended := t.ended[sid]
	t.mu.Unlock()
	if ended && !ok {
		return nil, notFound("session %.200q was closed", sid)
	}
	if ok {
		s, err := t.m.Get(ctx, t.key(sid))
		if !errors.Is(err, sandbox.ErrNotFound) {
			return s, err
		}
		// Closed for being idle, or its start failed: it opens again,
		// the way it was opened.
		if again != nil {
			return t.open(ctx, sid, *again, again, false)
		}
	}
	if cwd != "" {
		if err := t.checkWorkspace("cwd", cwd); err != nil {
			return nil, err
		}
	}
	spec := t.defaults
	spec.ID, spec.Workspace, spec.Dir, spec.ExtraDirs = sid, t.workspace, "", nil
	return t.open(ctx, sid, spec, nil, false)
}

// checkWorkspace keeps a peer from mounting any host directory it names:
// a session's workspace must lie within the connection's workspace.
func (t *Terminals) checkWorkspace(field, dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("%w: %s: %.200q is not an absolute path", sandbox.ErrInvalid, field, dir)
	}
	if !sandbox.Within(t.workspace, filepath.Clean(dir)) {
		return fmt.Errorf("%w: %s: %.200q is outside the workspace %s that sandboxd serves", sandbox.ErrInvalid, field, dir, t.workspace)
	}
	return nil
}

// open opens session sid with spec; again is what it opens with again
// once the manager closed it (nil: as a new one). An explicit open fails
// when the session is open already.
func (t *Terminals) open(ctx context.Context, sid string, spec sandbox.SessionSpec, again *sandbox.SessionSpec, explicit bool) (*sandbox.Session, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, errClosed
	}
	t.sessions[sid] = again
	t.opening[sid]++
	t.mu.Unlock()
	var (
		s   *sandbox.Session
		err error
	)
	if explicit {
		s, err = t.m.Open(ctx, t.key(sid), spec)
	} else {
		s, err = t.m.OpenOrGet(ctx, t.key(sid), spec)
	}
	t.mu.Lock()
	if t.opening[sid]--; t.opening[sid] == 0 {
		delete(t.opening, sid)
	}
	t.mu.Unlock()
	if err != nil {
		// A session that fails to open again keeps what it opens with
		// for the next try; a new one is forgotten, unless another
		// request is opening it or opened it meanwhile. (A request asked
		// off learns of one still starting only that it was asked off.)
		if again == nil || explicit {
			_, gerr := t.m.Get(ctx, t.key(sid))
			t.mu.Lock()
			if errors.Is(gerr, sandbox.ErrNotFound) || gerr != nil && ctx.Err() == nil {
				if t.opening[sid] == 0 {
					delete(t.sessions, sid)
				}
			}
			t.mu.Unlock()
		}
		return nil, err
	}
	// A close of the same id that ran between the registration above and
	// the manager's reservation found nothing to close and has answered:
	// the session just opened belongs to no one, so it goes now.
	t.mu.Lock()
	_, kept := t.sessions[sid]
	t.mu.Unlock()
	if !kept {
		if err := s.Close(context.WithoutCancel(ctx)); err != nil {
			return nil, fmt.Errorf("close session %s, closed while it opened: %w", sid, err)
		}
		return nil, notFound("session %q was closed while this request opened it", sid)
	}
	return s, nil
}

// Prepare starts opening a session for a proxy, which knows the session's
// workspace from the editor, in the background, so that its container is
// ready by the time the first command comes. The session is known to the
// connection at once: a command that comes first waits for the container.
func (t *Terminals) Prepare(spec sandbox.SessionSpec) {
	t.mu.Lock()
	closed := t.closed
	if !closed {
		t.sessions[spec.ID] = &spec
		delete(t.ended, spec.ID)
	}
	t.mu.Unlock()
	if closed {
		return
	}
	t.m.OpenAsync(t.key(spec.ID), spec)
}

// SessionFor returns the connection's open session whose workspace holds
// dir, so that a shared terminal runs where the agent works; with none, a
// session of its own ("ahp", which no peer can name) in the served
// workspace.
func (t *Terminals) SessionFor(ctx context.Context, dir string) (*sandbox.Session, error) {
	t.mu.Lock()
	ids := make([]string, 0, len(t.sessions))
	for id := range t.sessions {
		ids = append(ids, id)
	}
	t.mu.Unlock()
	slices.Sort(ids)
	for _, id := range ids {
		if s, err := t.m.Get(ctx, t.key(id)); err == nil && sandbox.Within(s.Workspace(), dir) {
			return s, nil
		}
	}
	if err := t.checkWorkspace("cwd", dir); err != nil {
		return nil, err
	}
	spec := t.defaults
	spec.ID, spec.Workspace, spec.Dir, spec.ExtraDirs = "ahp", t.workspace, "", nil
	t.mu.Lock()
	closed := t.closed
	t.shared = !closed
	t.mu.Unlock()
	if closed {
		return nil, errClosed
	}
	s, err := t.m.OpenOrGet(ctx, t.sharedKey(), spec)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	closed = t.closed
	t.mu.Unlock()
	if closed {
		// Close ran meanwhile and may have found nothing to close yet.
		if s := t.m.Detach(t.sharedKey()); s != nil {
			s.Close(context.WithoutCancel(ctx))
		}
		return nil, errClosed
	}
	return s, nil
}

// Session returns the connection's open session with the given id.
func (t *Terminals) Session(ctx context.Context, id string) (*sandbox.Session, error) {
	return t.session(ctx, id)
}

// output finds the terminal; its output is read into the answer only
// once the connection's limiter lets the answer be built (outputAnswer).
func (t *Terminals) output(ctx context.Context, params json.RawMessage) (any, error) {
	_, term, err := t.terminal(ctx, params)
	if err != nil {
		return nil, err
	}
	return outputAnswer{term}, nil
}

// outputAnswer is a terminal/output answer still to be built: the finding
// of its terminal (which may wait for its session to start) takes none of
// the few answers of its size a connection may build at once.
type outputAnswer struct{ term *sandbox.Terminal }

func (a outputAnswer) build() any {
	out, truncated, st := a.term.Output()
	res := TerminalOutputResponse{Output: string(out), Truncated: truncated}
	if st != nil {
		es := exitStatus(*st)
		res.ExitStatus = &es
	}
	return res
}

func (t *Terminals) waitForExit(ctx context.Context, params json.RawMessage) (any, error) {
	_, term, err := t.terminal(ctx, params)
	if err != nil {
		return nil, err
	}
	st, err := term.Wait(ctx)
	if err != nil {
		return nil, err
	}
	return exitStatus(st), nil
}

func (t *Terminals) kill(ctx context.Context, params json.RawMessage) (any, error) {
	_, term, err := t.terminal(ctx, params)
	if err != nil {
		return nil, err
	}
	if err := term.Kill(ctx); err != nil {
		return nil, err
	}
	return struct{}{}, nil
}

func (t *Terminals) release(ctx context.Context, params json.RawMessage) (any, error) {
	s, term, err := t.terminal(ctx, params)
	if err != nil {
		return nil, err
	}
	if err := s.Release(ctx, term.ID); err != nil {
		if errors.Is(err, sandbox.ErrNotFound) {
			return nil, notFound("unknown terminal %q in session %q", term.ID, s.ID)
		}
		return nil, err
	}
	return struct{}{}, nil
}

func (t *Terminals) openSession(ctx context.Context, params json.RawMessage) (any, error) {
	f, err := decodeFields(params, "")
	if err != nil {
		return nil, err
	}
	spec := sandbox.SessionSpec{}
	if err := get(f, "sessionId", true, &spec.ID); err != nil {
		return nil, err
	}
	if err := get(f, "cwd", true, &spec.Dir); err != nil {
		return nil, err
	}
	if err := get(f, "image", false, &spec.Image); err != nil {
		return nil, err
	}
	if c := t.m.Config().Session; spec.Image != "" && spec.Image != c.Image && !slices.Contains(c.Images, spec.Image) {
		return nil, invalidParams("image: %.200q is neither session.image nor one of session.images", spec.Image)
	}
	if err := get(f, "network", false, &spec.Network); err != nil {
		return nil, err
	}
	if err := get(f, "additionalDirectories", false, &spec.ExtraDirs); err != nil {
		return nil, err
	}
	for _, name := range []string{"cpus", "memory", "pids"} {
		v, ok, err := scalarText(f, name)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if err := spec.Limits.Set(name, v); err != nil {
			return nil, invalidParams("%s: %v", name, err)
		}
	}
	if err := t.checkWorkspace("cwd", spec.Dir); err != nil {
		return nil, err
	}
	for i, d := range spec.ExtraDirs {
		if err := t.checkWorkspace(fmt.Sprintf("additionalDirectories[%d]", i), d); err != nil {
			return nil, err
		}
	}
	// The connection's workspace holds them all, and is what is mounted:
	// a directory the peer names is never a mount source.
	spec.Workspace, spec.ExtraDirs = t.workspace, nil
	t.mu.Lock()
	_, exists := t.sessions[spec.ID]
	t.mu.Unlock()
	if exists {
		if _, err := t.m.Get(ctx, t.key(spec.ID)); !errors.Is(err, sandbox.ErrNotFound) {
			return nil, invalidParams("sessionId: session %q is already open", spec.ID)
		}
	}
	s, err := t.open(ctx, spec.ID, spec, &spec, true)
	if err != nil {
		return nil, err
	}
	l := s.Limits()
	return SessionOpenResponse{
		SessionID: s.ID,
		Container: s.ContainerID(),
		Workspace: s.Workspace(),
		Cwd:       s.Dir(),
		User:      s.User(),
		CPUs:      strconv.FormatFloat(l.CPUs, 'f', -1, 64),
		Memory:    limits.FormatBytes(l.Memory),
		Pids:      l.Pids,
	}, nil
}

func (t *Terminals) closeSession(ctx context.Context, params json.RawMessage) (any, error) {
	f, err := decodeFields(params, "")
	if err != nil {
		return nil, err
	}
	var sid string
	if err := get(f, "sessionId", true, &sid); err != nil {
		return nil, err
	}
	if err := t.CloseSession(ctx, sid); err != nil {
		return nil, err
	}
	return struct{}{}, nil
}

// CloseSession removes one of the connection's sessions and its container.
func (t *Terminals) CloseSession(ctx context.Context, sid string) error {
	remove := t.Detach(sid)
	if remove == nil {
		return notFound("unknown session %.200q", sid)
	}
	return remove(ctx)
}

// Detach takes session sid from the connection at once and returns what
// removes its container, for the caller to run when it suits; nil when the
// connection has no such session. A session opened under the id in
// between is another one, which remove leaves alone.
func (t *Terminals) Detach(sid string) (remove func(context.Context) error) {
	t.mu.Lock()
	_, ok := t.sessions[sid]
	delete(t.sessions, sid)
	t.mu.Unlock()
	if !ok {
		return nil
	}
	s := t.m.Detach(t.key(sid))
	return func(ctx context.Context) error {
		if s == nil {
			return nil
		}
		return s.Close(ctx)
	}
}

// End detaches session sid, which the editor closed, like Detach, and
// keeps a command that names it later from opening it again.
func (t *Terminals) End(sid string) (remove func(context.Context) error) {
	t.mu.Lock()
	if !t.ended[sid] {
		t.ended[sid] = true
		t.endedOrder = append(t.endedOrder, sid)
		if len(t.endedOrder) > maxEnded {
			delete(t.ended, t.endedOrder[0])
			t.endedOrder = t.endedOrder[1:]
		}
	}
	t.mu.Unlock()
	return t.Detach(sid)
}

// implicitSpec returns the spec of session sid when a command opened it
// before the editor named its directories: the connection's workspace.
func (t *Terminals) implicitSpec(sid string) (sandbox.SessionSpec, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	again, ok := t.sessions[sid]
	switch {
	case !ok:
		return sandbox.SessionSpec{}, false
	case again != nil:
		return *again, true
	}
	return sandbox.SessionSpec{Workspace: t.workspace}, true
}

// Close removes every session of the connection. It runs when the
// connection ends.
func (t *Terminals) Close(ctx context.Context) error {
	t.mu.Lock()
	t.closed = true
	ids := make([]string, 0, len(t.sessions))
	for id := range t.sessions {
		ids = append(ids, id)
	}
	shared := t.shared
	t.mu.Unlock()
	// Taken out at once, removed together: each removal waits for its
	// commands' kill and the engine.
	removes := make([]func(context.Context) error, 0, len(ids)+1)
	for _, id := range ids {
		if remove := t.Detach(id); remove != nil {
			removes = append(removes, remove)
		}
	}
	if shared {
		if s := t.m.Detach(t.sharedKey()); s != nil {
			removes = append(removes, s.Close)
		}
	}
	errs := make([]error, len(removes))
	var wg sync.WaitGroup
	for i, remove := range removes {
		wg.Go(func() { errs[i] = remove(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}
