package acp

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
	"github.com/sandboxd/sandboxd/sandbox"
)

// maxEnded bounds how many closed sessions a connection remembers.
const maxEnded = 1024

// errClosed answers a request that comes through as the connection ends:
// RequestCancelled, which ACP gives to a request aborted by shutdown.
var errClosed = &jsonrpc2.Error{Code: jsonrpc.RequestCancelled, Message: "the connection is closing"}

func (t *Terminals) key(sessionID string) string { return t.scope + "\x00" + sessionID }

// sharedKey is the manager's key of the AHP channel's own session: no
// peer's session id maps to it, so no peer can run commands in it or close
// it.
func (t *Terminals) sharedKey() string { return t.scope + "\x01ahp" }

// Session returns the connection's open session with the given id.
func (t *Terminals) Session(ctx context.Context, id string) (*sandbox.Session, error) {
	return t.session(ctx, id)
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
