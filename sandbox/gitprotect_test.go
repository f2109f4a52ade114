package sandbox

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

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
	if err != nil || len(seen.files()) != 1 {
		t.Fatalf("found at the start: %v, %v", seen, err)
	}
	s.gitSeen, s.gitGuarded = seen.files(), true
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

// TestProtectGitKeepsConfiguredPathsReadOnly: the hooks directory and the
// included file the config names are made when missing and mounted
// read-only, the directory above pinned; one in a writable grant is
// read-only at the grant's target; the check from inside only looks in
// the mount table for what the session's user may not reach.
func TestProtectGitKeepsConfiguredPathsReadOnly(t *testing.T) {
	m := readyManager(t)
	m.cfg.Session.ProtectGit = true
	root := t.TempDir()
	ws, grant := filepath.Join(root, "ws"), filepath.Join(root, "grant")
	for _, d := range []string{"ws/.git", "ws/shut/.git", "grant/hooks"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	config := "[core]\n\thooksPath = .husky/_\n\thooksPath = " + grant + "/hooks\n[include]\n\tpath = ../local\n"
	if err := os.WriteFile(filepath.Join(ws, ".git/config"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(ws, "shut"), 0); err != nil {
		t.Fatal(err)
	}
	s := m.addReady("s", SessionSpec{ID: "s"})
	s.user = "1000:1000"
	mounts, checks, err := s.protectGit([]string{ws}, []bind{{ws, ws}}, []Mount{{Source: grant, Target: "/g", Mode: "rw"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mt := range mounts {
		mode := "rw"
		if mt.ReadOnly {
			mode = "ro"
		}
		got = append(got, strings.TrimPrefix(mt.Target, root)+":"+mode)
	}
	want := []string{"/ws/.git:ro", "/ws/shut:rw", "/ws/shut/.git:ro", "/ws/.husky:rw", "/ws/.husky/_:ro", "/ws/local:ro", "/g/hooks:ro"}
	if !sameSet(got, want) {
		t.Errorf("mounts %q, want %q", got, want)
	}
	for _, p := range []string{".husky/_", "local"} {
		if _, err := os.Stat(filepath.Join(ws, p)); err != nil {
			t.Errorf("%s was not made: %v", p, err)
		}
	}
	for _, c := range checks {
		if c.unseen != (c.target == filepath.Join(ws, "shut/.git")) {
			t.Errorf("check of %s: unseen %v", c.target, c.unseen)
		}
	}
}
