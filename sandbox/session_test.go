package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"
)

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
