package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestLockDirIgnoresTMPDIR: users with a $TMPDIR of their own must still
// see each other's locks.
func TestLockDirIgnoresTMPDIR(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	if got := LockDir(); got != "/tmp/sandboxd-instances" {
		t.Errorf("LockDir() = %q, want /tmp/sandboxd-instances", got)
	}
}

func TestCheckLockDir(t *testing.T) {
	const me, other = 1000, 1001
	const dir = syscall.S_IFDIR
	tests := []struct {
		name    string
		uid     uint32
		mode    uint32
		wantErr string // "" means accepted
	}{
		{"root's, as created", 0, dir | 0o1777, ""},
		{"mine, as created", me, dir | 0o1777, ""},
		{"mine, private", me, dir | 0o700, ""},
		{"mine, readable by others", me, dir | 0o755, ""},
		{"root's, not writable", 0, dir | 0o755, ""},
		{"another user's, as created", other, dir | 0o1777, ""},
		{"another user's, private", other, dir | 0o755, "belongs to uid 1001"},
		{"mine, writable by all, not sticky", me, dir | 0o777, "without the sticky bit (mode 0777)"},
		{"mine, writable by the group", me, dir | 0o775, "without the sticky bit"},
		{"root's, writable by all, not sticky", 0, dir | 0o777, "without the sticky bit"},
		{"a file", me, syscall.S_IFREG | 0o644, "is not a directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkLockDir("/tmp/x", &syscall.Stat_t{Uid: tc.uid, Mode: tc.mode}, me)
			if tc.wantErr == "" {
				if err != nil {
					t.Errorf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "/tmp/x") {
				t.Errorf("err = %v, want it to name /tmp/x and say %q", err, tc.wantErr)
			}
		})
	}
}

// TestNewInstanceLockDir: a missing directory is made shared whatever the
// umask; one that someone else could write into is refused with what to do.
func TestNewInstanceLockDir(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	tests := []struct {
		name    string
		setup   func(t *testing.T, dir string)
		wantErr string
	}{
		{name: "missing", setup: func(t *testing.T, dir string) {}},
		{name: "shared", setup: func(t *testing.T, dir string) {
			mkdir(t, dir, 0o777|os.ModeSticky)
		}},
		{name: "writable by all, not sticky", wantErr: "sticky", setup: func(t *testing.T, dir string) {
			mkdir(t, dir, 0o777)
		}},
		{name: "a link to a shared directory", wantErr: "symbolic link", setup: func(t *testing.T, dir string) {
			mkdir(t, dir+".real", 0o777|os.ModeSticky)
			if err := os.Symlink(dir+".real", dir); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "a file", wantErr: "not a directory", setup: func(t *testing.T, dir string) {
			if err := os.WriteFile(dir, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "another user's, not shared", wantErr: "belongs to uid 65534", setup: func(t *testing.T, dir string) {
			if os.Geteuid() != 0 {
				t.Skip("needs root to give a directory away")
			}
			mkdir(t, dir, 0o755)
			if err := os.Chown(dir, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "instances")
			tc.setup(t, dir)
			in, err := newInstance(dir)
			if tc.wantErr != "" {
				if err == nil {
					in.Close()
				}
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), dir) {
					t.Errorf("err = %v, want it to name %s and say %q", err, dir, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("newInstance: %v", err)
			}
			defer in.Close()
			fi, err := os.Lstat(dir)
			if err != nil {
				t.Fatal(err)
			}
			if want := os.ModeDir | os.ModeSticky | 0o777; fi.Mode() != want {
				t.Errorf("mode %v, want %v", fi.Mode(), want)
			}
			// Readable by every user's gc, whatever the umask.
			if fi, err := os.Stat(filepath.Join(dir, in.ID+".lock")); err != nil || fi.Mode() != 0o644 {
				t.Errorf("lock file: %v, %v; want mode 0644", fi, err)
			}
		})
	}
}

func mkdir(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
}

func TestInstanceLabels(t *testing.T) {
	in := &Instance{ID: "id", Host: "h", Boot: "b"}
	if got := in.Labels("s")[LabelBoot]; got != "b" {
		t.Errorf("boot label %q, want b", got)
	}
	in.Boot = ""
	if _, ok := in.Labels("s")[LabelBoot]; ok {
		t.Error("boot label set without a boot id")
	}
	in.Machine, in.PidNS = "m", "pid:[1]"
	if l := in.Labels("s"); l[LabelMachine] != "m" || l[LabelPidNS] != "pid:[1]" {
		t.Errorf("labels %v, want the machine and pid namespace", l)
	}
	if id := machineID(); len(id) != 0 && len(id) != 16 {
		t.Errorf("machine id %q: want a 16-digit hash, or none", id)
	}
}
