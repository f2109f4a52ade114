package sandbox

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

func TestProcessExists(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{nil, true},
		{syscall.EPERM, true}, // there, but another user's
		{syscall.ESRCH, false},
	}
	for _, tc := range tests {
		if got := processExists(tc.err); got != tc.want {
			t.Errorf("processExists(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestInstanceAlive(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "instances")
	live, err := newInstance(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	if live.Boot == "" {
		live.Boot = "boot-now" // a host that does not say
	}
	here := localHost{name: live.Host, boot: live.Boot, machine: "machine-here", pidNS: "pid:[1]", lockDir: dir}
	// No lock file: only the pid and boot are left to judge by.
	lost := func(pid int, boot string, more ...string) map[string]string {
		l := map[string]string{LabelInstance: "0123456789ab", LabelHost: live.Host, LabelPid: strconv.Itoa(pid)}
		if boot != "" {
			l[LabelBoot] = boot
		}
		for i := 0; i+1 < len(more); i += 2 {
			l[more[i]] = more[i+1]
		}
		return l
	}
	const noSuchPid = 1<<31 - 1
	tests := []struct {
		name   string
		labels map[string]string
		want   bool
	}{
		{"lock held", live.Labels("s"), true},
		{"another host", map[string]string{LabelInstance: "0123456789ab", LabelHost: "elsewhere"}, true},
		{"lock gone, process there", lost(os.Getpid(), live.Boot), true},
		{"lock gone, process gone", lost(noSuchPid, live.Boot), false},
		{"lock gone, pid of another boot", lost(os.Getpid(), "boot-then"), false},
		{"lock gone, no boot label", lost(os.Getpid(), ""), true},
		{"lock gone, pid of this pid namespace", lost(os.Getpid(), live.Boot, LabelPidNS, "pid:[1]"), true},
		{"lock gone, dead pid of this pid namespace", lost(noSuchPid, live.Boot, LabelPidNS, "pid:[1]"), false},
		// Its owner may live in another container of the host's name,
		// with a /tmp of its own: its pid says nothing here.
		{"lock gone, pid of another pid namespace", lost(noSuchPid, live.Boot, LabelPidNS, "pid:[2]"), true},
		{"another machine of the same name", lost(noSuchPid, "boot-there", LabelMachine, "machine-there"), true},
		{"this machine, another boot", lost(os.Getpid(), "boot-then", LabelMachine, "machine-here"), false},
		{"no instance id", map[string]string{LabelHost: live.Host}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := here.instanceAlive(tc.labels); got != tc.want {
				t.Errorf("instanceAlive(%v) = %v, want %v", tc.labels, got, tc.want)
			}
		})
	}

	t.Run("free lock", func(t *testing.T) {
		name := filepath.Join(dir, "ba0123456789.lock")
		if err := os.WriteFile(name, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		labels := map[string]string{LabelInstance: "ba0123456789", LabelHost: live.Host, LabelPid: strconv.Itoa(os.Getpid()), LabelBoot: live.Boot}
		if here.instanceAlive(labels) {
			t.Error("alive with its lock free")
		}
		if _, err := os.Stat(name); !os.IsNotExist(err) {
			t.Errorf("free lock left behind: %v", err)
		}
	})
}
