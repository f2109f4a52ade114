package acp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
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

	// The connection's session registry (sessions.go).
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

// NewTerminals returns the terminal service for one connection. scope must
// be unique per connection; workspace is the default workspace; defaults
// give sessions their image, network and limits where set.
func NewTerminals(m *sandbox.Manager, scope, workspace string, defaults sandbox.SessionSpec) *Terminals {
	return &Terminals{m: m, scope: scope, workspace: workspace, defaults: defaults,
		sessions: make(map[string]*sandbox.SessionSpec), opening: make(map[string]int), ended: make(map[string]bool)}
}

// Manager returns the sandbox manager behind the service.
func (t *Terminals) Manager() *sandbox.Manager { return t.m }

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
		return nil, &jsonrpc2.Error{Code: jsonrpc.MethodNotFound, Message: fmt.Sprintf("method not found: %.100s", method)}
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
		return &jsonrpc2.Error{Code: jsonrpc.RequestCancelled, Message: "request cancelled"}
	case errors.Is(err, sandbox.ErrNotFound):
		return &jsonrpc2.Error{Code: jsonrpc.ResourceNotFound, Message: err.Error()}
	case errors.Is(err, sandbox.ErrInvalid):
		return &jsonrpc2.Error{Code: jsonrpc.InvalidParams, Message: err.Error()}
	case errors.Is(err, sandbox.ErrLimit):
		// ACP's RequestCancelled also covers a request aborted for
		// resource constraints.
		return &jsonrpc2.Error{Code: jsonrpc.RequestCancelled, Message: err.Error()}
	}
	return &jsonrpc2.Error{Code: jsonrpc.InternalError, Message: err.Error()}
}

func invalidParams(format string, args ...any) *jsonrpc2.Error {
	return &jsonrpc2.Error{Code: jsonrpc.InvalidParams, Message: "invalid params: " + fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) *jsonrpc2.Error {
	return &jsonrpc2.Error{Code: jsonrpc.ResourceNotFound, Message: fmt.Sprintf(format, args...)}
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
