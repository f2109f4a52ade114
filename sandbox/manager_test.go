package sandbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"
)

// readyManager is a manager with no engine, holding sessions that are
// marked started: enough for what it decides without the engine.
func readyManager(t *testing.T) *Manager {
	t.Helper()
	cfg := Config{}
	cfg.Server.MaxSessions = 8
	return &Manager{
		cfg:      cfg,
		log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		sessions: make(map[string]*Session),
		detached: make(map[*Session]struct{}),
	}
}

func (m *Manager) addReady(key string, spec SessionSpec) *Session {
	s := newSession(m, key, spec)
	s.contID = "0123456789abcdef"
	s.markReady(nil)
	m.sessions[key] = s
	return s
}

func TestClaimIdle(t *testing.T) {
	m := readyManager(t)
	now := time.Now()
	for _, tc := range []struct {
		name      string
		idle      time.Duration
		terminals int
		want      bool
	}{
		{"used lately", time.Minute, 0, false},
		{"idle", time.Hour, 0, true},
		{"idle with an unreleased terminal", time.Hour, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := m.addReady(tc.name, SessionSpec{ID: tc.name})
			s.lastUsed = now.Add(-tc.idle)
			for i := range tc.terminals {
				s.terminals[string(rune('a'+i))] = &Terminal{}
			}
			if got := s.claimIdle(now, 30*time.Minute); got != tc.want {
				t.Fatalf("claimIdle = %v, want %v", got, tc.want)
			}
			if !tc.want {
				return
			}
			// Claimed: a second look does not claim it again, a call
			// finds it gone, and an open under its key is a new session.
			if s.claimIdle(now, 30*time.Minute) {
				t.Error("claimed twice")
			}
			if _, err := s.Terminal("x"); !errors.Is(err, ErrNotFound) {
				t.Errorf("Terminal on a claimed session: %v, want ErrNotFound", err)
			}
			if _, err := m.Get(context.Background(), tc.name); !errors.Is(err, ErrNotFound) {
				t.Errorf("Get of a claimed session: %v, want ErrNotFound", err)
			}
			if n, state, err := m.reserve(tc.name, SessionSpec{ID: tc.name}); err != nil || state != fresh || n == s {
				t.Errorf("reserve under a claimed session's key = %p, %d, %v; want a fresh session", n, state, err)
			}
		})
	}
	// A session still starting is never idle.
	s := newSession(m, "starting", SessionSpec{ID: "starting"})
	s.lastUsed = now.Add(-time.Hour)
	if s.claimIdle(now, time.Minute) {
		t.Error("claimed a session that is still starting")
	}
}

// TestAdoptedSpareIsNotIdle: the spare waits for a session as long as it
// must; the session that takes it is idle from then on, not since the
// spare was made.
func TestAdoptedSpareIsNotIdle(t *testing.T) {
	m := readyManager(t)
	spare := m.addReady("", SessionSpec{ID: "spare", Workspace: "/w"})
	delete(m.sessions, "")
	spare.lastUsed = time.Now().Add(-2 * time.Hour)
	m.spare = spare
	s, state, err := m.reserve("k", SessionSpec{ID: "k", Workspace: "/w"})
	if err != nil || state != adopted || s != spare {
		t.Fatalf("reserve = %p, %d, %v; want the spare adopted", s, state, err)
	}
	if s.claimIdle(time.Now(), 30*time.Minute) {
		t.Error("the session that took a two-hour-old spare is idle at once")
	}
}

// TestDetachedKeyOpensAnew: a session being closed (session/close in a
// proxy, whose container goes after the agent answers) is no longer found
// under its key; an open meanwhile makes a new one, which closing the old
// one leaves alone.
func TestDetachedKeyOpensAnew(t *testing.T) {
	m := readyManager(t)
	old := m.addReady("k", SessionSpec{ID: "k"})
	if got := m.Detach("k"); got != old {
		t.Fatalf("Detach = %p, want %p", got, old)
	}
	if m.Detach("k") != nil {
		t.Error("detached twice")
	}
	if _, err := m.Get(context.Background(), "k"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after Detach: %v, want ErrNotFound", err)
	}
	n, state, err := m.reserve("k", SessionSpec{ID: "k"})
	if err != nil || state != fresh || n == old {
		t.Fatalf("reserve after Detach = %p, %d, %v; want a fresh session", n, state, err)
	}
	m.forget(old)
	if m.sessions["k"] != n {
		t.Error("forgetting the detached session dropped the new one")
	}
	if _, ok := m.detached[old]; ok {
		t.Error("the detached session is still waiting to be closed after it was forgotten")
	}
}
