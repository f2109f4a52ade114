package sandbox

import (
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxd/sandboxd"
)

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
