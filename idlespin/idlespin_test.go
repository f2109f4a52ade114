package idlespin

import (
	"os"
	"testing"
	"testing/fstest"
	"time"
)

func TestCPUQuota(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	tests := []struct {
		name string
		fs   fstest.MapFS
		want string
	}{
		{"v2 no quota", fstest.MapFS{
			"proc/self/cgroup":                         file("0::/user.slice/session-1.scope\n"),
			"sys/fs/cgroup/user.slice/cpu.max":         file("max 100000\n"),
			"sys/fs/cgroup/user.slice/session-1.scope": &fstest.MapFile{Mode: 0o755 | os.ModeDir},
		}, ""},
		{"v2 own quota", fstest.MapFS{
			"proc/self/cgroup":          file("0::/box\n"),
			"sys/fs/cgroup/box/cpu.max": file("50000 100000\n"),
		}, "/box"},
		{"v2 quota above", fstest.MapFS{
			"proc/self/cgroup":            file("0::/a/b/c\n"),
			"sys/fs/cgroup/a/cpu.max":     file("200000 100000\n"),
			"sys/fs/cgroup/a/b/c/cpu.max": file("max 100000\n"),
		}, "/a"},
		{"v2 namespace root", fstest.MapFS{
			"proc/self/cgroup":      file("0::/\n"),
			"sys/fs/cgroup/cpu.max": file("100000 100000\n"),
		}, "/"},
		{"v1 no quota", fstest.MapFS{
			"proc/self/cgroup": file("9:name=systemd:/\n4:cpu,cpuacct:/docker/abc\n3:pids:/\n"),
			"sys/fs/cgroup/cpu/docker/abc/cpu.cfs_quota_us": file("-1\n"),
			"sys/fs/cgroup/cpu/cpu.cfs_quota_us":            file("-1\n"),
		}, ""},
		{"v1 quota", fstest.MapFS{
			"proc/self/cgroup": file("4:cpuacct,cpu:/docker/abc\n"),
			"sys/fs/cgroup/cpu/docker/abc/cpu.cfs_quota_us": file("150000\n"),
		}, "/docker/abc"},
		{"v1 cpuset is not cpu", fstest.MapFS{
			"proc/self/cgroup":                     file("5:cpuset:/x\n"),
			"sys/fs/cgroup/cpu/x/cpu.cfs_quota_us": file("1000\n"),
		}, ""},
		{"hybrid", fstest.MapFS{
			"proc/self/cgroup":                   file("4:cpu,cpuacct:/\n0::/u\n"),
			"sys/fs/cgroup/cpu/cpu.cfs_quota_us": file("-1\n"),
			"sys/fs/cgroup/u/cpu.max":            file("10000 100000\n"),
		}, "/u"},
		{"path climbing out", fstest.MapFS{
			"proc/self/cgroup":          file("0::/../../etc\n"),
			"sys/fs/cgroup/etc/cpu.max": file("1 100000\n"),
		}, "/etc"},
		{"garbage lines", fstest.MapFS{
			"proc/self/cgroup": file("nonsense\n\n::\n"),
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := cpuQuota(tt.fs, "/proc/self/cgroup")
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("cpuQuota = %q, want %q", got, tt.want)
			}
		})
	}
	if _, err := cpuQuota(fstest.MapFS{}, "/proc/self/cgroup"); err == nil {
		t.Error("cpuQuota without a cgroup file: no error")
	}
}

// TestSpinnerSpinsForItsWindow: the thread spins from a Touch until the
// window after it, and not before. (That it spins at SCHED_IDLE, and uses
// CPU then, integration's TestWrapBusyPolls shows.)
func TestSpinnerSpinsForItsWindow(t *testing.T) {
	if quota, err := cpuQuota(os.DirFS("/"), "/proc/self/cgroup"); err != nil || quota != "" {
		t.Skipf("this process's cgroup has a CPU quota (%q, %v): no spinner", quota, err)
	}
	const window = 100 * time.Millisecond
	s, err := New(1, window)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.due() || s.spinning.Load() != 0 {
		t.Fatal("spinning before any Touch")
	}
	start := time.Now()
	s.Touch()
	poll(t, "the thread spins", func() bool { return s.spinning.Load() == 1 })
	poll(t, "the thread stops", func() bool { return s.spinning.Load() == 0 })
	if d := time.Since(start); d < window {
		t.Errorf("stopped after %s, before the window of %s", d, window)
	}
	// Touched again, it spins again.
	s.Touch()
	poll(t, "the thread spins again", func() bool { return s.spinning.Load() == 1 })
}

func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(5 * time.Millisecond)
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
		if s, err := New(c.n, c.window); s != nil || err != nil {
			t.Errorf("New(%d, %s) = %v, %v; want nil, nil", c.n, c.window, s, err)
		}
	}
}

func TestCloseStopsSpinning(t *testing.T) {
	s, err := New(2, time.Hour)
	if err != nil {
		t.Skip(err)
	}
	s.Touch()
	poll(t, "both threads spin", func() bool { return s.spinning.Load() == 2 })
	done := make(chan struct{})
	go func() { s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not stop threads spinning for an hour")
	}
	s.Touch() // after Close: nothing
	if s.spinning.Load() != 0 {
		t.Error("spinning after Close")
	}
}
