package sandbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/moby/moby/api/types/system"
	"github.com/moby/moby/client"
)

// readyManager is a manager with no engine, holding sessions that are
// marked started: enough for what it decides without the engine.
func readyManager(t *testing.T) *Manager {
	t.Helper()
	cfg := Config{}
	cfg.Server.MaxSessions = 8
	// A client that no test connects: only its host is read.
	cli, err := client.New(client.WithHost("unix:///nonexistent/docker.sock"))
	if err != nil {
		t.Fatal(err)
	}
	return &Manager{
		cli:      cli,
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

// TestDetachedSessionsCount: a session taken out while its container is
// removed still counts against server.max_sessions.
func TestDetachedSessionsCount(t *testing.T) {
	m := readyManager(t)
	m.cfg.Server.MaxSessions = 1
	old := m.addReady("k", SessionSpec{ID: "k"})
	m.Detach("k")
	if n := m.Sessions(); n != 1 {
		t.Errorf("Sessions = %d with one being closed, want 1", n)
	}
	if _, _, err := m.reserve("other", SessionSpec{ID: "other"}); !errors.Is(err, ErrLimit) {
		t.Errorf("reserve past the limit with one being closed: %v, want ErrLimit", err)
	}
	m.forget(old)
	if _, _, err := m.reserve("other", SessionSpec{ID: "other"}); err != nil {
		t.Errorf("reserve once the old one is gone: %v", err)
	}
}

func TestTiniInit(t *testing.T) {
	tests := []struct {
		binary string
		want   bool
	}{
		{"docker-init", true},
		{"/usr/libexec/docker/docker-init", true},
		{"/usr/bin/tini-static", true},
		{"/usr/bin/catatonit", false},
		{"/usr/bin/dumb-init", false},
		{"", false},
	}
	for _, tc := range tests {
		if got := tiniInit(tc.binary); got != tc.want {
			t.Errorf("tiniInit(%q) = %v, want %v", tc.binary, got, tc.want)
		}
	}
}

func TestMapsIDs(t *testing.T) {
	for _, tc := range []struct {
		opts []string
		want bool
	}{
		{[]string{"name=seccomp,profile=default"}, false},
		{[]string{"name=apparmor", "name=seccomp,profile=default", "name=userns"}, true},
		{[]string{"name=seccomp,profile=builtin", "name=rootless", "name=cgroupns"}, true},
		{nil, false},
	} {
		if got := mapsIDs(tc.opts); got != tc.want {
			t.Errorf("mapsIDs(%q) = %v, want %v", tc.opts, got, tc.want)
		}
	}
}

func TestUnenforcedLimits(t *testing.T) {
	all := system.Info{MemoryLimit: true, SwapLimit: true, CPUCfsQuota: true, CPUCfsPeriod: true, PidsLimit: true}
	if got := unenforcedLimits(all); len(got) != 0 {
		t.Errorf("an engine that enforces every limit: %v, want none", got)
	}
	noPids, noSwap := all, all
	noPids.PidsLimit, noSwap.SwapLimit = false, false
	if got := unenforcedLimits(noPids); !slices.Equal(got, []string{"pids"}) {
		t.Errorf("no pids controller: %v, want pids", got)
	}
	if got := unenforcedLimits(noSwap); len(got) != 1 || !strings.HasPrefix(got[0], "memory+swap") {
		t.Errorf("no swap accounting: %v, want memory+swap", got)
	}
}
