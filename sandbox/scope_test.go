package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd"
	"github.com/sandboxd/sandboxd/internal/enginetest"
)

// newTestManager returns a manager of an in-memory engine whose calls
// named in hold wait (enginetest.New).
func newTestManager(t *testing.T, hold ...string) (*enginetest.Engine, *Manager) {
	t.Helper()
	e := enginetest.New(t, hold...)
	cfg, err := LoadConfig(sandboxd.DefaultConfig, "", 2)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewManager(context.Background(), e.API, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	e.CloseAtEnd(t, m.Close)
	return e, m
}

// TestCancelledCreateLeavesTheSessionToAnother: a terminal/create asked
// off while another request opens the same session does not take the
// session from the scope, which would close it under the other.
func TestCancelledCreateLeavesTheSessionToAnother(t *testing.T) {
	e, m := newTestManager(t, "create")
	sc := m.NewScope("test", t.TempDir(), SessionSpec{})
	first := make(chan error, 1)
	go func() {
		_, err := sc.SessionForCommand(context.Background(), "s", "")
		first <- err
	}()
	// The first is opening the session: its container is being made.
	for deadline := time.Now().Add(5 * time.Second); m.Sessions() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first create did not open the session")
		}
	}
	// The second came as the first did, when the scope had no such
	// session yet, and is asked off while it waits for the first's.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	spec := sc.defaults
	spec.ID, spec.Workspace = "s", sc.workspace
	if _, err := sc.open(ctx, "s", spec, nil, false); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled open: %v, want it cancelled", err)
	}
	sc.mu.Lock()
	_, kept := sc.sessions["s"]
	sc.mu.Unlock()
	if !kept {
		t.Error("the cancelled create took the session from the scope")
	}
	e.Release() // the first one's start fails now, as the engine says
	if err := <-first; err == nil || strings.Contains(err.Error(), "was closed while this request opened it") {
		t.Errorf("first create: %v, want the engine's error", err)
	}
}

// TestFailedOpensAreForgotten: a new session whose open failed is
// forgotten also when its request was asked off, so that a peer cannot
// fill the scope's memory with sessions that never opened.
func TestFailedOpensAreForgotten(t *testing.T) {
	_, m := newTestManager(t)
	ws := t.TempDir()
	sc := m.NewScope("test", ws, SessionSpec{})
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for i, ctx := range []context.Context{context.Background(), cancelled} {
		spec := sc.defaults
		spec.ID, spec.Workspace, spec.Dir = fmt.Sprint("s", i), ws, filepath.Join(ws, "missing")
		if _, err := sc.open(ctx, spec.ID, spec, nil, false); err == nil {
			t.Fatalf("open %s with a missing cwd: no error", spec.ID)
		}
	}
	sc.mu.Lock()
	left, opening := len(sc.sessions), len(sc.opening)
	sc.mu.Unlock()
	if left != 0 || opening != 0 {
		t.Errorf("%d sessions and %d opens left after failed opens, want none", left, opening)
	}
}

// TestClosedTerminalsOpenNothing: a request still under way when its
// connection ends opens no session, which nothing would close.
func TestClosedTerminalsOpenNothing(t *testing.T) {
	sc := (*Manager)(nil).NewScope("c", "/w", SessionSpec{})
	if err := sc.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.open(context.Background(), "s", SessionSpec{ID: "s", Workspace: "/w"}, nil, false); err != ErrClosing {
		t.Errorf("open after Close: %v, want ErrClosing", err)
	}
	sc.Prepare(SessionSpec{ID: "p", Workspace: "/w"})
	if len(sc.sessions) != 0 {
		t.Errorf("sessions after Close: %v, want none", sc.sessions)
	}
}

// TestPinnedScopeHasOneSession: every session id of a pinned scope names
// its one session, none opens another container, and the editor's end of
// a session leaves it; the scope's Close removes it.
func TestPinnedScopeHasOneSession(t *testing.T) {
	_, m := newTestManager(t)
	ws := t.TempDir()
	sc := m.NewScope("test", ws, SessionSpec{})
	pinned, err := sc.Pin(context.Background(), SessionSpec{ID: "contain", Dir: ws})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Pin(context.Background(), SessionSpec{ID: "again", Dir: ws}); err == nil {
		t.Error("a scope was pinned twice")
	}
	for _, id := range []string{"a", "b", "contain"} {
		s, err := sc.SessionForCommand(context.Background(), id, "")
		if err != nil || s != pinned {
			t.Errorf("SessionForCommand(%q) = %v, %v; want the pinned session", id, s, err)
		}
		if s, err := sc.Session(context.Background(), id); err != nil || s != pinned {
			t.Errorf("Session(%q) = %v, %v; want the pinned session", id, s, err)
		}
	}
	if s, err := sc.SessionFor(context.Background(), ws); err != nil || s != pinned {
		t.Errorf("SessionFor = %v, %v; want the pinned session", s, err)
	}
	sc.Prepare(SessionSpec{ID: "other", Workspace: ws})
	if remove := sc.End("contain"); remove != nil {
		t.Error("the editor's end of a session would remove the pinned one")
	}
	if n := m.Sessions(); n != 1 {
		t.Errorf("%d sessions, want the pinned one alone", n)
	}
	if err := sc.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := m.Sessions(); n != 0 {
		t.Errorf("%d sessions after Close", n)
	}
}
