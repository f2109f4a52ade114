package acp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/sandboxd/sandboxd/internal/audit"
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
	scope *sandbox.Scope
	// audit, when set, records every command's start and end (wrap's
	// --audit: SetAudit); auditing counts the ends still to record.
	audit    *audit.Log
	auditing sync.WaitGroup
}

// NewTerminals returns the terminal service for the connection whose
// sessions scope holds.
func NewTerminals(scope *sandbox.Scope) *Terminals {
	return &Terminals{scope: scope}
}

// Scope returns the connection's sessions.
func (t *Terminals) Scope() *sandbox.Scope { return t.scope }

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
	case errors.Is(err, sandbox.ErrClosing):
		// RequestCancelled, which ACP gives to a request aborted by
		// shutdown.
		return &jsonrpc2.Error{Code: jsonrpc.RequestCancelled, Message: err.Error()}
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
	s, err := t.scope.Session(ctx, sid)
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
	f, err := decodeParams(ctx, params)
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
	env, err := items(f, "env", func(field string, e envVariable) error {
		if e.Name == nil || e.Value == nil {
			return nil // no item, as the schema reads it
		}
		return sandbox.CheckEnvVar(field, sandbox.EnvVar{Name: *e.Name, Value: *e.Value})
	})
	if err != nil {
		return nil, err
	}
	for _, e := range env {
		if e.Name != nil && e.Value != nil {
			cmd.Env = append(cmd.Env, sandbox.EnvVar{Name: *e.Name, Value: *e.Value})
		}
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
		n := int64(min(limit, uint64(t.scope.Config().Terminal.MaxOutputByteLimit)))
		cmd.OutputLimit = &n
	}
	// A command that cannot run opens no session.
	if err := cmd.Check(); err != nil {
		return nil, err
	}

	s, err := t.scope.SessionForCommand(ctx, sid, cwd)
	if err != nil {
		return nil, err
	}
	term, err := s.Start(ctx, cmd)
	if errors.Is(err, sandbox.ErrNotFound) {
		// Closed between the two, for being idle or by a close of the
		// peer's: it opens again, as for a create that came after, and
		// one the editor ended stays ended (sessionForCreate tells).
		if s, err = t.scope.SessionForCommand(ctx, sid, cwd); err == nil {
			term, err = s.Start(ctx, cmd)
		}
	}
	if err != nil {
		return nil, err
	}
	t.auditCommand(sid, s, term)
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
	res := outputReply{out: out, truncated: truncated}
	if st != nil {
		es := exitStatus(*st)
		res.status = &es
	}
	return res
}

// outputReply is a terminal/output result, encoded as
// TerminalOutputResponse is, but into the connection as it is written
// (streamedJSON): once encoded, a terminal's output can be six times its
// size.
type outputReply struct {
	out       []byte
	truncated bool
	status    *ExitStatus
}

func (r outputReply) writeJSON(w *bufio.Writer) error {
	w.WriteString(`{"output":`)
	if err := writeJSONString(w, r.out); err != nil {
		return err
	}
	w.WriteString(`,"truncated":` + strconv.FormatBool(r.truncated))
	if r.status != nil {
		b, err := marshal(r.status)
		if err != nil {
			return err
		}
		w.WriteString(`,"exitStatus":`)
		w.Write(b)
	}
	return w.WriteByte('}')
}

// MarshalJSON encodes r whole, for a writer that takes answers whole.
func (r outputReply) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	w := bufio.NewWriter(&b)
	if err := r.writeJSON(w); err != nil {
		return nil, err
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
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
	f, err := decodeParams(ctx, params)
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
	if c := t.scope.Config().Session; spec.Image != "" && spec.Image != c.Image && !slices.Contains(c.Images, spec.Image) {
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
	s, err := t.scope.Open(ctx, spec)
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
	if err := t.scope.CloseSession(ctx, sid); err != nil {
		return nil, err
	}
	return struct{}{}, nil
}
