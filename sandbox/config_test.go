package sandbox

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd"
)

func TestDefaultConfig(t *testing.T) {
	cfg, err := LoadConfig(sandboxd.DefaultConfig, "", 2)
	if err != nil {
		t.Fatalf("embedded default does not load: %v", err)
	}
	s := cfg.Session
	checks := []struct {
		name      string
		got, want any
	}{
		{"image", s.Image, "sandboxd/base:1"},
		{"cpus", float64(s.CPUs), 1.0},
		{"memory", int64(s.Memory), int64(1 << 30)},
		{"pids", int64(s.Pids), int64(256)},
		{"network", s.Network, "none"},
		{"user", s.User, ""},
		{"fallback user", s.FallbackUser, "65534:65534"},
		{"readonly", s.ReadonlyRootfs, true},
		{"cap drop", strings.Join(s.CapDrop, ","), "ALL"},
		{"no new privileges", s.NoNewPrivileges, true},
		{"init", s.Init, true},
		{"output limit", int64(cfg.Terminal.OutputByteLimit), int64(1 << 20)},
		{"kill grace", time.Duration(cfg.Terminal.KillGrace), 2 * time.Second},
		{"max sessions", int(cfg.Server.MaxSessions), 16},
		{"idle timeout", time.Duration(cfg.Server.IdleTimeout), 30 * time.Minute},
		{"max output memory", int64(cfg.Server.MaxOutputMemory), int64(1 << 30)},
		{"memory budget", cfg.Server.MemoryBudget, MemoryBudget{Percent: 75}},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestConfigOverridesAndErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name    string
		text    string
		hostCPU int
		wantErr string // "" means it loads
		msg     string // in the error too, when set
		check   func(t *testing.T, c Config)
	}{
		{name: "numbers and strings both work", text: "[session]\ncpus = 1.5\nmemory = 536870912\npids = \"128\"\n", hostCPU: 2,
			check: func(t *testing.T, c Config) {
				if c.Session.CPUs != 1.5 || c.Session.Memory != 512<<20 || c.Session.Pids != 128 {
					t.Errorf("got %+v", c.Session)
				}
			}},
		{name: "unset keys keep defaults", text: "[terminal]\nkill_grace = \"5s\"\n", hostCPU: 2,
			check: func(t *testing.T, c Config) {
				if c.Session.Image != "sandboxd/base:1" || time.Duration(c.Terminal.KillGrace) != 5*time.Second {
					t.Errorf("got %+v", c)
				}
			}},
		{name: "negative memory", text: "[session]\nmemory = \"-1g\"\n", hostCPU: 2, wantErr: ":2: session.memory"},
		{name: "memory budget as a size", text: "[server]\nmemory_budget = \"20GiB\"\n", hostCPU: 2,
			check: func(t *testing.T, c Config) {
				if b := c.Server.MemoryBudget; b.Of(1<<40) != 20<<30 || b.String() != "20GiB" {
					t.Errorf("got %+v", b)
				}
			}},
		{name: "memory budget as a share", text: "[server]\nmemory_budget = \"50%\"\n", hostCPU: 2,
			check: func(t *testing.T, c Config) {
				if b := c.Server.MemoryBudget; b.Of(24<<30) != 12<<30 || b.Of(0) != 0 || b.String() != "50%" {
					t.Errorf("got %+v", b)
				}
			}},
		{name: "no memory budget", text: "[server]\nmemory_budget = 0\n", hostCPU: 2, wantErr: ":2: server.memory_budget", msg: "greater than zero"},
		{name: "memory budget over the host", text: "[server]\nmemory_budget = \"150%\"\n", hostCPU: 2, wantErr: ":2: server.memory_budget", msg: "at most 100"},
		{name: "memory budget of no share", text: "[server]\nmemory_budget = \"0%\"\n", hostCPU: 2, wantErr: ":2: server.memory_budget", msg: "above 0"},
		{name: "zero memory", text: "[session]\nmemory = 0\n", hostCPU: 2, wantErr: ":2: session.memory"},
		{name: "cpus above host", text: "[session]\ncpus = 3\n", hostCPU: 2, wantErr: ":2: session.cpus"},
		{name: "pids below 8", text: "\n[session]\npids = 7\n", hostCPU: 2, wantErr: ":3: session.pids"},
		{name: "default above max", text: "[session]\npids = 2000\n", hostCPU: 2, wantErr: ":2: session.pids"},
		{name: "max below the default", text: "[session.max]\nmemory = \"512MiB\"\n", hostCPU: 2, wantErr: ":2: session.max.memory"},
		{name: "header with a comment", text: "[session] # mine\nnetwork = \"host\"\n", hostCPU: 2, wantErr: ":2: session.network"},
		{name: "unknown key", text: "[session]\nimage = \"x\"\nnetwrok = \"none\"\n", hostCPU: 2, wantErr: ":3: session.netwrok"},
		{name: "host network", text: "[session]\nnetwork = \"host\"\n", hostCPU: 2, wantErr: ":2: session.network"},
		{name: "root user", text: "[session]\nuser = \"0:0\"\n", hostCPU: 2, wantErr: ":2: session.user"},
		{name: "root user with leading zeros", text: "[session]\nuser = \"00:0\"\n", hostCPU: 2, wantErr: ":2: session.user"},
		{name: "root fallback user", text: "[session]\nfallback_user = \"000:1000\"\n", hostCPU: 2, wantErr: ":2: session.fallback_user"},
		{name: "uid beyond 32 bits", text: "[session]\nuser = \"4294967296:1000\"\n", hostCPU: 2, wantErr: ":2: session.user"},
		{name: "uid beyond what the engine takes", text: "[session]\nuser = \"2147483648:1000\"\n", hostCPU: 2, wantErr: ":2: session.user", msg: "at most 2147483647"},
		{name: "fallback gid beyond what the engine takes", text: "[session]\nfallback_user = \"65534:4294967294\"\n", hostCPU: 2, wantErr: ":2: session.fallback_user", msg: "at most 2147483647"},
		{name: "the largest uid and gid the engine takes", text: "[session]\nuser = \"2147483647:2147483647\"\n", hostCPU: 2,
			check: func(t *testing.T, c Config) {
				if c.Session.User != "2147483647:2147483647" {
					t.Errorf("user = %q", c.Session.User)
				}
			}},
		{name: "pids above the kernel's maximum", text: "[session]\npids = 4194305\n[session.max]\npids = 4194305\n", hostCPU: 2, wantErr: ":2: session.pids", msg: "kernel's maximum of 4194304"},
		{name: "max pids leaving no room for a kill", text: "[session.max]\npids = 4194304\n", hostCPU: 2, wantErr: ":2: session.max.pids", msg: "a kill borrows 16"},
		{name: "pids leaving no room for a kill", text: "[session]\npids = 4194289\n[session.max]\npids = 4194289\n", hostCPU: 2, wantErr: ":2: session.pids", msg: "above 4194288"},
		{name: "the most pids a kill can borrow above", text: "[session]\npids = 4194288\n[session.max]\npids = 4194288\n", hostCPU: 2,
			check: func(t *testing.T, c Config) {
				if c.Session.Pids != 4194288 || c.Session.Max.Pids != 4194288 {
					t.Errorf("pids %d, max %d", c.Session.Pids, c.Session.Max.Pids)
				}
			}},
		{name: "user with leading zeros", text: "[session]\nuser = \"01000:1000\"\n", hostCPU: 2,
			check: func(t *testing.T, c Config) {
				if c.Session.User != "01000:1000" {
					t.Errorf("user = %q", c.Session.User)
				}
			}},
		{name: "one-CPU host runs the defaults", text: "[terminal]\nkill_grace = \"1s\"\n", hostCPU: 1,
			check: func(t *testing.T, c Config) {
				if c.Session.Max.CPUs != 1 || c.Session.CPUs != 1 {
					t.Errorf("cpus %v, max %v, want 1 and 1", c.Session.CPUs, c.Session.Max.CPUs)
				}
			}},
		{name: "max cpus set above a one-CPU host", text: "[session.max]\ncpus = 2\n", hostCPU: 1, wantErr: ":2: session.max.cpus"},
		{name: "user without gid", text: "[session]\nuser = \"1000\"\n", hostCPU: 2, wantErr: ":2: session.user"},
		{name: "relative workspace", text: "[session]\nworkspace = \"src\"\n", hostCPU: 2, wantErr: ":2: session.workspace"},
		{name: "bad workspace mode", text: "[session]\nworkspace_mode = \"rwx\"\n", hostCPU: 2, wantErr: ":2: session.workspace_mode"},
		{name: "scratch at root", text: "[session]\nscratch = [\"/\"]\n", hostCPU: 2, wantErr: ":2: session.scratch"},
		{name: "bad duration", text: "[terminal]\nkill_grace = 5\n", hostCPU: 2, wantErr: ":2: terminal.kill_grace"},
		{name: "output limit above its max", text: "[terminal]\noutput_byte_limit = \"32MiB\"\n", hostCPU: 2, wantErr: ":2: terminal.output_byte_limit"},
		{name: "zero sessions", text: "[server]\nmax_sessions = 0\n", hostCPU: 2, wantErr: ":2: server.max_sessions"},
		{name: "output memory below one terminal's", text: "[server]\nmax_output_memory = \"8MiB\"\n", hostCPU: 2, wantErr: ":2: server.max_output_memory"},
		{name: "wrong type", text: "[session]\nimage = 5\n", hostCPU: 2, wantErr: ":2: session.image"},
		{name: "syntax error", text: "[session\n", hostCPU: 2, wantErr: ":2"},
		{name: "root group", text: "[session]\nuser = \"1000:0\"\n", hostCPU: 2, wantErr: ":2: session.user", msg: "gid 0 (root's group)"},
		{name: "root group with leading zeros", text: "[session]\nfallback_user = \"65534:00\"\n", hostCPU: 2, wantErr: ":2: session.fallback_user", msg: "gid 0"},
		{name: "blank image", text: "[session]\nimage = \" \\t\"\n", hostCPU: 2, wantErr: ":2: session.image", msg: "blank"},
		{name: "scratch twice", text: "[session]\nscratch = [\"/tmp\", \"/tmp/\"]\n", hostCPU: 2, wantErr: ":2: session.scratch", msg: `"/tmp" and "/tmp/" are the same path`},
		{name: "scratch at root, written long", text: "[session]\nscratch = [\"/tmp/..\"]\n", hostCPU: 2, wantErr: ":2: session.scratch"},
		{name: "scratch in proc", text: "[session]\nscratch = [\"/proc/x\"]\n", hostCPU: 2, wantErr: ":2: session.scratch", msg: "under /proc"},
		{name: "scratch at sys", text: "[session]\nscratch = [\"/sys/\"]\n", hostCPU: 2, wantErr: ":2: session.scratch", msg: "under /sys"},
		{name: "scratch in dev", text: "[session]\nscratch = [\"/dev/shm\"]\n", hostCPU: 2, wantErr: ":2: session.scratch", msg: "under /dev"},
		{name: "scratch paths cleaned", text: "[session]\nscratch = [\"/tmp/\", \"/procfs\", \"/srv//x\"]\n", hostCPU: 2,
			check: func(t *testing.T, c Config) {
				if want := []string{"/tmp", "/procfs", "/srv/x"}; !slices.Equal(c.Session.Scratch, want) {
					t.Errorf("scratch = %q, want %q", c.Session.Scratch, want)
				}
			}},
		{name: "mount at root", text: "[session]\nmounts = [{ source = \"/opt\", target = \"/\" }]\n", hostCPU: 2, wantErr: ":2: session.mounts", msg: "must not be /"},
		{name: "mount at proc", text: "[session]\nmounts = [{ source = \"/opt\", target = \"/proc\" }]\n", hostCPU: 2, wantErr: ":2: session.mounts", msg: "under /proc"},
		{name: "mount in sys", text: "[session]\nmounts = [{ source = \"/opt\", target = \"/sys/fs/x\" }]\n", hostCPU: 2, wantErr: ":2: session.mounts", msg: "under /sys"},
		{name: "mount in dev", text: "[session]\nmounts = [{ source = \"/opt\", target = \"/dev/shm/\" }]\n", hostCPU: 2, wantErr: ":2: session.mounts", msg: "under /dev"},
		{name: "mount target with a NUL byte", text: "[session]\nmounts = [{ source = \"/opt\", target = \"/opt/a\\u0000b\" }]\n", hostCPU: 2, wantErr: ":2: session.mounts", msg: "NUL byte"},
		{name: "mount source with a NUL byte", text: "[session]\nmounts = [{ source = \"/opt\\u0000\", target = \"/opt\" }]\n", hostCPU: 2, wantErr: ":2: session.mounts", msg: "NUL byte"},
		{name: "relative mount target", text: "[session]\nmounts = [{ source = \"/opt\", target = \"opt\" }]\n", hostCPU: 2, wantErr: ":2: session.mounts", msg: "absolute"},
		{name: "scratch with a NUL byte", text: "[session]\nscratch = [\"/tmp\\u0000\"]\n", hostCPU: 2, wantErr: ":2: session.scratch", msg: "NUL byte"},
		{name: "mount next to proc", text: "[session]\nmounts = [{ source = \"/opt\", target = \"/procfs\" }]\n", hostCPU: 2,
			check: func(t *testing.T, c Config) {
				if got := c.Session.Mounts[0].Target; got != "/procfs" {
					t.Errorf("target = %q", got)
				}
			}},
		{name: "mount on a scratch path", text: "[session]\nmounts = [{ source = \"/opt\", target = \"/tmp/\" }]\n", hostCPU: 2, wantErr: ":2: session.mounts", msg: "also a scratch path"},
		{name: "mount below a scratch path", text: "[session]\nmounts = [{ source = \"/opt/tools\", target = \"/home/tools/\", mode = \"ro\" }]\n", hostCPU: 2,
			check: func(t *testing.T, c Config) {
				if got := c.Session.Mounts[0].Target; got != "/home/tools" {
					t.Errorf("target = %q, want it cleaned", got)
				}
			}},
		{name: "kill grace at its maximum", text: "[terminal]\nkill_grace = \"5m\"\n", hostCPU: 2,
			check: func(t *testing.T, c Config) {
				if time.Duration(c.Terminal.KillGrace) != 5*time.Minute {
					t.Errorf("kill grace = %v", time.Duration(c.Terminal.KillGrace))
				}
			}},
		{name: "kill grace above its maximum", text: "[terminal]\nkill_grace = \"5m1s\"\n", hostCPU: 2, wantErr: ":2: terminal.kill_grace", msg: "above the maximum of 5m0s"},
		{name: "capabilities as the engine takes them", text: "[session]\ncap_drop = [\"all\", \"NET_RAW\", \"cap_sys_admin\", \"CAP_CHECKPOINT_RESTORE\"]\n", hostCPU: 2,
			check: func(t *testing.T, c Config) {
				if len(c.Session.CapDrop) != 4 {
					t.Errorf("cap_drop = %q", c.Session.CapDrop)
				}
			}},
		{name: "unknown capability", text: "[session]\ncap_drop = [\"NET_RAW\", \"NET_RAWR\"]\n", hostCPU: 2, wantErr: ":2: session.cap_drop", msg: `"NET_RAWR" is not a Linux capability`},
		{name: "key in another case", text: "[session]\nCPUS = \"1\"\n", hostCPU: 2, wantErr: ":2: session.CPUS", msg: "lower case"},
		{name: "table in another case", text: "\n[Session]\ncpus = \"1\"\n", hostCPU: 2, wantErr: ":2: Session", msg: "lower case"},
		{name: "a mode in two cases", text: "[session]\nmounts = [{ source = \"/opt\", target = \"/o\", mode = \"ro\", MODE = \"rw\" }]\n", hostCPU: 2, wantErr: ":2: session.mounts.MODE", msg: "lower case"},
		{name: "dotted key at the top", text: "\nsession.cpus = \"5\"\n", hostCPU: 2, wantErr: ":2: session.cpus"},
		{name: "dotted key in a table", text: "[session]\n\nmax.cpus = \"9\"\n", hostCPU: 2, wantErr: ":3: session.max.cpus"},
		{name: "quoted key", text: "[session]\n\"cpus\" = \"9\"\n", hostCPU: 2, wantErr: ":2: session.cpus"},
		{name: "max below the default, dotted", text: "[session]\nmax.memory = \"512MiB\"\n", hostCPU: 2, wantErr: ":2: session.max.memory"},
		{name: "unknown member of an inline table", text: "[session]\nmounts = [{ source = \"/opt\", target = \"/o\", readonly = true }]\n", hostCPU: 2, wantErr: ":2: session.mounts.readonly"},
		{name: "unknown table", text: "\n[bogus]\ny = 2\n", hostCPU: 2, wantErr: ":2: bogus"},
		{name: "bad mount as an array of tables", text: "[[session.mounts]]\nsource = \"/opt\"\ntarget = \"/\"\n", hostCPU: 2, wantErr: ":1: session.mounts", msg: "must not be /"},
		{name: "two mounts at one target", text: "[session]\nmounts = [{ source = \"/opt\", target = \"/x\" }, { source = \"/srv\", target = \"/x/\" }]\n", hostCPU: 2, wantErr: ":2: session.mounts", msg: `"/x" and "/x/" are the same path`},
		{name: "pids as a float", text: "[session]\npids = 1e2\n", hostCPU: 2, wantErr: ":2: session.pids", msg: "whole number"},
		{name: "memory as a float", text: "[session]\nmemory = 1073741824.7\n", hostCPU: 2, wantErr: ":2: session.memory", msg: "whole number"},
		{name: "a count as a float", text: "[terminal]\nmax_terminals = 1e2\n", hostCPU: 2, wantErr: ":2: terminal.max_terminals", msg: "whole number"},
		{name: "capability prefix alone", text: "[session]\ncap_drop = [\"CAP_\"]\n", hostCPU: 2, wantErr: ":2: session.cap_drop"},
		{name: "an image that is no reference", text: "[session]\nimage = \"My Image\"\n", hostCPU: 2, wantErr: ":2: session.image", msg: "not an image reference"},
		{name: "an allowed image that is no reference", text: "[session]\nimages = [\"sandboxd/base:1\", \"\"]\n", hostCPU: 2, wantErr: ":2: session.images", msg: "not an image reference"},
		{name: "images by digest, id and name", text: "[session]\nimage = \"sha256:" + strings.Repeat("ab", 32) + "\"\nimages = [\"golang:1.22@sha256:" + strings.Repeat("cd", 32) + "\", \"" + strings.Repeat("ef", 32) + "\", \"registry.example:5000/team/tool\"]\n", hostCPU: 2,
			check: func(t *testing.T, c Config) {
				if len(c.Session.Images) != 3 {
					t.Errorf("images = %q", c.Session.Images)
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".toml")
			if err := os.WriteFile(file, []byte(tc.text), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg, err := LoadConfig(sandboxd.DefaultConfig, file, tc.hostCPU)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("LoadConfig: %v", err)
				}
				tc.check(t, cfg)
				return
			}
			if err == nil || !strings.Contains(err.Error(), file+tc.wantErr) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("err = %v, want it to contain %q and %q", err, file+tc.wantErr, tc.msg)
			}
		})
	}
}

func TestDefaultConfigOnOneCPU(t *testing.T) {
	cfg, err := LoadConfig(sandboxd.DefaultConfig, "", 1)
	if err != nil {
		t.Fatalf("embedded default on a one-CPU host: %v", err)
	}
	if cfg.Session.Max.CPUs != 1 {
		t.Errorf("session.max.cpus = %v, want the host's 1", cfg.Session.Max.CPUs)
	}
}

// TestConfigOthersMayChange: a file that another user could change is
// refused, so that they cannot choose what sandboxes see.
func TestConfigOthersMayChange(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sandbox.toml")
	if err := os.WriteFile(file, []byte("[session]\ncpus = 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(file, 0o646); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(sandboxd.DefaultConfig, file, 2); err == nil || !strings.Contains(err.Error(), "writable by others") {
		t.Errorf("LoadConfig of a file anyone may write = %v, want it refused", err)
	}
	// A pipe (`--config <(...)`) is read as it is.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w.WriteString("[session]\ncpus = 1.5\n")
	w.Close()
	cfg, err := LoadConfig(sandboxd.DefaultConfig, fmt.Sprintf("/proc/self/fd/%d", r.Fd()), 2)
	if err != nil || cfg.Session.CPUs != 1.5 {
		t.Errorf("LoadConfig of a pipe = %v, cpus %v; want 1.5", err, cfg.Session.CPUs)
	}
}

func TestConfigMissingFile(t *testing.T) {
	_, err := LoadConfig(sandboxd.DefaultConfig, filepath.Join(t.TempDir(), "nope.toml"), 2)
	if err == nil || !strings.Contains(err.Error(), "nope.toml") {
		t.Errorf("err = %v", err)
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

func TestAddMount(t *testing.T) {
	cfg, err := LoadConfig(sandboxd.DefaultConfig, "", 2)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	granted := []Mount{{Source: dir, Target: "/opt/x", Mode: "ro"}}
	cfg.Session.Mounts = granted
	tests := []struct {
		name string
		m    Mount
		want string // in the error; "" for none
	}{
		{"ok", Mount{Source: dir, Target: "/data", Mode: "rw", Origin: "-v"}, ""},
		{"same target as the configuration's", Mount{Source: dir, Target: "/opt/x/", Mode: "rw", Origin: "-v m"}, `targets "/opt/x" and "/opt/x/" are the same path`},
		{"missing source", Mount{Source: filepath.Join(dir, "nope"), Target: "/data", Mode: "rw", Origin: "-v m"}, "nope\": no such file or directory"},
		{"host directory", Mount{Source: "/sys", Target: "/data", Mode: "ro", Origin: "-v m"}, `source "/sys" is or holds the host's /sys`},
		{"relative target", Mount{Source: dir, Target: "data", Mode: "ro", Origin: "-v m"}, "must be an absolute path"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			err := c.AddMount(tc.m, "")
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want == "":
				if len(c.Session.Mounts) != 2 || c.Session.Mounts[1] != tc.m {
					t.Errorf("mounts %+v, want the configuration's and %+v", c.Session.Mounts, tc.m)
				}
			case err == nil || !strings.Contains(err.Error(), tc.want):
				t.Errorf("AddMount: %v, want %q", err, tc.want)
			case len(c.Session.Mounts) != 1:
				t.Errorf("a refused mount was added: %+v", c.Session.Mounts)
			}
			if strings.HasPrefix(fmt.Sprint(err), "session.mounts") {
				t.Errorf("error %q names the setting, not what granted the mount", err)
			}
		})
	}
	if len(granted) != 1 || len(cfg.Session.Mounts) != 1 {
		t.Errorf("the configuration's mounts changed: %+v", cfg.Session.Mounts)
	}
}

// TestAddMountRefusesWritableGitMetadata: the workspace's git metadata,
// or what is in it, granted writable elsewhere would have no read-only
// mount over it there.
func TestAddMountRefusesWritableGitMetadata(t *testing.T) {
	ws := t.TempDir()
	hooks := filepath.Join(ws, ".git", "hooks")
	if err := os.MkdirAll(hooks, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		source, mode string
		protect      bool
		refused      bool
	}{
		{filepath.Join(ws, ".git"), "rw", true, true},
		{hooks, "rw", true, true},
		{hooks, "ro", true, false},
		{hooks, "rw", false, false},
		{ws, "rw", true, false}, // protectGit mounts .git read-only at its target
	} {
		cfg, err := LoadConfig(sandboxd.DefaultConfig, "", 2)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Session.Workspace, cfg.Session.ProtectGit = ws, tc.protect
		err = cfg.AddMount(Mount{Source: tc.source, Target: "/g", Mode: tc.mode}, "")
		if refused := err != nil && strings.Contains(err.Error(), "is git metadata of the workspace"); refused != tc.refused {
			t.Errorf("%s:%s with protect_git %v: %v, want refused %v", tc.source, tc.mode, tc.protect, err, tc.refused)
		}
	}
}

// TestAddMountRefusesAWorktreesGitDirectory: the git directory a
// worktree's .git names, beside the workspace, is its metadata too.
func TestAddMountRefusesAWorktreesGitDirectory(t *testing.T) {
	dir := t.TempDir()
	main := filepath.Join(dir, "main", ".git")
	gitdir := filepath.Join(main, "worktrees", "wt")
	for _, d := range []string{filepath.Join(main, "objects"), filepath.Join(main, "refs"), gitdir, filepath.Join(dir, "wt")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, text := range map[string]string{
		filepath.Join(main, "HEAD"):        "ref: refs/heads/main\n",
		filepath.Join(gitdir, "HEAD"):      "ref: refs/heads/wt\n",
		filepath.Join(gitdir, "commondir"): "../..\n",
		filepath.Join(dir, "wt", ".git"):   "gitdir: " + gitdir + "\n",
	} {
		if err := os.WriteFile(name, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		source  string
		refused bool
	}{
		{main, true},
		{filepath.Join(main, "hooks"), true},
		{filepath.Dir(main), false}, // protectGit mounts its .git read-only
	} {
		if err := os.MkdirAll(tc.source, 0o755); err != nil {
			t.Fatal(err)
		}
		cfg, err := LoadConfig(sandboxd.DefaultConfig, "", 2)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Session.Workspace = filepath.Join(dir, "wt")
		err = cfg.AddMount(Mount{Source: tc.source, Target: "/g", Mode: "rw"}, "")
		if refused := err != nil && strings.Contains(err.Error(), "is git metadata of the workspace"); refused != tc.refused {
			t.Errorf("%s: %v, want refused %v", tc.source, err, tc.refused)
		}
	}
}
