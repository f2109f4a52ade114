package acp

import (
	"context"
	"encoding/json"
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
	e.FailRemoves.Store(1)
	before := e.Removes.Load()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pp.p.terms.scope.CloseSession(ctx, "s"); err == nil || !strings.Contains(err.Error(), "did not receive an exit event") {
		t.Fatalf("close with a failing removal: %v, want the engine's error", err)
	}
	if n := e.m.Sessions(); n != 1 {
		t.Errorf("%d sessions while the container is still there, want 1", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.Removes.Load() < before+2 || e.m.Sessions() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the removal was not tried again within 10s (%d tries, %d sessions)", e.Removes.Load()-before, e.m.Sessions())
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
	e.FailRemoves.Store(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pp.p.terms.scope.CloseSession(ctx, "s"); err == nil {
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
	e.FailCreates.Store(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.m.Open(ctx, "k", sandbox.SessionSpec{ID: "s", Workspace: t.TempDir()}); err == nil {
		t.Fatal("open with a failing create succeeded")
	}
	made := e.Made()
	if made == "" {
		t.Fatal("no create reached the engine")
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if e.Removed(made) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s of the failed create was not removed", made)
		}
	}
}

// TestPeersCannotNameTheSharedSession: the session the AHP channel opens
// for itself is no peer's: a peer's "ahp" is a session of its own, and
// closing it leaves the shared one running.
func TestPeersCannotNameTheSharedSession(t *testing.T) {
	e := newFakeEngine(t)
	ws := t.TempDir()
	terms := newTerminals(e.m, "test", ws, sandbox.SessionSpec{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	shared, err := terms.scope.SessionFor(ctx, ws)
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
	if again, err := terms.scope.SessionFor(ctx, ws); err != nil || again != shared {
		t.Errorf("shared session after a peer closed its \"ahp\": %v, %v; want the same one", again, err)
	}
	if err := terms.scope.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.m.Sessions(); n != 0 {
		t.Errorf("%d sessions after the connection closed, want 0", n)
	}
	if _, err := terms.scope.SessionFor(ctx, ws); err == nil {
		t.Error("the shared session opened again after the connection closed")
	}
}
