package sandbox

import (
	"slices"
	"testing"

	"github.com/sandboxd/sandboxd"
)

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
