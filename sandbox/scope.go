package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
)

// Scope is the namespace of sessions that one peer connection sees. A
// peer can neither see nor touch another scope's sessions and terminals,
// even if it guesses their ids. A session opens implicitly, on the first
// command that names it, or explicitly with Open; its container is the
// Manager's. Scope is safe for concurrent use.
type Scope struct {
	m *Manager
	// name prefixes session keys in the manager.
	name string
	// workspace is mounted for every session of the scope, and bounds
	// the directories a peer may name.
	workspace string
	// defaults are the image, network and limits of sessions opened on
	// first use; zero fields keep the configuration's.
	defaults SessionSpec

	mu sync.Mutex
	// sessions are the scope's sessions, each with the spec to open it
	// with again once the manager closed it for being idle (nil: as a
	// new one, from the request that comes).
	sessions map[string]*SessionSpec
	// opening counts the requests opening each session: an open that
	// failed forgets the session only when no other is under way.
	opening map[string]int
	// closed says the connection ended: a request still under way opens
	// no session any more, which nothing would close.
	closed bool
	// ended are sessions the editor closed, oldest first in endedOrder:
	// a command naming one opens no container again, which nothing would
	// remove before the connection ends, until the editor loads or
	// resumes it.
	ended      map[string]bool
	endedOrder []string
	// shared says the scope's own session for shared terminals
	// (SessionFor) is open.
	shared bool
	// pinned, once set, is the one session every id of the scope maps
	// to (Pin).
	pinned string
}

// maxEnded bounds how many closed sessions a scope remembers.
const maxEnded = 1024

// NewScope returns a namespace of sessions for one connection. name must
// be unique among the manager's scopes; workspace is what every session of
// the scope mounts; defaults give implicitly opened sessions their image,
// network and limits where set.
func (m *Manager) NewScope(name, workspace string, defaults SessionSpec) *Scope {
	return &Scope{m: m, name: name, workspace: workspace, defaults: defaults,
		sessions: make(map[string]*SessionSpec), opening: make(map[string]int), ended: make(map[string]bool)}
}

// notFoundError is ErrNotFound with a message of its own.
type notFoundError string

func (e notFoundError) Error() string        { return string(e) }
func (e notFoundError) Is(target error) bool { return target == ErrNotFound }

// invalidError is ErrInvalid with a message of its own.
type invalidError string

func (e invalidError) Error() string        { return string(e) }
func (e invalidError) Is(target error) bool { return target == ErrInvalid }

// ErrClosing is returned for a request that comes as its scope closes.
var ErrClosing = errors.New("the connection is closing")

func (sc *Scope) key(id string) string { return sc.name + "\x00" + id }

// sharedKey is the manager's key of the scope's session for shared
// terminals: no peer's session id maps to it, so no peer can run commands
// in it or close it.
func (sc *Scope) sharedKey() string { return sc.name + "\x01ahp" }

// Workspace returns the directory every session of the scope mounts.
func (sc *Scope) Workspace() string { return sc.workspace }

// Defaults returns the spec implicitly opened sessions start from.
func (sc *Scope) Defaults() SessionSpec { return sc.defaults }

// Config returns the configuration the scope's manager runs with.
func (sc *Scope) Config() Config { return sc.m.Config() }

// KeepSpare keeps a container started ahead for the next session of the
// scope, when its defaults set no limits of their own (a spare with other
// limits than the configured ones would never fit) and it has no pinned
// session, which is the only one it opens.
func (sc *Scope) KeepSpare() {
	if d := sc.defaults; d.Limits == (SessionSpec{}).Limits && sc.pinnedID() == "" {
		sc.m.KeepSpare(SessionSpec{ID: "spare", Workspace: sc.workspace, Image: d.Image, Network: d.Network})
	}
}

// Session returns the scope's open session with the given id: ErrNotFound
// when the scope has none by that id, or the manager closed it.
func (sc *Scope) Session(ctx context.Context, id string) (*Session, error) {
	if p := sc.pinnedID(); p != "" {
		id = p
	}
	sc.mu.Lock()
	_, ok := sc.sessions[id]
	sc.mu.Unlock()
	if !ok {
		return nil, notFoundError(fmt.Sprintf("unknown session %.200q", id))
	}
	s, err := sc.m.Get(ctx, sc.key(id))
	if errors.Is(err, ErrNotFound) {
		return nil, notFoundError(fmt.Sprintf("unknown session %.200q (closed)", id))
	}
	return s, err
}

// SessionForCommand returns the session a command names, opening it with
// the scope's defaults when the scope has none by that id, or opening it
// again as it was opened when the manager closed it. It mounts the scope's
// workspace, never the directory the peer names; cwd, if set, must lie in
// the workspace. A session the editor ended (End) stays ended.
func (sc *Scope) SessionForCommand(ctx context.Context, id, cwd string) (*Session, error) {
	if p := sc.pinnedID(); p != "" {
		// Never opened again: the agent ran in it.
		return sc.Session(ctx, p)
	}
	sc.mu.Lock()
	again, ok := sc.sessions[id]
	ended := sc.ended[id]
	sc.mu.Unlock()
	if ended && !ok {
		return nil, notFoundError(fmt.Sprintf("session %.200q was closed", id))
	}
	if ok {
		s, err := sc.m.Get(ctx, sc.key(id))
		if !errors.Is(err, ErrNotFound) {
			return s, err
		}
		// Closed for being idle, or its start failed: it opens again,
		// the way it was opened.
		if again != nil {
			return sc.open(ctx, id, *again, again, false)
		}
	}
	if cwd != "" {
		if err := sc.CheckDir("cwd", cwd); err != nil {
			return nil, err
		}
	}
	spec := sc.defaults
	spec.ID, spec.Workspace, spec.Dir, spec.ExtraDirs = id, sc.workspace, "", nil
	return sc.open(ctx, id, spec, nil, false)
}

// CheckDir returns an ErrInvalid error naming field when dir is not an
// absolute path within the scope's workspace: a peer may not mount any
// host directory it names.
func (sc *Scope) CheckDir(field, dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("%w: %s: %.200q is not an absolute path", ErrInvalid, field, dir)
	}
	if !Within(sc.workspace, filepath.Clean(dir)) {
		return fmt.Errorf("%w: %s: %.200q is outside the workspace %s that sandboxd serves", ErrInvalid, field, dir, sc.workspace)
	}
	return nil
}

// Open opens a session explicitly with spec, whose Dir and ExtraDirs must
// lie in the scope's workspace; the session mounts the workspace. It fails
// when a session by that id is open already. A session the manager closes
// for being idle opens again with the same spec.
func (sc *Scope) Open(ctx context.Context, spec SessionSpec) (*Session, error) {
	if err := sc.CheckDir("cwd", spec.Dir); err != nil {
		return nil, err
	}
	for i, d := range spec.ExtraDirs {
		if err := sc.CheckDir(fmt.Sprintf("additionalDirectories[%d]", i), d); err != nil {
			return nil, err
		}
	}
	// The workspace holds them all, and is what is mounted: a directory
	// the peer names is never a mount source.
	spec.Workspace, spec.ExtraDirs = sc.workspace, nil
	sc.mu.Lock()
	_, exists := sc.sessions[spec.ID]
	sc.mu.Unlock()
	if exists {
		if _, err := sc.m.Get(ctx, sc.key(spec.ID)); !errors.Is(err, ErrNotFound) {
			return nil, invalidError(fmt.Sprintf("invalid params: sessionId: session %q is already open", spec.ID))
		}
	}
	return sc.open(ctx, spec.ID, spec, &spec, true)
}

// open opens session id with spec; again is what it opens with again
// once the manager closed it (nil: as a new one). An explicit open fails
// when the session is open already.
func (sc *Scope) open(ctx context.Context, id string, spec SessionSpec, again *SessionSpec, explicit bool) (*Session, error) {
	sc.mu.Lock()
	if sc.closed {
		sc.mu.Unlock()
		return nil, ErrClosing
	}
	sc.sessions[id] = again
	sc.opening[id]++
	sc.mu.Unlock()
	var (
		s   *Session
		err error
	)
	if explicit {
		s, err = sc.m.Open(ctx, sc.key(id), spec)
	} else {
		s, err = sc.m.OpenOrGet(ctx, sc.key(id), spec)
	}
	sc.mu.Lock()
	if sc.opening[id]--; sc.opening[id] == 0 {
		delete(sc.opening, id)
	}
	sc.mu.Unlock()
	if err != nil {
		// A session that fails to open again keeps what it opens with
		// for the next try; a new one is forgotten, unless another
		// request is opening it or opened it meanwhile. (A request asked
		// off learns of one still starting only that it was asked off.)
		if again == nil || explicit {
			_, gerr := sc.m.Get(ctx, sc.key(id))
			sc.mu.Lock()
			if errors.Is(gerr, ErrNotFound) || gerr != nil && ctx.Err() == nil {
				if sc.opening[id] == 0 {
					delete(sc.sessions, id)
				}
			}
			sc.mu.Unlock()
		}
		return nil, err
	}
	// A close of the same id that ran between the registration above and
	// the manager's reservation found nothing to close and has answered:
	// the session just opened belongs to no one, so it goes now.
	sc.mu.Lock()
	_, kept := sc.sessions[id]
	sc.mu.Unlock()
	if !kept {
		if err := s.Close(context.WithoutCancel(ctx)); err != nil {
			return nil, fmt.Errorf("close session %s, closed while it opened: %w", id, err)
		}
		return nil, notFoundError(fmt.Sprintf("session %q was closed while this request opened it", id))
	}
	return s, nil
}

// Prepare starts opening a session in the background, so that its
// container is ready by the time the first command comes. The session is
// known to the scope at once: a command that comes first waits for the
// container.
func (sc *Scope) Prepare(spec SessionSpec) {
	sc.mu.Lock()
	closed := sc.closed || sc.pinned != ""
	if !closed {
		sc.sessions[spec.ID] = &spec
		delete(sc.ended, spec.ID)
	}
	sc.mu.Unlock()
	if closed {
		return
	}
	sc.m.OpenAsync(sc.key(spec.ID), spec)
}

// SessionFor returns the scope's open session whose workspace holds dir,
// so that a shared terminal runs where the agent works; with none, a
// session of the scope's own, which no peer can name, in its workspace.
func (sc *Scope) SessionFor(ctx context.Context, dir string) (*Session, error) {
	if p := sc.pinnedID(); p != "" {
		if err := sc.CheckDir("cwd", dir); err != nil {
			return nil, err
		}
		return sc.Session(ctx, p)
	}
	sc.mu.Lock()
	ids := make([]string, 0, len(sc.sessions))
	for id := range sc.sessions {
		ids = append(ids, id)
	}
	sc.mu.Unlock()
	slices.Sort(ids)
	for _, id := range ids {
		if s, err := sc.m.Get(ctx, sc.key(id)); err == nil && Within(s.Workspace(), dir) {
			return s, nil
		}
	}
	if err := sc.CheckDir("cwd", dir); err != nil {
		return nil, err
	}
	spec := sc.defaults
	spec.ID, spec.Workspace, spec.Dir, spec.ExtraDirs = "ahp", sc.workspace, "", nil
	sc.mu.Lock()
	closed := sc.closed
	sc.shared = !closed
	sc.mu.Unlock()
	if closed {
		return nil, ErrClosing
	}
	s, err := sc.m.OpenOrGet(ctx, sc.sharedKey(), spec)
	if err != nil {
		return nil, err
	}
	sc.mu.Lock()
	closed = sc.closed
	sc.mu.Unlock()
	if closed {
		// Close ran meanwhile and may have found nothing to close yet.
		if s := sc.m.Detach(sc.sharedKey()); s != nil {
			s.Close(context.WithoutCancel(ctx))
		}
		return nil, ErrClosing
	}
	return s, nil
}

// CloseSession removes one of the scope's sessions and its container.
func (sc *Scope) CloseSession(ctx context.Context, id string) error {
	remove := sc.Detach(id)
	if remove == nil {
		return notFoundError(fmt.Sprintf("unknown session %.200q", id))
	}
	return remove(ctx)
}

// Detach takes session id from the scope at once and returns what removes
// its container, for the caller to run when it suits; nil when the scope
// has no such session, or a pinned one, which only Close removes. A
// session opened under the id in between is another one, which remove
// leaves alone.
func (sc *Scope) Detach(id string) (remove func(context.Context) error) {
	if sc.pinnedID() != "" {
		return nil
	}
	return sc.detach(id)
}

func (sc *Scope) detach(id string) (remove func(context.Context) error) {
	sc.mu.Lock()
	_, ok := sc.sessions[id]
	delete(sc.sessions, id)
	sc.mu.Unlock()
	if !ok {
		return nil
	}
	s := sc.m.Detach(sc.key(id))
	return func(ctx context.Context) error {
		if s == nil {
			return nil
		}
		return s.Close(ctx)
	}
}

// End detaches session id, which the editor closed, like Detach, and
// keeps a command that names it later from opening it again until
// Prepare names it.
func (sc *Scope) End(id string) (remove func(context.Context) error) {
	sc.mu.Lock()
	if !sc.ended[id] {
		sc.ended[id] = true
		sc.endedOrder = append(sc.endedOrder, id)
		if len(sc.endedOrder) > maxEnded {
			delete(sc.ended, sc.endedOrder[0])
			sc.endedOrder = sc.endedOrder[1:]
		}
	}
	sc.mu.Unlock()
	return sc.Detach(id)
}

// ImplicitSpec returns the spec session id opens with again, and whether
// the scope knows the session; a session a command opened before the
// editor named its directories has the scope's workspace.
func (sc *Scope) ImplicitSpec(id string) (SessionSpec, bool) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	again, ok := sc.sessions[id]
	switch {
	case !ok:
		return SessionSpec{}, false
	case again != nil:
		return *again, true
	}
	return SessionSpec{Workspace: sc.workspace}, true
}

// Close removes every session of the scope, together, and opens none
// after. It runs when the connection ends.
func (sc *Scope) Close(ctx context.Context) error {
	sc.mu.Lock()
	sc.closed = true
	ids := make([]string, 0, len(sc.sessions))
	for id := range sc.sessions {
		ids = append(ids, id)
	}
	shared := sc.shared
	sc.mu.Unlock()
	// Taken out at once, removed together: each removal waits for its
	// commands' kill and the engine.
	removes := make([]func(context.Context) error, 0, len(ids)+1)
	for _, id := range ids {
		if remove := sc.detach(id); remove != nil {
			removes = append(removes, remove)
		}
	}
	if shared {
		if s := sc.m.Detach(sc.sharedKey()); s != nil {
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

// Pin opens the scope's one session with spec, as Open does: every
// session id of the scope names it from then on, a command of any id runs
// in its container, and no other container is opened (wrap --contain,
// whose agent and every command share one container). A scope is pinned
// once.
func (sc *Scope) Pin(ctx context.Context, spec SessionSpec) (*Session, error) {
	sc.mu.Lock()
	if sc.pinned != "" {
		sc.mu.Unlock()
		return nil, fmt.Errorf("pin session %s: the scope has its session %s already", spec.ID, sc.pinned)
	}
	sc.pinned = spec.ID
	sc.mu.Unlock()
	return sc.Open(ctx, spec)
}

// pinnedID is the pinned session's id, or "".
func (sc *Scope) pinnedID() string {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.pinned
}
