package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/api/types/mount"

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

// TestCommandCheck: what the engine's API cannot carry, or a shell would
// read as something else, is refused before the engine is asked.
func TestCommandCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		cmd  Command
		want string // in the error; "" for none
	}{
		{"plain", Command{Command: "ls", Args: []string{"-l"}, Cwd: "/w"}, ""},
		{"no command", Command{}, "command: must not be empty"},
		{"an option for a command", Command{Command: "-x"}, "starts with '-'"},
		{"a NUL in an argument", Command{Command: "ls", Args: []string{"a\x00b"}}, "args[0]: contains a NUL byte"},
		{"a cwd not UTF-8", Command{Command: "ls", Cwd: "/w/caf\xe9"}, "cwd: \"/w/caf\\xe9\" holds bytes that are not UTF-8"},
		{"an environment name not UTF-8", Command{Command: "ls", Env: []EnvVar{{Name: "A\xff", Value: "1"}}}, "env[0]"},
	} {
		err := tc.cmd.Check()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestCommandArgv(t *testing.T) {
	tests := []struct {
		cmd  Command
		want []string
	}{
		{Command{Command: "ls"}, []string{"ls"}},
		{Command{Command: "ls", Args: []string{"-la", "a b"}}, []string{"ls", "-la", "a b"}},
		{Command{Command: "ls -la"}, []string{"/bin/sh", "-c", "ls -la"}},
		{Command{Command: "make && make test"}, []string{"/bin/sh", "-c", "make && make test"}},
		{Command{Command: "/usr/bin/env"}, []string{"/usr/bin/env"}},
		// With args the command is a program name, whatever it contains.
		{Command{Command: "my prog", Args: []string{"x"}}, []string{"my prog", "x"}},
	}
	for _, tc := range tests {
		if got := tc.cmd.Argv(); strings.Join(got, "\x00") != strings.Join(tc.want, "\x00") {
			t.Errorf("%+v.Argv() = %q, want %q", tc.cmd, got, tc.want)
		}
	}
}

func TestCommandExecArgv(t *testing.T) {
	tests := []struct {
		name   string
		cmd    Command
		reaper bool
		want   []string
	}{
		{"merged streams", Command{Command: "ls"}, false, []string{"/bin/sh", "-c", mergeStderr, "sh", "ls"}},
		{"merged streams, reaper", Command{Command: "ls"}, true, []string{reaperPath, "-s", "--", "/bin/sh", "-c", mergeStderr, "sh", "ls"}},
		{"tty", Command{Command: "bash", TTY: true}, false, []string{"bash"}},
		{"tty, reaper", Command{Command: "bash", TTY: true}, true, []string{reaperPath, "-s", "--", "bash"}},
		{"tty of a size, sized from inside", Command{Command: "bash", TTY: true, Cols: 120, Rows: 50}, true, []string{reaperPath, "-s", "--", "/bin/sh", "-c", ttySize, "sh", "50", "120", "bash"}},
		{"streams apart, reaper", Command{Command: "ls", Stdout: io.Discard, Stderr: io.Discard}, true, []string{reaperPath, "-s", "--", "ls"}},
	}
	for _, tc := range tests {
		if got := tc.cmd.execArgv(tc.reaper, true); !slices.Equal(got, tc.want) {
			t.Errorf("%s: execArgv = %q, want %q", tc.name, got, tc.want)
		}
	}
	// An engine that takes the size given with the exec needs no shell
	// in front.
	sized := Command{Command: "bash", TTY: true, Cols: 120, Rows: 50}
	if got, want := sized.execArgv(true, false), []string{reaperPath, "-s", "--", "bash"}; !slices.Equal(got, want) {
		t.Errorf("tty of a size on API 1.42: execArgv = %q, want %q", got, want)
	}
}

func TestParseOOMKills(t *testing.T) {
	tests := []struct {
		text string
		want int64
	}{
		{"oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", 3},
		{"low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\noom_group_kill 0\n", 2},
		{"", 0},
		{"oom_kill x\n", 0},
	}
	for _, tc := range tests {
		if got := parseOOMKills([]byte(tc.text)); got != tc.want {
			t.Errorf("parseOOMKills(%q) = %d, want %d", tc.text, got, tc.want)
		}
	}
}

func TestExitCode(t *testing.T) {
	code := func(n int) *int { return &n }
	sig := func(s string) *string { return &s }
	tests := []struct {
		st   ExitStatus
		want int
	}{
		{ExitStatus{ExitCode: code(0)}, 0},
		{ExitStatus{ExitCode: code(3)}, 3},
		{ExitStatus{Signal: sig("SIGKILL")}, 137},
		{ExitStatus{Signal: sig("SIGTERM")}, 143},
		{ExitStatus{Signal: sig("SIG10")}, 138},
		{ExitStatus{}, 255},
	}
	for _, tc := range tests {
		if got := ExitCode(tc.st); got != tc.want {
			t.Errorf("ExitCode(%+v) = %d, want %d", tc.st, got, tc.want)
		}
	}
}

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

func TestPlanBinds(t *testing.T) {
	for _, tc := range []struct {
		name             string
		targets, sources []string
		devs             []uint64
		want             []bind
		err              string
	}{
		{name: "apart", targets: []string{"/w", "/x"}, sources: []string{"/w", "/real/x"},
			want: []bind{{"/w", "/w"}, {"/real/x", "/x"}}},
		{name: "siblings with a shared prefix", targets: []string{"/w", "/wx"}, sources: []string{"/w", "/wx"},
			want: []bind{{"/w", "/w"}, {"/wx", "/wx"}}},
		{name: "extra inside the workspace", targets: []string{"/w", "/w/sub"}, sources: []string{"/real/w", "/real/w/sub"},
			want: []bind{{"/real/w", "/w"}}},
		{name: "workspace inside an extra", targets: []string{"/a/b", "/a"}, sources: []string{"/a/b", "/a"},
			want: []bind{{"/a", "/a"}}},
		{name: "three deep", targets: []string{"/a/b/c", "/a/b", "/a"}, sources: []string{"/a/b/c", "/a/b", "/a"},
			want: []bind{{"/a", "/a"}}},
		{name: "the same twice", targets: []string{"/w", "/w"}, sources: []string{"/w", "/w"},
			want: []bind{{"/w", "/w"}}},
		// A nested directory on a filesystem of its own is not shown by
		// the outer mount, which is not recursive.
		{name: "nested on another filesystem", targets: []string{"/w", "/w/data"}, sources: []string{"/w", "/w/data"}, devs: []uint64{1, 2},
			want: []bind{{"/w", "/w"}, {"/w/data", "/w/data"}}},
		{name: "nested on the same filesystem", targets: []string{"/w", "/w/sub"}, sources: []string{"/w", "/w/sub"}, devs: []uint64{1, 1},
			want: []bind{{"/w", "/w"}}},
		{name: "three deep, the middle its own", targets: []string{"/a/b/c", "/a/b", "/a"}, sources: []string{"/a/b/c", "/a/b", "/a"}, devs: []uint64{2, 2, 1},
			want: []bind{{"/a/b", "/a/b"}, {"/a", "/a"}}},
		{name: "nested through a link", targets: []string{"/w", "/w/link"}, sources: []string{"/w", "/elsewhere"},
			err: `"/w/link" lies inside "/w", which is mounted too, but resolves to /elsewhere`},
		{name: "workspace through a link in an extra", targets: []string{"/a/proj", "/a"}, sources: []string{"/a/real/proj", "/a"},
			err: `"/a/proj" lies inside "/a"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := planBinds(tc.targets, tc.sources, tc.devs)
			if tc.err != "" {
				if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("planBinds = %v, %v; want an ErrInvalid containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("planBinds = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// TestValidateSpecLeavesTheCallersDirsAlone: the spec's directories are
// cleaned in a copy; the caller's slice may be read meanwhile.
func TestValidateSpecLeavesTheCallersDirsAlone(t *testing.T) {
	cfg, err := LoadConfig(sandboxd.DefaultConfig, "", 2)
	if err != nil {
		t.Fatal(err)
	}
	dirs := []string{"/w/extra/../other/"}
	spec, err := ValidateSpec(cfg, 2, SessionSpec{ID: "s", Workspace: "/w", ExtraDirs: dirs})
	if err != nil {
		t.Fatal(err)
	}
	if spec.ExtraDirs[0] != "/w/other" || dirs[0] != "/w/extra/../other/" {
		t.Errorf("ExtraDirs = %q, the caller's = %q; want it cleaned in a copy only", spec.ExtraDirs, dirs)
	}
}

// TestScratchGivesWayToTheWorkspace: a workspace at or above a scratch
// path (`cd /tmp && sandboxd run ...`) is shown there, not hidden by a
// tmpfs; other scratch paths stay.
func TestScratchGivesWayToTheWorkspace(t *testing.T) {
	cfg, err := LoadConfig(sandboxd.DefaultConfig, "", 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		workspace string
		without   []string
	}{
		{"/work/proj", nil},
		{"/tmp", []string{"/tmp"}},
		{"/var", []string{"/var/tmp"}},
		{"/tmp/proj", nil},
	} {
		_, host := containerConfig(cfg.Session, SessionSpec{Workspace: tc.workspace}, []bind{{tc.workspace, tc.workspace}}, nil, "1000:1000", nil)
		for _, p := range cfg.Session.Scratch {
			_, has := host.Tmpfs[p]
			if want := !slices.Contains(tc.without, p); has != want {
				t.Errorf("workspace %s: tmpfs at %s = %v, want %v", tc.workspace, p, has, want)
			}
		}
	}
}

func TestSessionUser(t *testing.T) {
	c := SessionConfig{FallbackUser: "65534:65534"}
	tests := []struct {
		name       string
		configured string
		owner      *syscall.Stat_t
		want       string
	}{
		{"configured", "1000:1000", &syscall.Stat_t{Uid: 1001, Gid: 1001}, "1000:1000"},
		{"the workspace's owner", "", &syscall.Stat_t{Uid: 1001, Gid: 1002}, "1001:1002"},
		{"root owns the workspace", "", &syscall.Stat_t{Uid: 0, Gid: 0}, "65534:65534"},
		{"root's group owns it", "", &syscall.Stat_t{Uid: 1001, Gid: 0}, "1001:65534"},
		{"an owner the engine cannot run as", "", &syscall.Stat_t{Uid: 4294967294, Gid: 1001}, "65534:65534"},
		{"a group the engine cannot run as", "", &syscall.Stat_t{Uid: 1001, Gid: 2147483648}, "1001:65534"},
		{"the largest owner the engine takes", "", &syscall.Stat_t{Uid: 2147483647, Gid: 2147483647}, "2147483647:2147483647"},
		{"no workspace", "", nil, "65534:65534"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := c
			c.User = tc.configured
			if got := sessionUser(c, tc.owner); got != tc.want {
				t.Errorf("sessionUser = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestGitMetadataOf(t *testing.T) {
	root := t.TempDir()
	dir := func(p string) string {
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
		return filepath.Join(root, p)
	}
	file := func(p, text string) {
		if err := os.WriteFile(filepath.Join(root, p), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dir("repo/.git")
	dir("main/.git/worktrees/wt")
	file("main/.git/HEAD", "ref: refs/heads/main\n")
	file("main/.git/worktrees/wt/HEAD", "ref: refs/heads/wt\n")
	file("main/.git/worktrees/wt/commondir", "../..\n")
	dir("wt")
	file("wt/.git", "gitdir: "+filepath.Join(root, "main/.git/worktrees/wt")+"\n")
	dir("sep/meta")
	file("sep/meta/HEAD", "ref: refs/heads/main\n")
	file("sep/.git", "gitdir: meta\n")
	dir("plaindir/src")
	file("plaindir/.git", "gitdir: src\n")
	dir("via/real")
	file("via/real/HEAD", "ref: refs/heads/main\n")
	if err := os.Symlink("real", filepath.Join(root, "via/link")); err != nil {
		t.Fatal(err)
	}
	file("via/.git", "gitdir: link\n")
	dir("outside/.git")
	dir("pointer")
	file("pointer/.git", "gitdir: "+filepath.Join(root, "outside/.git")+"\n")
	dir("linked/real")
	if err := os.Symlink("real", filepath.Join(root, "linked/.git")); err != nil {
		t.Fatal(err)
	}
	dir("plain")
	// HEAD a link (core.preferSymlinkRefs); a common directory with only
	// objects and refs.
	dir("symhead/gd")
	if err := os.Symlink("refs/heads/main", filepath.Join(root, "symhead/gd/HEAD")); err != nil {
		t.Fatal(err)
	}
	file("symhead/gd/commondir", "../common\n")
	dir("symhead/common/objects")
	dir("symhead/common/refs")
	file("symhead/.git", "gitdir: gd\n")
	// A folder of projects: one level down counts, a link or deeper not.
	dir("projects/a/.git")
	dir("projects/b")
	dir("projects/d/deeper/.git")
	if err := os.Symlink("a", filepath.Join(root, "projects/c")); err != nil {
		t.Fatal(err)
	}
	// Submodules two levels down, one named with a slash, one nested in
	// another.
	dir("super/.git/modules/third_party/lib/modules/inner")
	file("super/.git/HEAD", "ref: refs/heads/main\n")
	file("super/.git/modules/third_party/lib/HEAD", "ref: refs/heads/main\n")
	file("super/.git/modules/third_party/lib/config", "[core]\n\tbare = false\n\tworktree = ../../../../third_party/lib\n")
	file("super/.git/modules/third_party/lib/modules/inner/HEAD", "ref: refs/heads/main\n")
	file("super/.git/modules/third_party/lib/modules/inner/config", "[core]\n\tworktree = \"../../../../../../third_party/lib/deps/inner\"\n")
	dir("super/third_party/lib/deps/inner")
	file("super/third_party/lib/.git", "gitdir: ../../.git/modules/third_party/lib\n")
	file("super/third_party/lib/deps/inner/.git", "gitdir: ../../../../.git/modules/third_party/lib/modules/inner\n")
	// Submodules the index records: one never checked out (its
	// directory is kept read-only whole, or a command could make a
	// repository there that host git would go into), one with a .git
	// directory of its own (set up by an old git) whose index records
	// another, and one whose directory is gone.
	dir("sub/.git")
	file("sub/.git/HEAD", "ref: refs/heads/main\n")
	writeIndex(t, filepath.Join(root, "sub/.git/index"), 2, 20, []indexEntry{
		{".gitmodules", 0o100644}, {"vendor/empty", 0o160000}, {"vendor/gone", 0o160000}, {"vendor/old", 0o160000},
	})
	dir("sub/vendor/empty")
	dir("sub/vendor/old/.git")
	file("sub/vendor/old/.git/HEAD", "ref: refs/heads/main\n")
	writeIndex(t, filepath.Join(root, "sub/vendor/old/.git/index"), 4, 20, []indexEntry{{"deep/er", 0o160000}})
	dir("sub/vendor/old/deep/er/.git")
	r := func(ps ...string) []string {
		var out []string
		for _, p := range ps {
			out = append(out, filepath.Join(root, p))
		}
		return out
	}
	for _, tc := range []struct {
		name string
		real []string
		want []string
	}{
		{"a repository", r("repo"), r("repo/.git")},
		{"no repository", r("plain"), nil},
		{"a worktree with its repository", r("wt", "main"), r("wt/.git", "main/.git/worktrees/wt", "main/.git")},
		{"a worktree alone: its repository is not in the container", r("wt"), r("wt/.git")},
		{"a separate git directory", r("sep"), r("sep/.git", "sep/meta")},
		{"a pointer to what is not in the container", r("pointer"), r("pointer/.git")},
		// The link itself could be pointed elsewhere.
		{"a link", r("linked"), nil},
		{"a pointer to a directory that is no git directory", r("plaindir"), r("plaindir/.git")},
		{"a pointer through a link", r("via"), r("via/.git")},
		{"HEAD a link, a common directory without one", r("symhead"), r("symhead/.git", "symhead/gd", "symhead/common")},
		{"repositories one level down", r("projects"), r("projects/a/.git")},
		{"submodules deeper down", r("super"), r("super/.git", "super/third_party/lib/.git", "super/third_party/lib/deps/inner/.git")},
		{"submodules in the index", r("sub"), r("sub/.git", "sub/vendor/empty", "sub/vendor/old/.git", "sub/vendor/old/deep/er/.git")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, err := gitMetadataOf(tc.real, nil, nil); err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("gitMetadataOf = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestGitLinks(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"ws/sub", "ws/plain", "ws/repo/.git", "ws/deep/er"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []string{"ws/.git", "ws/sub/.git", "ws/deep/er/.git"} {
		if err := os.Symlink("/elsewhere", filepath.Join(root, l)); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{filepath.Join(root, "ws/.git"), filepath.Join(root, "ws/sub/.git")}
	if got := gitLinks([]string{filepath.Join(root, "ws")}); !slices.Equal(got, want) {
		t.Errorf("gitLinks = %q, want %q", got, want)
	}
}

func TestGitConfigValue(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, text, want string
	}{
		{"plain", "[core]\n\tworktree = ../x\n", "../x"},
		{"quoted", "[core]\n\tworktree = \"../a b\"\n", "../a b"},
		{"other section", "[remote \"origin\"]\n\tworktree = ../y\n[core]\n\tbare = false\n", ""},
		{"case and the last one", "[Core]\n\tWorkTree=../1\n[core]\nworktree = ../2\n", "../2"},
		{"none", "", ""},
	}
	for i, tc := range tests {
		file := filepath.Join(dir, fmt.Sprint(i))
		if err := os.WriteFile(file, []byte(tc.text), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := gitConfigValue(file, "core", "worktree"); got != tc.want {
			t.Errorf("%s: gitConfigValue = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestNestedRepositoriesAreBounded: up to maxNested repositories right
// below a session directory are protected; more are refused, rather than
// some left out, which a command could choose by making repositories
// that come first. A host mount point is not looked into.
func TestNestedRepositoriesAreBounded(t *testing.T) {
	root := t.TempDir()
	for i := range maxNested {
		if err := os.MkdirAll(filepath.Join(root, fmt.Sprintf("r%03d", i), ".git"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mounted := filepath.Join(root, "zz-mounted")
	if err := os.MkdirAll(filepath.Join(mounted, ".git"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := nestedRepositories(root, []string{mounted})
	if err != nil || len(got) != maxNested || slices.Contains(got, mounted) {
		t.Errorf("nestedRepositories of %d and a mount point: %d, %v; want %d without the mount point", maxNested, len(got), err, maxNested)
	}
	if err := os.MkdirAll(filepath.Join(root, "one-more", ".git"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := nestedRepositories(root, []string{mounted}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "protect_git") {
		t.Errorf("nestedRepositories of %d: %d, %v; want ErrInvalid naming protect_git", maxNested+1, len(got), err)
	}
}

// TestGitMetadataOfDoesNotWaitOnAFIFO: a command may leave a FIFO where a
// git pointer is read, and hold it open; the look must not wait on it.
func TestGitMetadataOfDoesNotWaitOnAFIFO(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, ".git"), []byte("gitdir: g\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "g"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "g", "HEAD"), []byte("ref: refs/heads/main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(root, "g", "commondir")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	held, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	done := make(chan []string, 1)
	go func() {
		found, _ := gitMetadataOf([]string{root}, nil, nil)
		done <- found
	}()
	select {
	case got := <-done:
		if want := []string{filepath.Join(root, ".git"), filepath.Join(root, "g")}; !slices.Equal(got, want) {
			t.Errorf("gitMetadataOf = %q, want %q", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("gitMetadataOf waits on a FIFO held open")
	}
}

// allDirs has every mount point a directory.
func allDirs(string) bool { return true }

// TestCoverFileMountPoints: a file the host mounts below a session
// directory or a grant (a container's own /etc/hosts) is covered by
// /dev/null, read-only, where a tmpfs cannot go; a directory by a tmpfs.
func TestCoverFileMountPoints(t *testing.T) {
	files := map[string]bool{"/etc/hosts": true, "/w/secret.txt": true}
	_, covers := coverHostMounts([]bind{{"/w", "/w"}}, []Mount{{Source: "/etc", Target: "/host-etc", Mode: "ro"}},
		[]string{"/etc/hosts", "/etc/ssl", "/w/secret.txt"}, func(p string) bool { return !files[p] })
	want := []mount.Mount{
		{Type: mount.TypeBind, Source: os.DevNull, Target: "/w/secret.txt", ReadOnly: true},
		{Type: mount.TypeBind, Source: os.DevNull, Target: "/host-etc/hosts", ReadOnly: true},
		{Type: mount.TypeTmpfs, Target: "/host-etc/ssl", ReadOnly: true, TmpfsOptions: &mount.TmpfsOptions{SizeBytes: 4096, Mode: 0o555}},
	}
	if !reflect.DeepEqual(covers, want) {
		t.Errorf("covers %+v, want %+v", covers, want)
	}
	// The real check, on what the kernel has cached.
	if !mountPointIsDir("/") || mountPointIsDir(os.DevNull) {
		t.Errorf("mountPointIsDir: / %v, %s %v", mountPointIsDir("/"), os.DevNull, mountPointIsDir(os.DevNull))
	}
}

func TestCoverHostMounts(t *testing.T) {
	binds := []bind{{"/real/w", "/w"}, {"/real/w/data", "/w/data"}, {"/x", "/x"}}
	points := []string{"/", "/real", "/real/w", "/real/w/proc", "/real/w/proc/sys", "/real/w/data", "/real/w/data/usb", "/real/w/a b", "/elsewhere", "/x", "/real/w/proc"}
	hosts, covers := coverHostMounts(binds, nil, points, allDirs)
	// Each once, also when listed twice (stacked mounts).
	if want := []string{"/real/w/a b", "/real/w/proc", "/real/w/data/usb"}; !slices.Equal(hosts, want) {
		t.Errorf("covered %q, want %q", hosts, want)
	}
	var targets []string
	for _, c := range covers {
		if !c.ReadOnly || c.Type != "tmpfs" {
			t.Errorf("cover %+v is not a read-only tmpfs", c)
		}
		targets = append(targets, c.Target)
	}
	if want := []string{"/w/a b", "/w/proc", "/w/data/usb"}; !slices.Equal(targets, want) {
		t.Errorf("cover targets %q, want %q", targets, want)
	}
	// A workspace named through a link: what lies below its source is
	// covered at the name the container knows, even where another bind
	// mounts the same source under its real name.
	_, covers = coverHostMounts([]bind{{"/real/w", "/alias"}, {"/real/w/m", "/real/w/m"}}, nil, []string{"/real/w", "/real/w/m"}, allDirs)
	if len(covers) != 1 || covers[0].Target != "/alias/m" {
		t.Errorf("covers of a workspace through a link: %+v, want one at /alias/m", covers)
	}
	// The kernel leaves a no-break space and a carriage return as they
	// are: they are part of the name.
	info := "36 35 98:0 / /real/w rw - ext4 /dev/sda1 rw\n37 36 0:55 / /real/w/a\\040b ro - tmpfs tmpfs ro\n38 36 0:56 / /real/w/c\u00a0d\re ro - tmpfs tmpfs ro\n"
	if got := mountPointsOf([]byte(info)); !slices.Equal(got, []string{"/real/w", "/real/w/a b", "/real/w/c\u00a0d\re"}) {
		t.Errorf("mountPointsOf = %q", got)
	}
}

func TestExecErrorMissing(t *testing.T) {
	for _, tc := range []struct {
		code   int
		output string
		want   bool
	}{
		{126, `OCI runtime exec failed: exec failed: unable to start container process: exec: "stat": executable file not found in $PATH: unknown`, true},
		{127, "sh: stat: not found\n", false},
		{126, `OCI runtime exec failed: exec failed: unable to start container process: chdir to cwd ("/w") set in config.json failed: permission denied: unknown`, false},
		{1, "stat: can't stat '/x': Permission denied\n", false},
		{127, `OCI runtime exec failed: exec failed: unable to start container process: exec: "stat": stat stat: no such file or directory: unknown`, true},
	} {
		if got := (&execError{code: tc.code, output: tc.output}).missing(); got != tc.want {
			t.Errorf("missing(%d, %.60q) = %v, want %v", tc.code, tc.output, got, tc.want)
		}
	}
}

// TestErrorsCutWhatThePeerSent: a huge value a peer sent is quoted in part.
func TestErrorsCutWhatThePeerSent(t *testing.T) {
	cfg, err := LoadConfig(sandboxd.DefaultConfig, "", 2)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 100000)
	for _, spec := range []SessionSpec{
		{Workspace: long},
		{Workspace: "/w", Network: long},
		{Workspace: "/w", ExtraDirs: []string{long}},
		{Workspace: "/w", Dir: "/elsewhere/" + long},
	} {
		_, err := ValidateSpec(cfg, 2, spec)
		if err == nil || len(err.Error()) > 1000 {
			t.Errorf("ValidateSpec: %d bytes of error, want a refusal under 1000", len(fmt.Sprint(err)))
		}
	}
}

// TestSubmodulesAreBounded: a modules directory beyond the bounds is
// refused, not looked at in part.
func TestSubmodulesAreBounded(t *testing.T) {
	gitdir := t.TempDir()
	for i := range maxModuleDirs + 1 {
		if err := os.MkdirAll(filepath.Join(gitdir, "modules", fmt.Sprintf("m%04d", i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := submoduleWorktrees(gitdir); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "protect_git") {
		t.Errorf("submoduleWorktrees of %d modules: %v, want ErrInvalid naming protect_git", maxModuleDirs+1, err)
	}
	deep := t.TempDir()
	if err := os.MkdirAll(filepath.Join(deep, "modules", strings.Repeat("d/", maxModuleDepth+2)), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := submoduleWorktrees(deep); !errors.Is(err, ErrInvalid) {
		t.Errorf("submoduleWorktrees %d levels deep: %v, want ErrInvalid", maxModuleDepth+2, err)
	}
}

// TestCoverHostMountsOfGrants: a host filesystem below a granted source
// is covered like one below the workspace, whatever the grant's mode; a
// place where another mount shows its own is not.
func TestCoverHostMountsOfGrants(t *testing.T) {
	for _, tc := range []struct {
		name    string
		binds   []bind
		granted []Mount
		points  []string
		want    []string // cover targets
	}{
		{name: "below a writable grant", binds: []bind{{"/real/w", "/w"}},
			granted: []Mount{{Source: "/srv/data", Target: "/data", Mode: "rw"}},
			points:  []string{"/", "/srv/data/nfs"}, want: []string{"/data/nfs"}},
		{name: "below a read-only grant", binds: []bind{{"/real/w", "/w"}},
			granted: []Mount{{Source: "/srv/data", Target: "/data", Mode: "ro"}},
			points:  []string{"/srv/data/nfs", "/srv/data/nfs/deeper"}, want: []string{"/data/nfs"}},
		{name: "a grant that is a host mount itself", binds: []bind{{"/real/w", "/w"}},
			granted: []Mount{{Source: "/srv/data", Target: "/data"}},
			points:  []string{"/srv/data"}, want: nil},
		{name: "a grant over a host mount in the workspace", binds: []bind{{"/real/w", "/w"}},
			granted: []Mount{{Source: "/opt/tools", Target: "/w/tools", Mode: "ro"}},
			points:  []string{"/real/w/tools", "/real/w/other"}, want: []string{"/w/other"}},
		{name: "a grant above a host mount in the workspace", binds: []bind{{"/real/w", "/w"}},
			granted: []Mount{{Source: "/opt/tools", Target: "/w/tools"}},
			points:  []string{"/real/w/tools/nfs", "/opt/tools/usb"}, want: []string{"/w/tools/usb"}},
		{name: "the workspace on a grant's host mount", binds: []bind{{"/mnt/usb", "/mnt/usb"}},
			granted: []Mount{{Source: "/mnt", Target: "/mnt", Mode: "ro"}},
			points:  []string{"/mnt/usb"}, want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			binds := slices.Clone(tc.binds)
			_, covers := coverHostMounts(binds, tc.granted, tc.points, allDirs)
			var targets []string
			for _, c := range covers {
				if !c.ReadOnly || c.Type != "tmpfs" {
					t.Errorf("cover %+v is not a read-only tmpfs", c)
				}
				targets = append(targets, c.Target)
			}
			if !slices.Equal(targets, tc.want) {
				t.Errorf("cover targets %q, want %q", targets, tc.want)
			}
			if !slices.Equal(binds, tc.binds) {
				t.Errorf("binds changed to %v", binds)
			}
		})
	}
}

func TestDistinctTargets(t *testing.T) {
	cover := func(target string) mount.Mount {
		return mount.Mount{Type: mount.TypeTmpfs, Target: target, ReadOnly: true}
	}
	for _, tc := range []struct {
		name   string
		mounts []mount.Mount
		err    string // "" passes
	}{
		{name: "apart", mounts: []mount.Mount{bindMount("/w", "/w", "rw"), cover("/w/nfs"), bindMount("/srv", "/data", "ro"), cover("/data/nfs")}},
		{name: "next to a cover", mounts: []mount.Mount{cover("/mnt/usb"), bindMount("/mnt/usbx", "/mnt/usbx", "rw")}},
		{name: "two at one place", mounts: []mount.Mount{bindMount("/w", "/w", "rw"), bindMount("/srv", "/w", "ro")}, err: `two mounts at "/w"`},
		// The engine makes their places in the cover before it is made
		// read-only.
		{name: "a workspace below a cover", mounts: []mount.Mount{bindMount("/mnt", "/mnt", "ro"), cover("/mnt/usb"), bindMount("/mnt/usb/p", "/mnt/usb/p", "rw")}},
		{name: "a grant below a cover", mounts: []mount.Mount{bindMount("/w", "/w", "rw"), cover("/w/nfs"), bindMount("/opt", "/w/nfs/opt", "ro")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := distinctTargets(tc.mounts)
			if tc.err == "" && err != nil || tc.err != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("distinctTargets = %v, want %q", err, tc.err)
			}
		})
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

// TestMergeStderrUnderTheShells: the entry point runs the command as given,
// its stderr joined to its stdout, under each /bin/sh an image may have
// (dash on Debian and Ubuntu, bash, busybox): those found here.
func TestMergeStderrUnderTheShells(t *testing.T) {
	found := 0
	for _, shell := range [][]string{{"dash"}, {"bash"}, {"busybox", "sh"}} {
		path, err := exec.LookPath(shell[0])
		if err != nil {
			continue
		}
		found++
		argv := append(shell[1:], "-c", mergeStderr, "sh", "sh", "-c", `printf '%s|' "$@"; echo err >&2`, "x", "a b", "-n")
		out, err := exec.Command(path, argv...).Output()
		if want := "a b|-n|err\n"; err != nil || string(out) != want {
			t.Errorf("%s: %q, %v; want %q", shell, out, err, want)
		}
	}
	if found == 0 {
		t.Skip("no dash, bash or busybox here")
	}
}

func TestKeeperUser(t *testing.T) {
	for _, tc := range []struct{ user, want string }{
		{"1000:1000", "2147483646:2147483646"},
		{"65534:65534", "2147483646:2147483646"},
		{"2147483646:5", "2147483646:5"},   // the commands' uid: theirs it stays
		{"02147483646:5", "02147483646:5"}, // however written
		{"2147483647:2147483647", "2147483646:2147483646"},
	} {
		if got := keeperUser(tc.user); got != tc.want {
			t.Errorf("keeperUser(%s) = %s, want %s", tc.user, got, tc.want)
		}
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
