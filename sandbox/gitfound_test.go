package sandbox

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

func TestResolvePath(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"a/b", "c"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for link, to := range map[string]string{"c/up": "../a/b", "abs": filepath.Join(root, "a"), "loop": "loop", "dangling": "a/gone"} {
		if err := os.Symlink(to, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		path, want string
		links      []string
		fails      bool
	}{
		{"a/b/x", "a/b/x", nil, false},
		// ".." after a link leaves where the link points.
		{"c/up/../y", "a/y", []string{"c/up"}, false},
		{"abs/b/./z", "a/b/z", []string{"abs"}, false},
		{"dangling/h", "a/gone/h", []string{"dangling"}, false},
		{"file/hooks", "file", nil, false}, // a file in the way
		{"file", "file", nil, false},
		{"loop/x", "", nil, true},
	} {
		got, links, err := resolvePath(root + "/" + tc.path)
		var rel []string
		for _, l := range links {
			rel = append(rel, strings.TrimPrefix(l, root+"/"))
		}
		if (err != nil) != tc.fails || !tc.fails && (got != filepath.Join(root, tc.want) || !slices.Equal(rel, tc.links)) {
			t.Errorf("resolvePath(%s) = %q, %q, %v; want %q, %q", tc.path, got, rel, err, tc.want, tc.links)
		}
	}
}

// TestMakeGitTarget: what is made is empty, owned as the directory it is
// made in, and never through a link.
func TestMakeGitTarget(t *testing.T) {
	root := t.TempDir()
	if err := os.Chown(root, 1000, 1001); err != nil {
		t.Skip("needs root to give files away:", err)
	}
	elsewhere := t.TempDir()
	if err := os.Symlink(elsewhere, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	hooks := filepath.Join(root, ".husky/_")
	if err := makeGitTarget(root, gitTarget{path: hooks, dir: true}); err != nil {
		t.Fatal(err)
	}
	local := filepath.Join(root, "conf/local")
	if err := makeGitTarget(root, gitTarget{path: local}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Dir(hooks), hooks, filepath.Dir(local), local} {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil || st.Uid != 1000 || st.Gid != 1001 {
			t.Errorf("%s: %v, owned by %d:%d; want 1000:1001", p, err, st.Uid, st.Gid)
		}
	}
	if fi, err := os.Stat(hooks); err != nil || !fi.IsDir() {
		t.Errorf("%s is no directory", hooks)
	}
	if fi, err := os.Stat(local); err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
		t.Errorf("%s is no empty file", local)
	}
	// Made meanwhile: nothing to do.
	if err := makeGitTarget(root, gitTarget{path: local}); err != nil {
		t.Errorf("made again: %v", err)
	}
	if err := makeGitTarget(root, gitTarget{path: filepath.Join(root, "link/x/hooks"), dir: true}); err == nil {
		t.Error("made through a link")
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Errorf("made %v where the link points", entries)
	}
}

func TestMayEnter(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"open/shut/x", "mine/x", "group/x"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for d, mode := range map[string]os.FileMode{"open/shut": 0o700, "mine": 0o700, "group": 0o070} {
		if err := os.Chmod(filepath.Join(root, d), mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(filepath.Join(root, "mine"), 1000, 0); err != nil {
		t.Skip("needs root to give files away:", err)
	}
	if err := os.Chown(filepath.Join(root, "group"), 0, 1000); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		user, dir string
		want      bool
	}{
		{"1000:1000", "open", true},
		{"1000:1000", "open/shut/x", false},
		{"1000:1000", "mine/x", true},
		{"1000:1000", "group/x", true},
		{"1001:1001", "group/x", false},
		{"nobody", "open/shut/x", true}, // a name: not known here
	} {
		if got := mayEnter(tc.user, root, filepath.Join(root, tc.dir)); got != tc.want {
			t.Errorf("mayEnter(%s, %s) = %v, want %v", tc.user, tc.dir, got, tc.want)
		}
	}
}

// TestStatGitMetadataFollowsConfig: what a repository's config names in a
// session directory or a writable grant is found, or noted when it cannot
// be kept read-only; what lies elsewhere, or inside the read-only
// metadata, is left alone.
func TestStatGitMetadataFollowsConfig(t *testing.T) {
	root := t.TempDir()
	ws, grant, outside := filepath.Join(root, "ws"), filepath.Join(root, "grant"), filepath.Join(root, "outside")
	for _, d := range []string{"ws/.git", "ws/.husky", "ws/real-hooks", "grant/tools", "outside/hooks"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("real-hooks", filepath.Join(ws, "linked")); err != nil {
		t.Fatal(err)
	}
	config := "[core]\n\thooksPath = .husky/_\n\tfsmonitor = " + grant + "/tools/fsmon\n" +
		"[include]\n\tpath = local\n\tpath = ../../outside/conf\n" +
		"[core]\n\thooksPath = " + outside + "/hooks\n\thooksPath = linked\n\thooksPath = .\n\teditor = " + grant + "/tools\n"
	if err := os.WriteFile(filepath.Join(ws, ".git/config"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(grant, "tools/fsmon"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	found, err := statGitMetadata([]string{ws}, []string{grant}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var conf, missing []string
	for _, g := range found.conf {
		conf = append(conf, strings.TrimPrefix(g.path, root))
	}
	for _, m := range found.missing {
		missing = append(missing, strings.TrimPrefix(m.path, root))
	}
	if want := []string{"/grant/tools/fsmon", "/ws/real-hooks", "/grant/tools"}; !sameSet(conf, want) {
		t.Errorf("conf = %q, want %q", conf, want)
	}
	if want := []string{"/ws/.husky/_"}; !slices.Equal(missing, want) {
		t.Errorf("missing = %q, want %q", missing, want)
	}
	var notes []string
	for _, n := range found.notes {
		notes = append(notes, strings.TrimPrefix(n.path, root)+": "+n.what)
	}
	if len(notes) != 2 || !strings.Contains(notes[0], "through the link "+filepath.Join(ws, "linked")) || !strings.HasPrefix(notes[1], "/ws: ") {
		t.Errorf("notes = %q, want the link and the workspace itself", notes)
	}
}

// TestConfigBudgetsArePerRepository: a repository a command made, named
// to come first, whose config names thousands of paths, leaves the
// person's repository's hooks path found.
func TestConfigBudgetsArePerRepository(t *testing.T) {
	ws := t.TempDir()
	for _, d := range []string{"aaa/.git", "proj/.git", "proj/.husky/_"} {
		if err := os.MkdirAll(filepath.Join(ws, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var b strings.Builder
	for i := range 300 {
		fmt.Fprintf(&b, "[include]\n\tpath = ../x%d\n", i)
		if err := os.WriteFile(filepath.Join(ws, "aaa", fmt.Sprintf("x%d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b.WriteString(strings.Repeat("[include]\n\tpath = ../x\n", 4100))
	if err := os.WriteFile(filepath.Join(ws, "aaa/.git/config"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "proj/.git/config"), []byte("[core]\n\thooksPath = .husky/_\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	found, err := statGitMetadata([]string{ws}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(found.conf, func(f gitFile) bool { return f.path == filepath.Join(ws, "proj/.husky/_") }) {
		t.Errorf("conf = %v, want proj/.husky/_ in it", found.conf)
	}
	if !slices.ContainsFunc(found.notes, func(n gitNote) bool { return strings.Contains(n.what, "beyond the") }) || len(found.notes) > 3*maxConfigLooks {
		t.Errorf("notes = %d, want aaa's targets beyond the bound noted, and no flood", len(found.notes))
	}
}

// TestBlockedDirectoryIsKeptReadOnly: a directory in a session directory
// whose mode stopped a lookup is kept read-only whole; the session
// directory itself, the read-only metadata and other errors are not.
func TestBlockedDirectoryIsKeptReadOnly(t *testing.T) {
	ws := t.TempDir()
	for _, d := range []string{"proj", ".git"} {
		if err := os.Mkdir(filepath.Join(ws, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	denied := func(p string) error { return &fs.PathError{Op: "lstat", Path: p, Err: syscall.EACCES} }
	var found gitFound
	seen := map[string]bool{}
	meta := []string{filepath.Join(ws, ".git")}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{denied(filepath.Join(ws, "proj/.git")), true},
		{denied(filepath.Join(ws, "proj/.git")), true}, // once
		{denied(filepath.Join(ws, ".husky")), false},   // the session directory's own mode
		{denied(filepath.Join(ws, ".git/hooks")), false},
		{&fs.PathError{Op: "lstat", Path: filepath.Join(ws, "proj/x"), Err: syscall.EIO}, false},
		{denied("/etc/x/y"), false},
	} {
		if got := found.block(tc.err, "test", []string{ws}, meta, seen); got != tc.want {
			t.Errorf("block(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	if len(found.conf) != 1 || found.conf[0].path != filepath.Join(ws, "proj") || len(found.blocked) != 1 {
		t.Errorf("conf = %v, blocked = %v; want proj once", found.conf, found.blocked)
	}
}
