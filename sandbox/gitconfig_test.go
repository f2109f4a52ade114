package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseGitConfig(t *testing.T) {
	v := func(section, sub, key, value string) gitConfigVar {
		return gitConfigVar{section: section, subsection: sub, key: key, value: value}
	}
	for _, tc := range []struct {
		name, text string
		want       []gitConfigVar
	}{
		{"plain", "[core]\n\thooksPath = .husky/_\n", []gitConfigVar{v("core", "", "hookspath", ".husky/_")}},
		{"case", "[Core]\n\tHooksPath=x\n", []gitConfigVar{v("core", "", "hookspath", "x")}},
		{"on the header's line", "[core] hooksPath = x", []gitConfigVar{v("core", "", "hookspath", "x")}},
		{"subsection", "[includeIf \"gitdir:~/W/\"]\n\tpath = a\n", []gitConfigVar{v("includeif", "gitdir:~/W/", "path", "a")}},
		{"subsection escapes", `[a "x\"y\\z\q"] k = 1`, []gitConfigVar{v("a", `x"y\zq`, "k", "1")}},
		{"old subsection", "[Diff.Foo]\ntextconv = ./t\n", []gitConfigVar{v("diff", "foo", "textconv", "./t")}},
		{"quotes and blanks", "[a]\nk =  \"  x \" y  # c\n", []gitConfigVar{v("a", "", "k", "  x  y")}},
		{"each inner blank a space", "[a]\nk = x \t y\n", []gitConfigVar{v("a", "", "k", "x   y")}},
		{"comment marks quoted", "[a]\nk = \"x # ; y\" ; z\n", []gitConfigVar{v("a", "", "k", "x # ; y")}},
		{"escapes", `[a] k = "\t\n\b\"\\"`, []gitConfigVar{v("a", "", "k", "\t\n\b\"\\")}},
		{"continued", "[a]\nk = x\\\ny\n", []gitConfigVar{v("a", "", "k", "xy")}},
		{"CRLF", "[a]\r\nk = x\r\nj = y\\\r\nz\r\n", []gitConfigVar{v("a", "", "k", "x"), v("a", "", "j", "yz")}},
		{"valueless", "[a]\nk\n", []gitConfigVar{{section: "a", key: "k", valueless: true}}},
		{"BOM", "\xef\xbb\xbf[a]k=1", []gitConfigVar{v("a", "", "k", "1")}},
		{"no section", "k = 1\n[a]\nk = 2\n", []gitConfigVar{v("a", "", "k", "2")}},
		// git refuses these lines; the rest is still read.
		{"bad escape", "[a]\nk = \\q\nj = 2\n", []gitConfigVar{v("a", "", "j", "2")}},
		{"open quote", "[a]\nk = \"x\nj = 2\n", []gitConfigVar{v("a", "", "j", "2")}},
		{"bad header", "[a b]\nk = 1\n[c]\nj = 2\n", []gitConfigVar{v("c", "", "j", "2")}},
		{"comments", "# [a]\n; k = 1\n[b]\n# x = 1\nk = 2\n", []gitConfigVar{v("b", "", "k", "2")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseGitConfig([]byte(tc.text)); !slices.Equal(got, tc.want) {
				t.Errorf("parseGitConfig(%q) = %+v, want %+v", tc.text, got, tc.want)
			}
		})
	}
}

// TestParseGitConfigAsGit: what git itself reads from a file, sandboxd
// reads alike.
func TestParseGitConfigAsGit(t *testing.T) {
	git, err := exec.LookPath("git")
	if err != nil {
		t.Skip("no git on this host")
	}
	text := "[core]hooksPath = \"a b\" # c\n[Include]\n\tpath = \"x\\ty\" ; d\n[diff \"A.b\"]\n\ttextconv = ./t  u\n[alias] x = !./run \\\n  it\n"
	file := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(git, "config", "--file", file, "--no-includes", "--list", "-z").Output()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, kv := range strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		want = append(want, strings.Replace(kv, "\n", "=", 1))
	}
	var got []string
	for _, v := range parseGitConfig([]byte(text)) {
		got = append(got, strings.ToLower(v.section)+"."+func() string {
			if v.subsection != "" {
				return v.subsection + "."
			}
			return ""
		}()+v.key+"="+v.value)
	}
	if !slices.Equal(got, want) {
		t.Errorf("sandboxd reads %q, git %q", got, want)
	}
}

// FuzzParseGitConfig: no file makes parseGitConfig panic, nor any value
// commandProgram, and a value written as git quotes it reads back as it
// was.
func FuzzParseGitConfig(f *testing.F) {
	f.Add([]byte("[core]\n\thooksPath = .husky/_\n[include]\npath = x\n"), "a \"b\"\\c\td")
	f.Add([]byte("[a \"b\\\"\"] k = \"x\\\n y\" # z\r\n"), "  lead")
	f.Fuzz(func(t *testing.T, file []byte, value string) {
		parseGitConfig(file)
		if p, ok := commandProgram(value); ok && !strings.Contains(p, "/") {
			t.Errorf("commandProgram(%q) = %q, a path without a slash", value, p)
		}
		if strings.ContainsAny(value, "\x00\n") {
			return
		}
		quoted := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\t", `\t`, "\b", `\b`).Replace(value)
		vars := parseGitConfig([]byte("[core]\n\thooksPath = \"" + quoted + "\"\n"))
		if len(vars) != 1 || vars[0].value != value {
			t.Errorf("value %q read back as %+v", value, vars)
		}
	})
}

func TestCommandProgram(t *testing.T) {
	for _, tc := range []struct {
		line, want string
		ok         bool
	}{
		{"./tools/fsmonitor", "./tools/fsmonitor", true},
		{"  ./x --flag arg", "./x", true},
		{"'./my tools/x' a", "./my tools/x", true},
		{`"./a b"/c`, "./a b/c", true},
		{`./a\ b`, "./a b", true},
		{"A=1 B='x y' ./x", "./x", true},
		{"./x|y", "./x", true},
		{"~/bin/x", "~/bin/x", true},
		{"/usr/bin/watchman", "/usr/bin/watchman", true},
		{"watchman", "watchman", false}, // looked up in PATH
		{"sh ./x", "sh", false},         // the person's interpreter reads what it reads
		{"$HOME/x", "", false},
		{"`which x`", "", false},
		{`"$X"/y`, "", false},
		{"./x*", "", false},
		{"f() { ./x; }; f", "f", false},
		{"(./x)", "", false},
		{"'unclosed", "", false},
		{"", "", false},
	} {
		if got, ok := commandProgram(tc.line); got != tc.want && tc.ok || ok != tc.ok {
			t.Errorf("commandProgram(%q) = %q, %v; want %q, %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}

func TestGitProgram(t *testing.T) {
	v := func(section, sub, key, value string) gitConfigVar {
		return gitConfigVar{section: section, subsection: sub, key: key, value: value}
	}
	for _, tc := range []struct {
		v    gitConfigVar
		want string
	}{
		{v("core", "", "fsmonitor", "./fsmon"), "./fsmon"},
		{v("core", "", "fsmonitor", "true"), ""},
		{v("core", "", "fsmonitor", "./fsmon"), "./fsmon"},
		{v("filter", "lfs", "clean", "./bin/clean %f"), "./bin/clean"},
		{v("filter", "", "clean", "./bin/clean"), ""},
		{v("diff", "x", "textconv", "tools/conv"), "tools/conv"},
		{v("alias", "", "st", "!./st.sh"), "./st.sh"},
		{v("alias", "", "st", "status"), ""},
		{v("credential", "", "helper", "store"), ""},
		{v("credential", "", "helper", "/opt/helper"), "/opt/helper"},
		{v("credential", "https://x", "helper", "!./h get"), "./h"},
		{v("submodule", "lib", "update", "!./up"), "./up"},
		{v("submodule", "lib", "update", "rebase"), ""},
		{v("mergetool", "m", "path", "./my tool"), "./my tool"},
		{v("pager", "", "log", "./pager"), "./pager"},
		{v("pager", "", "log", "false"), ""},
		{v("hook", "lint", "command", "./lint.sh"), "./lint.sh"},
		{v("remote", "origin", "uploadpack", "./up"), "./up"},
		{v("core", "", "worktree", "./x"), ""},
		{v("user", "", "name", "./x"), ""},
	} {
		got, ok := gitProgram(tc.v)
		if ok != (tc.want != "") || got != tc.want && ok {
			t.Errorf("gitProgram(%s = %q) = %q, %v; want %q", tc.v.name(), tc.v.value, got, ok, tc.want)
		}
	}
}

func TestConfigTargets(t *testing.T) {
	root := t.TempDir()
	home := filepath.Join(root, "home")
	file := func(p, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	homes := func(name string) []string {
		if name == "" {
			return []string{home}
		}
		return nil
	}
	paths := func(targets []gitTarget) []string {
		var out []string
		for _, t := range targets {
			kind := "f"
			if t.dir {
				kind = "d"
			}
			out = append(out, kind+" "+strings.TrimPrefix(t.path, root))
		}
		return out
	}
	file("ws/.git/config", "[core]\n\thooksPath = .husky/_\n[include]\n\tpath = ../.gitconfig.local\n[includeIf \"onbranch:main\"]\n\tpath = ~/inc\n"+
		"[core]\n\tfsmonitor = ./fsmon\n[alias]\n\tx = !~/bin/x\n[init]\n\ttemplateDir = /abs/templates\n[include]\n\tpath = %(prefix)/etc/x\n\tpath = ~nobody-here/x\n")
	file("ws/.gitconfig.local", "[core]\n\thooksPath = /abs/hooks\n[include]\n\tpath = sub/more\n")
	file("ws/sub/more", "[filter \"a\"]\n\tclean = tools/clean\n[include]\n\tpath = ../.gitconfig.local\n")
	file("home/inc", "[core]\n\teditor = ../ed\n")
	got, notes := configTargets(gitRepo{gitdir: filepath.Join(root, "ws/.git"), worktree: filepath.Join(root, "ws")}, homes, budget())
	want := []string{
		"f /ws/.git/../.gitconfig.local", "f /ws/.git/../sub/more", "f /ws/.git/../sub/../.gitconfig.local", "f /home/inc",
		"d /ws/.husky/_", "d /abs/hooks", "f /ws/tools/clean", "f /ws/../ed", "f /ws/./fsmon", "f /home/bin/x", "d /abs/templates",
	}
	if g := paths(got); !sameSet(g, want) || notes != nil {
		t.Errorf("configTargets = %q, %v; want %q", g, notes, want)
	}
	// A worktree's config (extensions.worktreeConfig) and its common
	// directory's; a core.worktree elsewhere; a bare repository.
	file("main/.git/config", "[core]\n\thooksPath = hooks\n\tworktree = ../../tree\n")
	file("main/.git/worktrees/w/config.worktree", "[core]\n\tsshCommand = ./ssh\n")
	got, _ = configTargets(gitRepo{gitdir: filepath.Join(root, "main/.git/worktrees/w"), common: filepath.Join(root, "main/.git"), worktree: filepath.Join(root, "w")}, homes, budget())
	want = []string{"d /w/hooks", "d /main/.git/worktrees/w/../../tree/hooks", "f /w/./ssh", "f /main/.git/worktrees/w/../../tree/./ssh"}
	if g := paths(got); !sameSet(g, want) {
		t.Errorf("worktree: configTargets = %q, want %q", g, want)
	}
	file("bare.git/config", "[core]\n\tbare = true\n\thooksPath = hooks\n")
	got, _ = configTargets(gitRepo{gitdir: filepath.Join(root, "bare.git")}, homes, budget())
	if g, want := paths(got), []string{"d /bare.git/hooks"}; !slices.Equal(g, want) {
		t.Errorf("bare: configTargets = %q, want %q", g, want)
	}
}

// sameSet reports whether a and b hold the same strings.
func sameSet(a, b []string) bool {
	a, b = slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b))
	return slices.Equal(a, b)
}

// TestConfigTargetsAreBounded: includes that go on and on, or in a
// circle, end.
func TestConfigTargetsAreBounded(t *testing.T) {
	dir := t.TempDir()
	for i := range maxConfigFiles + 10 {
		text := fmt.Sprintf("[include]\n\tpath = %d\n\tpath = 0\n", i+1)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprint(i)), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Rename(filepath.Join(dir, "0"), filepath.Join(dir, "config")); err != nil {
		t.Fatal(err)
	}
	got, _ := configTargets(gitRepo{gitdir: dir}, func(string) []string { return nil }, budget())
	if len(got) > 2*(maxIncludeDepth+1) {
		t.Errorf("%d targets from a chain of includes, want no more than the depth git reads", len(got))
	}
}

// TestHomeDirs: "~" is sandboxd's home and the owner's, "~name" that
// user's, and an unknown user none.
func TestHomeDirs(t *testing.T) {
	own, err := os.UserHomeDir()
	if err != nil {
		t.Skip(err)
	}
	if got := homeDirs(os.Getuid())(""); !slices.Contains(got, own) {
		t.Errorf(`homeDirs("") = %q, want %q among them`, got, own)
	}
	if got := homeDirs(os.Getuid())("root"); !slices.Equal(got, []string{"/root"}) {
		t.Errorf(`homeDirs("root") = %q, want /root`, got)
	}
	if got := homeDirs(os.Getuid())("no-such-user-here"); got != nil {
		t.Errorf("homeDirs of an unknown user = %q", got)
	}
}
