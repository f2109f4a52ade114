package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/system"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd"
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

func TestCountOOMKills(t *testing.T) {
	start := time.Now()
	s := &Session{}
	for _, step := range []struct {
		name  string
		n     int64
		after time.Duration
		want  bool
	}{
		{"no kill", 0, 0, false},
		{"one kill", 1, 0, true},
		{"no new kill", 1, time.Second, false},
		{"three killed together: the first asks", 4, 2 * time.Second, true},
		{"the second", 4, 2*time.Second + 10*time.Millisecond, true},
		{"the third", 4, 2*time.Second + 20*time.Millisecond, true},
		{"a fourth has none left", 4, 2*time.Second + 30*time.Millisecond, false},
		{"two together, one of them in the background", 6, 3 * time.Second, true},
		{"a command that exits 137 much later", 6, time.Minute, false},
	} {
		if got := s.countOOMKillsLocked(step.n, start.Add(step.after)); got != step.want {
			t.Errorf("%s: counter %d: %v, want %v", step.name, step.n, got, step.want)
		}
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

func TestServedWorkspace(t *testing.T) {
	wd := t.TempDir()
	t.Chdir(wd)
	for _, tc := range []struct {
		configured, want string
	}{
		{"/srv/project", "/srv/project"},
		{"", wd},
	} {
		var cfg Config
		cfg.Session.Workspace = tc.configured
		if got, err := cfg.ServedWorkspace(); err != nil || got != tc.want {
			t.Errorf("ServedWorkspace with workspace %q = %q, %v; want %q", tc.configured, got, err, tc.want)
		}
	}
}

// TestCheckPrivate: a served workspace or granted mount source that holds
// one of sandboxd's own endpoints fails the start, before any session is
// refused for it.
func TestCheckPrivate(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	served, tools := filepath.Join(dir, "served"), filepath.Join(dir, "tools")
	for _, d := range []string{served, tools} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sock, token := filepath.Join(served, "sandboxd.sock"), filepath.Join(tools, "ahp-token")
	if err := os.WriteFile(token, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(served)
	for _, tc := range []struct {
		name      string
		workspace string
		mounts    []Mount
		private   []string
		fallback  bool
		want      string // "" passes
	}{
		{name: "none private", workspace: served},
		{name: "elsewhere", workspace: served, mounts: []Mount{{Source: tools, Target: "/tools"}}, private: []string{filepath.Join(dir, "sock")}},
		{name: "the configured workspace", workspace: served, private: []string{sock}, want: "workspace: \"" + served + "\" holds " + sock},
		{name: "the working directory", private: []string{sock}, want: "workspace: \"" + served + "\" holds " + sock},
		{name: "the host's root", workspace: "/", private: []string{sock}, want: "workspace: \"/\" is the host's root directory"},
		// wrap's editor names its sessions' directories: those sessions,
		// not the start, are refused.
		{name: "a fallback workspace", workspace: served, private: []string{sock}, fallback: true},
		{name: "a granted source", workspace: dir + "/missing", mounts: []Mount{{Source: tools, Target: "/tools", Mode: "ro"}}, private: []string{token},
			want: "session.mounts: source \"" + tools + "\" is or holds " + token},
		{name: "a granted file", workspace: served, mounts: []Mount{{Source: token, Target: "/t"}}, private: []string{token},
			want: "session.mounts: source \"" + token + "\" is or holds " + token},
		{name: "a grant of the host's /run", workspace: served, mounts: []Mount{{Source: "/run", Target: "/r", Mode: "ro"}},
			want: "session.mounts: source \"/run\" is or holds the host's /run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cfg Config
			cfg.Session.Workspace, cfg.Session.Mounts, cfg.Private, cfg.FallbackWorkspace = tc.workspace, tc.mounts, tc.private, tc.fallback
			err := cfg.checkSources("")
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("checkSources = %v, want %q", err, tc.want)
			}
		})
	}
	// NewManager checks before it reaches for the engine, here none.
	cli, err := client.New(client.WithHost("unix://" + filepath.Join(dir, "no-engine.sock")))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	var cfg Config
	cfg.Private = []string{sock}
	if _, err := NewManager(context.Background(), cli, cfg, slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil || !strings.Contains(err.Error(), "holds "+sock) {
		t.Errorf("NewManager = %v, want it to refuse the workspace that holds %s", err, sock)
	}
}

// TestGrantedMountsRefusePrivate: a granted source that is or holds one of
// sandboxd's own endpoints is refused at every session's start.
func TestGrantedMountsRefusePrivate(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		source string
		refuse bool
	}{
		{"the directory", dir, true},
		{"the file", token, true},
		{"elsewhere", t.TempDir(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := readyManager(t)
			m.cfg.Session.Mounts = []Mount{{Source: tc.source, Target: "/granted", Mode: "ro"}}
			m.cfg.Private = []string{token}
			_, _, err := newSession(m, "k", SessionSpec{ID: "s"}).grantedMounts()
			if tc.refuse != (err != nil) || tc.refuse && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), token)) {
				t.Errorf("grantedMounts of %s = %v, want refused: %v", tc.source, err, tc.refuse)
			}
		})
	}
}

// TestUserLinkOn: every link that resolving a path passes is looked at,
// also one inside another link's target or behind "..", and the first
// that is not root's is reported.
func TestUserLinkOn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make links of root's and of another user's")
	}
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	mkdir := func(p string) {
		if err := os.MkdirAll(filepath.Join(dir, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := func(p, target string, uid int) {
		if err := os.Symlink(target, filepath.Join(dir, p)); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(filepath.Join(dir, p), uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	mkdir("real/sub")
	mkdir("ws")
	link("ws/users", filepath.Join(dir, "real"), 1000)
	link("roots", filepath.Join(dir, "real"), 0)
	link("through", "ws/users/sub", 0)   // a root's link whose target passes a user's
	link("dotdot", "real/sub/../sub", 0) // ".." after a real directory
	link("back", "ws/users/../real", 0)  // ".." after a user's link
	link("loop", "loop", 0)
	for _, tc := range []struct {
		path, want string
	}{
		{"real/sub", ""},
		{"roots/sub", ""},
		{"dotdot", ""},
		{"ws/users", "ws/users"},
		{"ws/users/sub", "ws/users"},
		{"through", "ws/users"},
		{"back", "ws/users"},
		{"missing/users", ""},
	} {
		link, uid, err := userLinkOn(filepath.Join(dir, tc.path))
		want := ""
		if tc.want != "" {
			want = filepath.Join(dir, tc.want)
		}
		if err != nil || link != want || want != "" && uid != 1000 {
			t.Errorf("userLinkOn(%s) = %q, %d, %v; want %q of uid 1000", tc.path, link, uid, err, want)
		}
	}
	if _, _, err := userLinkOn(filepath.Join(dir, "loop")); err == nil {
		t.Error("userLinkOn of a link to itself: no error")
	}
	// A grant through a user's link is refused, naming the link.
	m := readyManager(t)
	m.cfg.Session.Mounts = []Mount{{Source: filepath.Join(dir, "ws/users/sub"), Target: "/granted", Mode: "ro"}}
	if _, _, err := newSession(m, "k", SessionSpec{ID: "s"}).grantedMounts(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), filepath.Join(dir, "ws/users")+" of uid 1000") {
		t.Errorf("grantedMounts through a user's link = %v, want it refused naming the link", err)
	}
	// At start, it is the fault of the setting, and said so.
	file := filepath.Join(dir, "sandbox.toml")
	text := fmt.Sprintf("[session]\nmounts = [{ source = %q, target = \"/granted\" }]\n", filepath.Join(dir, "ws/users/sub"))
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(sandboxd.DefaultConfig, file, 2)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Session.Workspace = filepath.Join(dir, "ws")
	if err := cfg.checkSources(""); err == nil || !strings.HasPrefix(err.Error(), file+":2: session.mounts: source ") {
		t.Errorf("checkSources with a grant through a user's link = %v, want it refused naming %s:2: session.mounts", err, file)
	}
}

// TestGrantedMountsRefuseTheHostsRuntime: a grant that is or holds the
// host's kernel or runtime directories, or the engine's socket, is refused
// at every session's start; one inside them is the operator's to make.
func TestGrantedMountsRefuseTheHostsRuntime(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "engine", "docker.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cli, err := client.New(client.WithHost("unix://" + sock))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		source string
		want   string // in the error; "" for none
	}{
		{"/", "the host's /proc"},
		{"/run", "the host's /run"},
		{"/dev", "the host's /dev"},
		{"/dev/null", ""},
		{"/sys/fs/cgroup", ""},
		{dir, "Docker Engine's socket"},
		{filepath.Dir(sock), "Docker Engine's socket"},
		{sock, "Docker Engine's socket"},
		{t.TempDir(), ""},
	} {
		t.Run(tc.source, func(t *testing.T) {
			if _, err := os.Stat(tc.source); err != nil {
				t.Skip(err)
			}
			m := readyManager(t)
			m.cli = cli
			m.cfg.Session.Mounts = []Mount{{Source: tc.source, Target: "/granted", Mode: "ro"}}
			_, _, err := newSession(m, "k", SessionSpec{ID: "s"}).grantedMounts()
			if tc.want == "" && err != nil || tc.want != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("grantedMounts of %s = %v, want %q", tc.source, err, tc.want)
			}
		})
	}
}

// TestGitMade: git metadata that appears in a session's directories while
// it runs is told apart from what protectGit found at the start.
func TestGitMade(t *testing.T) {
	m := readyManager(t)
	m.cfg.Session.ProtectGit = true
	ws := t.TempDir()
	for _, dir := range []string{"old/.git", "proj"} {
		if err := os.MkdirAll(filepath.Join(ws, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s := m.addReady("s", SessionSpec{ID: "s"})
	s.mountSources = []string{ws}
	seen, err := statGitMetadata(s.mountSources, nil, nil)
	if err != nil || len(seen) != 1 {
		t.Fatalf("found at the start: %v, %v", seen, err)
	}
	s.gitSeen, s.gitGuarded = seen, true
	if made := s.gitMade(); len(made) != 0 {
		t.Errorf("nothing made yet, gitMade = %q", made)
	}
	for _, dir := range []string{".git", "proj/.git"} {
		if err := os.Mkdir(filepath.Join(ws, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{filepath.Join(ws, ".git"), filepath.Join(ws, "proj/.git")}
	if made := s.gitMade(); !slices.Equal(made, want) {
		t.Errorf("gitMade = %q, want %q", made, want)
	}
	// A session whose start did not look (protect_git off, or nothing
	// showed the metadata writable) tells of nothing.
	s.gitGuarded = false
	if made := s.gitMade(); len(made) != 0 {
		t.Errorf("without protect_git, gitMade = %q", made)
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
