package sandbox

import (
	"context"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd"
)

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

// TestFailedSpareIsTriedAgain: a spare that could not start (here: no
// engine) is started again by the next session that finds none, not left
// missing for the rest of the run; one whose workspace no session may
// have is not.
func TestFailedSpareIsTriedAgain(t *testing.T) {
	for _, tc := range []struct {
		name      string
		workspace string
		again     bool
	}{
		{"engine unreachable", t.TempDir(), true},
		{"workspace refused", "relative/dir", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := readyManager(t)
			cfg, err := LoadConfig(sandboxd.DefaultConfig, "", 2)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Server.MaxSessions = 8
			m.cfg = cfg
			m.instance = &Instance{ID: "0123456789ab"}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			m.ctx = ctx
			m.KeepSpare(SessionSpec{Workspace: tc.workspace})
			ended := func() bool {
				m.mu.Lock()
				defer m.mu.Unlock()
				return !m.spareStarting
			}
			for deadline := time.Now().Add(10 * time.Second); !ended(); time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the spare's start did not end")
				}
			}
			if _, state, err := m.reserve("k", SessionSpec{ID: "k", Workspace: tc.workspace}); err != nil || state != fresh {
				t.Fatalf("reserve = %d, %v; want a fresh session", state, err)
			}
			m.wg.Done() // the fresh session's start, not made here
			m.mu.Lock()
			again := m.spareStarting
			m.mu.Unlock()
			if again != tc.again {
				t.Errorf("a new spare started: %v, want %v", again, tc.again)
			}
			cancel()
			m.wg.Wait()
		})
	}
}
