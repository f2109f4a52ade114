package sandbox

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/engine"
	"github.com/sandboxd/sandboxd/limits"
)

// Session is one agent session's container. Its terminals run as docker
// execs in it; closing it removes the container and everything in it.
type Session struct {
	ID  string
	key string
	m   *Manager

	spec SessionSpec // defaults filled in
	user string      // uid:gid
	// mountSources are the workspace and extra directories, links
	// resolved, once the session has checked them (guarded by mu).
	mountSources []string
	// gitSeen is the git metadata protectGit found, for a spare to be
	// adopted only while it is still what is there; gitGuarded says it
	// looked, gitAlso are the writable grants it looked in besides the
	// session's directories.
	gitSeen    []gitFile
	gitGuarded bool
	gitAlso    []string
	ready      chan struct{}
	err        error // set before ready is closed
	contID     string

	mu        sync.Mutex
	terminals map[string]*Terminal
	closed    bool
	ran       bool // a command was started
	lastUsed  time.Time
	oomSeen   int64
	// oomSpare counts the kills of the last rise beyond the one put down
	// to the command that found it, for commands killed with it, which
	// ask within oomWindow of oomSpareAt.
	oomSpare   int64
	oomSpareAt time.Time
	// sweep lists released terminals whose leftovers are to be killed.
	sweep      []string
	sweepTimer *time.Timer

	closeOnce sync.Once
	closeErr  error
	// reclaiming is the reclaim under way (guarded by mu).
	reclaiming *killing

	// lendMu orders the pids limit's changes; lenders counts the kills
	// that borrow pids now: the limit goes back when the last is done,
	// not under another kill's feet.
	lendMu  sync.Mutex
	lenders int
}

func newSession(m *Manager, key string, spec SessionSpec) *Session {
	return &Session{
		ID:        spec.ID,
		key:       key,
		m:         m,
		spec:      spec,
		ready:     make(chan struct{}),
		terminals: make(map[string]*Terminal),
		lastUsed:  time.Now(),
	}
}

func (s *Session) markReady(err error) {
	s.err = err
	close(s.ready)
}

// waitReady waits until the session's start is over and returns its
// error. A started session is found ready also under a ctx that is done,
// which a caller that must not wait passes.
func (s *Session) waitReady(ctx context.Context) error {
	select {
	case <-s.ready:
		return s.err
	default:
	}
	select {
	case <-s.ready:
		return s.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ContainerID returns the id of the session's container.
func (s *Session) ContainerID() string { return s.contID }

// Workspace returns the session's workspace directory.
func (s *Session) Workspace() string { return s.spec.Workspace }

// Dir returns where commands that name no directory run.
func (s *Session) Dir() string {
	if s.spec.Dir != "" {
		return s.spec.Dir
	}
	return s.spec.Workspace
}

// User returns the uid:gid commands run as.
func (s *Session) User() string { return s.user }

// Limits returns the resource limits the container runs with.
func (s *Session) Limits() limits.Limits { return s.spec.Limits }

func (s *Session) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// claimIdle marks the session closed, for the caller to Close, when it has
// had no call and no unreleased terminal for timeout. Checking and marking
// are one step: a call that comes meanwhile either keeps the session or
// finds it closed, never a terminal of it killed a moment after it started.
func (s *Session) claimIdle(now time.Time, timeout time.Duration) bool {
	select {
	case <-s.ready:
	default:
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// A terminal not yet released, running or not, is still the peer's to
	// read: its id must stay good until terminal/release.
	if s.closed || len(s.terminals) > 0 || now.Sub(s.lastUsed) < timeout {
		return false
	}
	s.closed = true
	return true
}

// Terminal returns the terminal with the given id.
func (s *Session) Terminal(id string) (*Terminal, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastUsed = time.Now()
	t, ok := s.terminals[id]
	if !ok || s.closed {
		return nil, fmt.Errorf("terminal %s: %w", id, ErrNotFound)
	}
	return t, nil
}

// Release kills the terminal if it still runs and forgets it; its id is
// unknown afterwards.
func (s *Session) Release(ctx context.Context, id string) error {
	t, err := s.Terminal(id)
	if err != nil {
		return err
	}
	if !s.forgetTerminal(t) {
		return fmt.Errorf("terminal %s: %w", id, ErrNotFound)
	}
	err = t.Kill(ctx)
	t.close()
	// Processes the command left running in the background are part of
	// what release frees, nobody need wait for that, and the kill leaves
	// them be when the command had exited, also just as it looked; when
	// the kill failed, the id is gone, and the sweep is what is left to
	// kill them with.
	s.sweepLater(id)
	if err != nil {
		if ctx.Err() != nil {
			// Asked off while the kill waited: released all the same,
			// and to say otherwise would have the peer retry an id that
			// is no more.
			return nil
		}
		return fmt.Errorf("release terminal %s: %w", id, err)
	}
	return nil
}

// Close kills every terminal and removes the container.
func (s *Session) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		// Out of the manager's sessions first: an open under the key
		// while the container is removed is a new session, not this
		// closing one. Among the detached until the container is gone.
		s.m.detach(s)
		s.mu.Lock()
		s.closed = true
		if s.sweepTimer != nil {
			s.sweepTimer.Stop()
		}
		terms := make([]*Terminal, 0, len(s.terminals))
		for _, t := range s.terminals {
			terms = append(terms, t)
		}
		s.terminals = map[string]*Terminal{}
		s.mu.Unlock()
		for _, t := range terms {
			t.unhold()
		}
		// Removing the container kills every process in it at once; no
		// per-terminal kill is needed.
		for _, t := range terms {
			t.markSent(syscall.SIGKILL)
		}
		s.closeErr = s.removeContainer()
		s.mu.Lock()
		ran := s.ran
		s.mu.Unlock()
		if made := s.gitMade(); ran && len(made) > 0 {
			s.m.log.Warn("git metadata appeared in the session's directories while it ran, with no read-only mount over it: commands may have set hooks or config there; treat it as untrusted: host git there may run what they wrote",
				"session", s.ID, "paths", made)
		}
		for _, t := range terms {
			t.close()
		}
		s.m.forget(s)
		if s.closeErr != nil {
			s.m.removeLater(s) // among the detached again until it is gone
		}
		s.m.log.Info("session closed", "session", s.ID)
	})
	return s.closeErr
}

func (s *Session) removeContainer() error {
	s.mu.Lock()
	id := s.contID
	s.mu.Unlock()
	if id == "" {
		return nil
	}
	// A caller's cancelled context must not leave the container behind;
	// the removal's calls have deadlines of their own.
	if err := engine.RemoveContainer(context.WithoutCancel(s.m.ctx), s.m.cli, id); err != nil && !engine.IsNotFound(err) {
		return fmt.Errorf("close session %s: remove container %.12s: %w", s.ID, id, err)
	}
	return nil
}
