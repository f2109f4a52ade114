package acp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
)

// TestFailedRemovalIsTriedAgain: a container the engine failed to remove
// when its session closed is removed on a later try, and counts as a
// session until then.
func TestFailedRemovalIsTriedAgain(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.newSession(t, "s")
	pp.createTerminal(t, ``)
	e.failRemoves.Store(1)
	before := e.removes.Load()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pp.p.terms.CloseSession(ctx, "s"); err == nil || !strings.Contains(err.Error(), "did not receive an exit event") {
		t.Fatalf("close with a failing removal: %v, want the engine's error", err)
	}
	if n := e.m.Sessions(); n != 1 {
		t.Errorf("%d sessions while the container is still there, want 1", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.removes.Load() < before+2 || e.m.Sessions() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the removal was not tried again within 10s (%d tries, %d sessions)", e.removes.Load()-before, e.m.Sessions())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCloseLeavesAFailedRemovalToLeftovers: sandboxd stopping while a
// container's removal waits for its next try does not report that old
// failure: the removal of what is left at exit takes the container.
func TestCloseLeavesAFailedRemovalToLeftovers(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.newSession(t, "s")
	pp.createTerminal(t, ``)
	e.failRemoves.Store(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pp.p.terms.CloseSession(ctx, "s"); err == nil {
		t.Fatal("close with a failing removal succeeded")
	}
	if err := e.m.Close(ctx); err != nil {
		t.Errorf("Close while the removal waits for its next try: %v, want nil", err)
	}
}

// TestFailedCreateRemovesWhatItMade: a create whose answer is an error
// may have made its container all the same; it is removed by name, not
// left until sandboxd exits.
func TestFailedCreateRemovesWhatItMade(t *testing.T) {
	e := newFakeEngine(t)
	e.failCreates.Store(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.m.Open(ctx, "k", sandbox.SessionSpec{ID: "s", Workspace: t.TempDir()}); err == nil {
		t.Fatal("open with a failing create succeeded")
	}
	e.mu.Lock()
	made := e.made
	e.mu.Unlock()
	if made == "" {
		t.Fatal("no create reached the engine")
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		e.mu.Lock()
		removed := slices.Contains(e.removedNames, made)
		e.mu.Unlock()
		if removed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s of the failed create was not removed", made)
		}
	}
}

// TestCancelledCreateLeavesTheSessionToAnother: a terminal/create asked
// off while another request opens the same session does not take the
// session from the connection, which would close it under the other.
func TestCancelledCreateLeavesTheSessionToAnother(t *testing.T) {
	e := newFakeEngine(t, "create")
	terms := NewTerminals(e.m, "test", t.TempDir(), sandbox.SessionSpec{})
	params := json.RawMessage(`{"sessionId":"s","command":"true"}`)
	first := make(chan error, 1)
	go func() {
		_, err := terms.create(context.Background(), params)
		first <- err
	}()
	// The first is opening the session: its container is being made.
	for deadline := time.Now().Add(5 * time.Second); e.m.Sessions() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first create did not open the session")
		}
	}
	// The second came as the first did, when the connection had no such
	// session yet, and is asked off while it waits for the first's.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	spec := terms.defaults
	spec.ID, spec.Workspace = "s", terms.workspace
	if _, err := terms.open(ctx, "s", spec, nil, false); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled open: %v, want it cancelled", err)
	}
	terms.mu.Lock()
	_, kept := terms.sessions["s"]
	terms.mu.Unlock()
	if !kept {
		t.Error("the cancelled create took the session from the connection")
	}
	e.release() // the first one's start fails now, as the engine says
	if err := <-first; err == nil || strings.Contains(err.Error(), "was closed while this request opened it") {
		t.Errorf("first create: %v, want the engine's error", err)
	}
}

// TestFailedOpensAreForgotten: a new session whose open failed is
// forgotten also when its request was asked off, so that a peer cannot
// fill the connection's memory with sessions that never opened.
func TestFailedOpensAreForgotten(t *testing.T) {
	e := newFakeEngine(t)
	ws := t.TempDir()
	terms := NewTerminals(e.m, "test", ws, sandbox.SessionSpec{})
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for i, ctx := range []context.Context{context.Background(), cancelled} {
		spec := terms.defaults
		spec.ID, spec.Workspace, spec.Dir = fmt.Sprint("s", i), ws, filepath.Join(ws, "missing")
		if _, err := terms.open(ctx, spec.ID, spec, nil, false); err == nil {
			t.Fatalf("open %s with a missing cwd: no error", spec.ID)
		}
	}
	terms.mu.Lock()
	left, opening := len(terms.sessions), len(terms.opening)
	terms.mu.Unlock()
	if left != 0 || opening != 0 {
		t.Errorf("%d sessions and %d opens left after failed opens, want none", left, opening)
	}
}

// TestPeersCannotNameTheSharedSession: the session the AHP channel opens
// for itself is no peer's: a peer's "ahp" is a session of its own, and
// closing it leaves the shared one running.
func TestPeersCannotNameTheSharedSession(t *testing.T) {
	e := newFakeEngine(t)
	ws := t.TempDir()
	terms := NewTerminals(e.m, "test", ws, sandbox.SessionSpec{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	shared, err := terms.SessionFor(ctx, ws)
	if err != nil {
		t.Fatal(err)
	}
	res, err := terms.Handle(ctx, MethodCreate, json.RawMessage(`{"sessionId":"ahp","command":"true"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := shared.Terminal(res.(CreateTerminalResponse).TerminalID); err == nil {
		t.Error("a peer's terminal of session \"ahp\" runs in the shared session")
	}
	if _, err := terms.Handle(ctx, MethodSessionClose, json.RawMessage(`{"sessionId":"ahp"}`)); err != nil {
		t.Fatal(err)
	}
	if again, err := terms.SessionFor(ctx, ws); err != nil || again != shared {
		t.Errorf("shared session after a peer closed its \"ahp\": %v, %v; want the same one", again, err)
	}
	if err := terms.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.m.Sessions(); n != 0 {
		t.Errorf("%d sessions after the connection closed, want 0", n)
	}
	if _, err := terms.SessionFor(ctx, ws); err == nil {
		t.Error("the shared session opened again after the connection closed")
	}
}

// TestClosedTerminalsOpenNothing: a request still under way when its
// connection ends opens no session, which nothing would close.
func TestClosedTerminalsOpenNothing(t *testing.T) {
	terms := NewTerminals(nil, "c", "/w", sandbox.SessionSpec{})
	if err := terms.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := terms.open(context.Background(), "s", sandbox.SessionSpec{ID: "s", Workspace: "/w"}, nil, false); err != errClosed {
		t.Errorf("open after Close: %v, want errClosed", err)
	}
	terms.Prepare(sandbox.SessionSpec{ID: "p", Workspace: "/w"})
	if len(terms.sessions) != 0 {
		t.Errorf("sessions after Close: %v, want none", terms.sessions)
	}
}
