package sandbox

import (
	"os"
	"path/filepath"
	"slices"
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
	if err != nil || len(seen) != 1 {
		t.Fatalf("found at the start: %v, %v", seen, err)
	}
	s.gitSeen, s.gitGuarded = seen, true
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
