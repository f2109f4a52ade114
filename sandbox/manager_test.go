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

	"github.com/sandboxd/sandboxd/limits"
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
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return &Manager{
		ctx:      ctx,
		cancel:   cancel,
		cli:      cli,
		cfg:      cfg,
		log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		sessions: make(map[string]*Session),
		detached: make(map[*Session]struct{}),
		memory:   make(map[*Session]int64),
		output:   NewMemoryPool(0),
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

// TestFailedStartWhoseRemovalFailedStillCounts: a start that failed, and
// whose container could not be removed either, leaves the container to
// removeLater; until it is gone it counts against server.max_sessions
// and the memory budget, also once the start forgot its session.
func TestFailedStartWhoseRemovalFailedStillCounts(t *testing.T) {
	m := readyManager(t)
	m.cfg.Server.MaxSessions = 1
	m.cfg.Session.Memory, m.cfg.Session.Max.Memory = 1<<30, 1<<30
	m.memoryBudget = 1 << 30
	s, _, err := m.reserve("k", SessionSpec{ID: "k"})
	if err != nil {
		t.Fatal(err)
	}
	s.contID = "0123456789abcdef"
	m.discard(s) // no engine: the removal fails, and is tried again later
	m.forget(s)  // as startSession does after a failed start
	if n := m.Sessions(); n != 1 {
		t.Errorf("Sessions = %d with its container left to remove, want 1", n)
	}
	if _, _, err := m.reserve("other", SessionSpec{ID: "other"}); !errors.Is(err, ErrLimit) {
		t.Errorf("reserve while that container is there: %v, want ErrLimit", err)
	}
}

// TestMemoryBudget: the memory limits of the sessions whose containers
// are there or on their way never add up to more than the budget: a
// session past it is refused (ErrLimit), saying what is committed, until
// one goes; a limit above the host's memory is refused whatever the
// budget (ErrInvalid).
func TestMemoryBudget(t *testing.T) {
	m := readyManager(t)
	m.cfg.Session.Memory, m.cfg.Session.Max.Memory = 1<<30, 2<<30
	m.cfg.Server.MemoryBudget = MemoryBudget{Bytes: 3 << 30}
	m.hostMemory, m.memoryBudget = 4<<30, 3<<30
	first, _, err := m.reserve("a", SessionSpec{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.reserve("b", SessionSpec{ID: "b", Limits: limits.Limits{Memory: 2 << 30}}); err != nil {
		t.Fatal(err)
	}
	_, _, err = m.reserve("c", SessionSpec{ID: "c"})
	if want := "memory: 1GiB more would commit 4GiB, over the memory budget of 3GiB (server.memory_budget); 2 sessions commit 3GiB"; !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), want) {
		t.Errorf("a session past the budget: %v, want ErrLimit saying %q", err, want)
	}
	// Closing (detached, its container still there) frees nothing yet.
	m.Detach("a")
	if _, _, err := m.reserve("c", SessionSpec{ID: "c"}); !errors.Is(err, ErrLimit) {
		t.Errorf("a session past the budget while another's container goes: %v, want ErrLimit", err)
	}
	m.forget(first)
	if _, _, err := m.reserve("c", SessionSpec{ID: "c"}); err != nil {
		t.Errorf("once a container went: %v", err)
	}
	if _, _, err := m.reserve("d", SessionSpec{ID: "d", Limits: limits.Limits{Memory: 5 << 30}}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "memory 5GiB is more than the 4GiB of memory the engine's host has") {
		t.Errorf("a limit above the host's memory: %v, want ErrInvalid", err)
	}
	if err := m.CheckMemory(3<<30 + 1); !errors.Is(err, ErrLimit) || !strings.HasPrefix(err.Error(), "memory 3.0GiB is more than the memory budget of 3GiB") {
		t.Errorf("CheckMemory past the budget: %v", err)
	}
}

// TestSpareMakesRoom: the spare counts against the memory budget; it is
// started only when it fits beside the sessions, and removed when a
// session needs its room; a session that takes it commits nothing more.
func TestSpareMakesRoom(t *testing.T) {
	m := readyManager(t)
	m.cfg.Session.Memory, m.cfg.Session.Max.Memory = 1<<30, 1<<30
	m.memoryBudget = 3 << 30
	m.spareSpec = &SessionSpec{ID: "spare", Workspace: "/w"}
	spare := m.addReady("", SessionSpec{ID: "spare", Workspace: "/w"})
	delete(m.sessions, "")
	m.spare = spare
	for _, k := range []string{"a", "b"} {
		if _, _, err := m.reserve(k, SessionSpec{ID: k, Workspace: "/other"}); err != nil {
			t.Fatal(err)
		}
	}
	if m.spare != spare {
		t.Fatal("the spare went while it fitted beside the sessions")
	}
	// Two sessions and the spare fill the budget: the spare is taken.
	if s, state, err := m.reserve("c", SessionSpec{ID: "c", Workspace: "/w"}); err != nil || state != adopted || s != spare {
		t.Fatalf("reserve = %p, %d, %v; want the spare adopted", s, state, err)
	}
	if m.spareStarting {
		t.Error("a new spare started with no room for it")
	}
	m.forget(m.sessions["c"])
	m.spare = spare
	// A session the spare does not fit needs its room: the spare goes.
	if _, _, err := m.reserve("d", SessionSpec{ID: "d", Workspace: "/other"}); err != nil {
		t.Fatalf("a session that needs the spare's room: %v", err)
	}
	if m.spare != nil {
		t.Error("the spare stayed in the room a session needed")
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
