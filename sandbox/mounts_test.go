package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd"
)

func TestCheckMountSource(t *testing.T) {
	dir := t.TempDir()
	project := filepath.Join(dir, "project")
	sockDir := filepath.Join(dir, "engine")
	for _, d := range []string{project, sockDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sock := filepath.Join(sockDir, "docker.sock")
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(project, "to-run")
	if err := os.Symlink("/run", link); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		dir, want string // want: "" loads
	}{
		{project, ""},
		{"/", "host's root directory"},
		{"/run", "the host's /run"},
		{"/var/run", "the host's /run"},
		{"/proc/self/root", "host's root directory"},
		{"/proc/self", "the host's /proc"},
		{"/sys/fs/cgroup", "the host's /sys"},
		{"/dev/shm", "the host's /dev"},
		{link, "the host's /run"},
		{dir, "Docker Engine's socket"},
		{sockDir, "Docker Engine's socket"},
		{filepath.Join(dir, "missing"), "no such file"},
	}
	for _, tc := range tests {
		_, err := checkMountSource(tc.dir, sock, nil)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("checkMountSource(%q) = %v, want %q", tc.dir, err, tc.want)
		}
	}
}

// TestCheckMountSourceAllowsRemovableMedia: a project on a disk mounted
// under /run/media is a workspace like any other; the rest of /run is not.
func TestCheckMountSourceAllowsRemovableMedia(t *testing.T) {
	media, err := os.MkdirTemp("/run", "media-test-")
	if err != nil {
		t.Skipf("cannot make a directory in /run here: %v", err)
	}
	defer os.RemoveAll(media)
	if _, err := checkMountSource(media, "", nil); err == nil || !strings.Contains(err.Error(), "the host's /run") {
		t.Errorf("%s: err = %v, want it refused", media, err)
	}
	if _, err := os.Stat("/run/media"); os.IsNotExist(err) {
		if err := os.Mkdir("/run/media", 0o755); err != nil {
			t.Skipf("cannot make /run/media here: %v", err)
		}
		defer os.Remove("/run/media")
	}
	project, err := os.MkdirTemp("/run/media", "disk-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(project)
	if _, err := checkMountSource(project, "", nil); err != nil {
		t.Errorf("%s: %v, want it allowed", project, err)
	}
	if _, err := checkMountSource("/run/media", "", nil); err == nil {
		t.Error("/run/media itself allowed")
	}
}

// TestCheckMountSourceRefusesPrivate: a session directory that holds one
// of sandboxd's own endpoints is refused, the endpoint named as the host
// resolves it, also before it exists and when it is a link.
func TestCheckMountSourceRefusesPrivate(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	mk := func(p string) string {
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	served, other, cache := mk("served"), mk("other"), mk("cache")
	mk("served/sub")
	if err := os.Symlink(served, filepath.Join(dir, "alias")); err != nil {
		t.Fatal(err)
	}
	token := filepath.Join(served, "sub", "token")
	if err := os.WriteFile(token, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(token, filepath.Join(cache, "token-link")); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	for _, tc := range []struct {
		name    string
		dir     string
		private []string
		want    string // "" passes; else the endpoint named
	}{
		{"no endpoints", served, nil, ""},
		{"a socket not made yet", served, []string{filepath.Join(served, "sandboxd.sock")}, filepath.Join(served, "sandboxd.sock")},
		{"a socket named through a link", served, []string{filepath.Join(dir, "alias", "sandboxd.sock")}, filepath.Join(served, "sandboxd.sock")},
		{"a token whose directories are not made yet, through a link", served, []string{filepath.Join(dir, "alias", "cache", "sandboxd", "token")}, filepath.Join(served, "cache", "sandboxd", "token")},
		{"a relative socket", served, []string{"served/s.sock"}, filepath.Join(served, "s.sock")},
		{"a token deeper down", served, []string{token}, token},
		{"a token through a link elsewhere", served, []string{filepath.Join(cache, "token-link")}, token},
		{"the workspace named through a link", filepath.Join(dir, "alias"), []string{token}, token},
		{"the endpoint's own directory", filepath.Join(served, "sub"), []string{token}, token},
		{"elsewhere", other, []string{token, filepath.Join(served, "sandboxd.sock"), filepath.Join(cache, "token-link")}, ""},
		{"a name that only starts alike", other, []string{other + "x/sock"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := checkMountSource(tc.dir, "", tc.private)
			if tc.want == "" {
				if err != nil {
					t.Errorf("checkMountSource = %v, want it allowed", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "holds "+tc.want+", a file of sandboxd's own") {
				t.Errorf("checkMountSource = %v, want ErrInvalid naming %s", err, tc.want)
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

func TestStatUnlinked(t *testing.T) {
	dir := t.TempDir()
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := statUnlinked(real)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(real)
	if want := fi.Sys().(*syscall.Stat_t); st.Dev != want.Dev || st.Ino != want.Ino {
		t.Errorf("statUnlinked(%s) = %d:%d, want %d:%d", real, st.Dev, st.Ino, want.Dev, want.Ino)
	}
	// A link where a directory was checked is refused, never followed.
	link := filepath.Join(real, "sub")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	if _, err := statUnlinked(link); err == nil {
		t.Errorf("statUnlinked(%s), a link, = nil error", link)
	}
	if _, err := statUnlinked(filepath.Join(link, "x")); err == nil {
		t.Errorf("statUnlinked through a link = nil error")
	}
}
