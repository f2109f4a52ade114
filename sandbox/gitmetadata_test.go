package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

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
			if got, notes := gitMetadataOf(tc.real, nil, nil); notes != nil || !slices.Equal(got, tc.want) {
				t.Errorf("gitMetadataOf = %q, %v; want %q", got, notes, tc.want)
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
// below a session directory are protected, the oldest; the rest are
// named, newest first, for the log. A host mount point is not looked
// into.
func TestNestedRepositoriesAreBounded(t *testing.T) {
	root := t.TempDir()
	// The person's, made first, named to come last.
	if err := os.MkdirAll(filepath.Join(root, "zz-mine", ".git"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range maxNested - 1 {
		if err := os.MkdirAll(filepath.Join(root, fmt.Sprintf("r%03d", i), ".git"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mounted := filepath.Join(root, "zz-mounted")
	if err := os.MkdirAll(filepath.Join(mounted, ".git"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, left := nestedRepositories(root, []string{mounted})
	if len(got) != maxNested || left != nil || slices.Contains(got, mounted) {
		t.Errorf("nestedRepositories of %d and a mount point: %d, %q; want %d without the mount point", maxNested, len(got), left, maxNested)
	}
	for _, r := range []string{"a-planted", "b-planted"} {
		if err := os.MkdirAll(filepath.Join(root, r, ".git"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	got, left = nestedRepositories(root, []string{mounted})
	var st unix.Statx_t
	if unix.Statx(unix.AT_FDCWD, root, 0, unix.STATX_BTIME, &st) != nil || st.Mask&unix.STATX_BTIME == 0 {
		// By name: the last two are left.
		if want := []string{filepath.Join(root, "zz-mine"), filepath.Join(root, "r254")}; len(got) != maxNested || !slices.Equal(left, want) {
			t.Errorf("without birth times: %d protected, left %q; want %q", len(got), left, want)
		}
		return
	}
	if want := []string{filepath.Join(root, "b-planted"), filepath.Join(root, "a-planted")}; len(got) != maxNested || !slices.Equal(left, want) || !slices.Contains(got, filepath.Join(root, "zz-mine")) {
		t.Errorf("%d protected, left %q; want the newest, %q, left and zz-mine protected", len(got), left, want)
	}
}

// TestSubmodulesAreBounded: a modules directory beyond the bounds gives
// what was found before, and an error for the notes.
func TestSubmodulesAreBounded(t *testing.T) {
	gitdir := t.TempDir()
	for i := range maxModuleDirs + 1 {
		if err := os.MkdirAll(filepath.Join(gitdir, "modules", fmt.Sprintf("m%04d", i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := submoduleRepos(gitdir); err == nil {
		t.Errorf("submoduleRepos of %d modules: no error", maxModuleDirs+1)
	}
	deep := t.TempDir()
	if err := os.MkdirAll(filepath.Join(deep, "modules", strings.Repeat("d/", maxModuleDepth+2)), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := submoduleRepos(deep); err == nil {
		t.Errorf("submoduleRepos %d levels deep: no error", maxModuleDepth+2)
	}
}

// TestUnreadableRepositoriesAreNoted: what sandboxd cannot read of a
// repository (a command's, maybe) fails nothing: its .git is still found,
// and the notes name it.
func TestUnreadableRepositoriesAreNoted(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"evil/.git", "good/.git"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "evil/.git/index"), []byte("DIRC\x00\x00\x00\x09\x00\x00\x00\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	found, notes := gitMetadataOf([]string{root}, nil, nil)
	if want := []string{filepath.Join(root, "evil/.git"), filepath.Join(root, "good/.git")}; !slices.Equal(found, want) {
		t.Errorf("found %q, want %q", found, want)
	}
	if len(notes) != 1 || notes[0].path != filepath.Join(root, "evil") || !strings.Contains(notes[0].what, "version 9") {
		t.Errorf("notes %v, want one naming evil's index", notes)
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
