package idlespin

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"time"
)

func TestMain(m *testing.M) {
	// New starts this test binary as its helper.
	if len(os.Args) > 1 && os.Args[1] == HelperCommand {
		os.Exit(RunHelper(os.Args[2:]))
	}
	os.Exit(m.Run())
}

func TestCPUQuota(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	const (
		v2    = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
		v1cpu = "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
		// A container without a cgroup namespace: its own cgroup is the
		// root of what it sees.
		v1docker = "32 31 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,relatime - cgroup cgroup rw,cpu,cpuacct\n"
		hybrid   = "40 31 0:40 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
		spaced   = "30 23 0:26 / /sys/fs/my\\040cgroup rw - cgroup2 cgroup2 rw\n"
	)
	tests := []struct {
		name    string
		fs      fstest.MapFS
		want    string
		wantErr string
	}{
		{name: "v2 no quota", fs: fstest.MapFS{
			"proc/self/cgroup":                                 file("0::/user.slice/session-1.scope\n"),
			"proc/self/mountinfo":                              file(v2),
			"sys/fs/cgroup/user.slice/cpu.max":                 file("max 100000\n"),
			"sys/fs/cgroup/user.slice/session-1.scope/cpu.max": file("max 100000\n"),
		}},
		{name: "v2 own quota", fs: fstest.MapFS{
			"proc/self/cgroup":          file("0::/box\n"),
			"proc/self/mountinfo":       file(v2),
			"sys/fs/cgroup/box/cpu.max": file("50000 100000\n"),
		}, want: "/box"},
		{name: "v2 quota above", fs: fstest.MapFS{
			"proc/self/cgroup":            file("0::/a/b/c\n"),
			"proc/self/mountinfo":         file(v2),
			"sys/fs/cgroup/a/cpu.max":     file("200000 100000\n"),
			"sys/fs/cgroup/a/b/c/cpu.max": file("max 100000\n"),
		}, want: "/a"},
		{name: "v2 namespace root", fs: fstest.MapFS{
			"proc/self/cgroup":      file("0::/\n"),
			"proc/self/mountinfo":   file(v2),
			"sys/fs/cgroup/cpu.max": file("100000 100000\n"),
		}, want: "/"},
		{name: "v2 mount point with a space", fs: fstest.MapFS{
			"proc/self/cgroup":           file("0::/x\n"),
			"proc/self/mountinfo":        file(spaced),
			"sys/fs/my cgroup/x/cpu.max": file("1000 100000\n"),
		}, want: "/x"},
		{name: "v1 no quota", fs: fstest.MapFS{
			"proc/self/cgroup":    file("9:name=systemd:/\n4:cpu,cpuacct:/docker/abc\n3:pids:/\n"),
			"proc/self/mountinfo": file(v1cpu),
			"sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": file("-1\n"),
			"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us":            file("-1\n"),
		}},
		{name: "v1 quota", fs: fstest.MapFS{
			"proc/self/cgroup":    file("4:cpuacct,cpu:/docker/abc\n"),
			"proc/self/mountinfo": file(v1cpu),
			"sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": file("150000\n"),
		}, want: "/docker/abc"},
		{name: "v1 container without cgroup namespace", fs: fstest.MapFS{
			"proc/self/cgroup":                           file("4:cpu,cpuacct:/docker/abc\n"),
			"proc/self/mountinfo":                        file(v1docker),
			"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": file("100000\n"),
		}, want: "/docker/abc"},
		{name: "v1 cpuset is not cpu", fs: fstest.MapFS{
			"proc/self/cgroup":    file("5:cpuset:/x\n"),
			"proc/self/mountinfo": file("34 31 0:31 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n"),
		}},
		// The cpu controller is on v1: a cpu.max of the unified hierarchy
		// (which a hybrid host has none of) is not read.
		{name: "hybrid", fs: fstest.MapFS{
			"proc/self/cgroup":                           file("4:cpu,cpuacct:/\n0::/u\n"),
			"proc/self/mountinfo":                        file(v1cpu + hybrid),
			"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": file("-1\n"),
			"sys/fs/cgroup/unified/u/cpu.max":            file("10000 100000\n"),
		}},
		{name: "hybrid container without the unified hierarchy", fs: fstest.MapFS{
			"proc/self/cgroup":                           file("4:cpu,cpuacct:/docker/abc\n0::/docker/abc\n"),
			"proc/self/mountinfo":                        file(v1docker),
			"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": file("-1\n"),
		}},
		{name: "v2 only: the unified line counts", fs: fstest.MapFS{
			"proc/self/cgroup":        file("1:name=systemd:/x\n0::/x\n"),
			"proc/self/mountinfo":     file(v2),
			"sys/fs/cgroup/x/cpu.max": file("5000 100000\n"),
		}, want: "/x"},
		{name: "two mounts, the one holding the cgroup", fs: fstest.MapFS{
			"proc/self/cgroup":          file("0::/a/b\n"),
			"proc/self/mountinfo":       file(v2 + "50 23 0:26 /c /mnt/c rw - cgroup2 cgroup2 rw\n"),
			"sys/fs/cgroup/a/b/cpu.max": file("5000 100000\n"),
		}, want: "/a/b"},
		{name: "outside the namespace root", fs: fstest.MapFS{
			"proc/self/cgroup":    file("0::/../../etc\n"),
			"proc/self/mountinfo": file(v2),
		}, wantErr: "outside every mount"},
		{name: "outside the mount's root", fs: fstest.MapFS{
			"proc/self/cgroup":    file("4:cpu,cpuacct:/other\n"),
			"proc/self/mountinfo": file(v1docker),
		}, wantErr: "outside every mount"},
		{name: "hierarchy not mounted", fs: fstest.MapFS{
			"proc/self/cgroup":    file("0::/x\n"),
			"proc/self/mountinfo": file(v1cpu),
		}, wantErr: "not mounted"},
		{name: "garbage lines", fs: fstest.MapFS{
			"proc/self/cgroup":    file("nonsense\n\n::\n"),
			"proc/self/mountinfo": file("junk\n - \n"),
		}},
		{name: "no cgroup file", fs: fstest.MapFS{}, wantErr: "proc/self/cgroup"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := cpuQuota(tt.fs)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("cpuQuota = %q, %v; want an error with %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("cpuQuota = %q, want %q", got, tt.want)
			}
		})
	}
}

// newSpinner returns a Spinner, or skips where this machine gives none.
func newSpinner(t *testing.T, n int, window time.Duration) *Spinner {
	t.Helper()
	if quota, err := cpuQuota(os.DirFS("/")); err != nil || quota != "" {
		t.Skipf("no busy polling here: quota %q, %v", quota, err)
	}
	s, err := New(context.Background(), n, window, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestSpinnerSpinsForItsWindow: the helper's thread spins from a Touch
// until the window after it, at SCHED_IDLE, and not before.
func TestSpinnerSpinsForItsWindow(t *testing.T) {
	const window = 100 * time.Millisecond
	s := newSpinner(t, 1, window)
	policies := threadPolicies(t, s.helper.Process.Pid)
	if policies["5"] != 1 {
		t.Errorf("helper thread policies %v, want one SCHED_IDLE (5)", policies)
	}
	if n := s.shared.rounds.Load(); n != 0 {
		t.Fatalf("%d rounds of spinning before any Touch", n)
	}
	start := time.Now()
	s.Touch()
	eventually(t, "a round of spinning", 10*time.Second, func() bool { return s.shared.rounds.Load() == 1 })
	eventually(t, "the thread stops", 10*time.Second, func() bool { return s.shared.spinning.Load() == 0 })
	if d := time.Since(start); d < window {
		t.Errorf("stopped after %s, before the window of %s", d, window)
	}
	s.Touch()
	eventually(t, "a second round", 10*time.Second, func() bool { return s.shared.rounds.Load() == 2 })
}

// threadPolicies counts the threads of process pid by scheduling policy.
func threadPolicies(t *testing.T, pid int) map[string]int {
	t.Helper()
	stats, err := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/stat")
	if err != nil || len(stats) == 0 {
		t.Fatalf("threads of %d: %v", pid, err)
	}
	policies := make(map[string]int)
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread ended
		}
		// After the command's closing parenthesis: state is field 3,
		// policy field 41.
		fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		policies[fields[38]]++
	}
	return policies
}

func TestCloseEndsTheHelper(t *testing.T) {
	n := min(runtime.NumCPU(), 2)
	s := newSpinner(t, n, time.Hour)
	s.Touch()
	eventually(t, "the threads spin", 10*time.Second, func() bool { return s.shared.spinning.Load() == int32(n) })
	s.Close()
	if s.helper.ProcessState == nil {
		t.Fatal("helper not waited for")
	}
	s.Touch() // after Close: nothing, and no fault
	s.Close()
}

func TestRunHelperRefusesBadArguments(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"0", "1ms", strconv.Itoa(os.Getppid())},
		{"65", "1ms", strconv.Itoa(os.Getppid())},
		{"1", "0s", strconv.Itoa(os.Getppid())},
		{"1", "1ms", "1"}, // not this process's parent
		{"x", "1ms", strconv.Itoa(os.Getppid())},
	} {
		if err := runHelper(args); err == nil {
			t.Errorf("runHelper(%q): no error", args)
		}
	}
}

// TestHelperThatDiesIsNoticed: a helper that dies is logged with the last
// it said (a crash's report), and Touch no longer wakes anybody.
func TestHelperThatDiesIsNoticed(t *testing.T) {
	if quota, err := cpuQuota(os.DirFS("/")); err != nil || quota != "" {
		t.Skipf("no busy polling here: quota %q, %v", quota, err)
	}
	var logs bytes.Buffer
	s, err := New(context.Background(), 1, time.Millisecond, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	eventually(t, "the thread waits", 10*time.Second, func() bool { return s.shared.sleepers.Load() == 1 })
	// The runtime's dump, as a crash would write, then its end.
	s.helper.Process.Signal(syscall.SIGQUIT)
	<-s.exited
	if l := logs.String(); !strings.Contains(l, "busy polling stopped: its helper ended") || !strings.Contains(l, "SIGQUIT") {
		t.Errorf("log: %q", l)
	}
	seq := s.shared.seq.Load()
	s.Touch()
	if s.shared.seq.Load() != seq {
		t.Error("Touch after the helper died still touched the page")
	}
}

// TestHelperTakesOnlyTheSharedPage: a file given as fd 3 in its place is
// neither changed nor taken.
func TestHelperTakesOnlyTheSharedPage(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "page")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("precious"); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/proc/self/exe", HelperCommand, "1", "1ms", strconv.Itoa(os.Getpid()))
	cmd.ExtraFiles = []*os.File{f}
	out, err := cmd.Output()
	if err == nil || !strings.Contains(string(out), "fd 3 is not the shared page") {
		t.Errorf("helper with a file as fd 3: %v, %q", err, out)
	}
	if b, err := os.ReadFile(f.Name()); err != nil || string(b) != "precious" {
		t.Errorf("the file holds %q (%v)", b, err)
	}
}

func TestNilAndOff(t *testing.T) {
	var s *Spinner
	s.Touch()
	s.Close()
	for _, c := range []struct {
		n      int
		window time.Duration
	}{{0, time.Millisecond}, {2, 0}, {-1, -1}} {
		if s, err := New(context.Background(), c.n, c.window, nil); s != nil || err != nil {
			t.Errorf("New(%d, %s) = %v, %v; want nil, nil", c.n, c.window, s, err)
		}
	}
}

func eventually(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
