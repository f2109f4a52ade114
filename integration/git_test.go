package integration

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
)

// hostRepo is a repository on the host, in a workspace of uid 1000, and
// the home its owner's git runs with.
type hostRepo struct {
	dir, home string
}

// newHostRepo makes a workspace holding a repository with the file a
// committed, after config (pairs of key and value) is set in it.
func newHostRepo(t *testing.T, config ...string) hostRepo {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git on this host")
	}
	r := hostRepo{dir: workspace(t), home: t.TempDir()}
	own(t, r.home)
	// The test's temporary directories lie in one only root may enter.
	if err := os.Chmod(filepath.Dir(r.dir), 0o755); err != nil {
		t.Fatal(err)
	}
	r.git(t, "init", "-q")
	for i := 0; i+1 < len(config); i += 2 {
		r.git(t, "config", config[i], config[i+1])
	}
	writeFile(t, filepath.Join(r.dir, "a"), "a\n")
	own(t, filepath.Join(r.dir, "a"))
	r.git(t, "add", "a")
	r.git(t, "commit", "-q", "-m", "a")
	return r
}

// git runs git in the repository as its owner would on the host, with no
// configuration but the repository's.
func (r hostRepo) git(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@t"}, args...)...)
	cmd.Dir = r.dir
	cmd.Env = append(os.Environ(), "HOME="+r.home, "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_SYSTEM=/dev/null")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v: %s", args, err, out)
	}
	return string(out)
}

// marker is a file a hook would make: in the owner's home, outside the
// workspace.
func (r hostRepo) marker() string { return filepath.Join(r.home, "pwned") }

// assertNotRun fails the test when host git ran what a command wrote.
func (r hostRepo) assertNotRun(t *testing.T) {
	t.Helper()
	r.git(t, "status", "--short")
	if _, err := os.Stat(r.marker()); err == nil {
		t.Error("host git ran what a command wrote")
	}
}

// runIn runs `sandboxd run -- sh -c line` in dir.
func runIn(t *testing.T, dir, line string) ranSandboxd {
	t.Helper()
	r := runSandboxd(t, dir, nil, nil, "run", "--config", testEnv.config, "--", "sh", "-c", line)
	assertNoContainers(t, r.pid)
	return r
}

// advisesGit matches a message that tells the person to run git.
var advisesGit = regexp.MustCompile("`git |run git|git update-index|git init")

// TestHooksPathIsProtected: the directory core.hooksPath names in the
// workspace (husky v9's .husky/_, git-ignored and made at install) is as
// read-only as .git, made empty by sandboxd when it is not there yet, so
// that no command can put a hook there that the owner's next `git status`
// runs on the host.
func TestHooksPathIsProtected(t *testing.T) {
	for _, tc := range []struct {
		name, hooks string
		made        bool
	}{
		{"not made yet", ".husky/_", false},
		{"made", ".husky/_", true},
		{"absolute", "", false}, // the workspace's own hooks
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newHostRepo(t)
			hooks := tc.hooks
			if hooks == "" {
				hooks = filepath.Join(r.dir, "hooks")
			}
			r.git(t, "config", "core.hooksPath", hooks)
			if tc.made {
				subdir(t, subdir(t, r.dir, ".husky"), "_")
			}
			hook := filepath.Join(hooks, "post-index-change")
			out := runIn(t, r.dir, fmt.Sprintf(`mkdir -p %[1]s; printf '#!/bin/sh\ntouch %[2]s\n' > %[3]s; chmod +x %[3]s; touch a; echo ran`, hooks, r.marker(), hook))
			if !strings.Contains(out.stdout, "ran") {
				t.Fatalf("the session did not run: exit %d: %s", out.code, out.output())
			}
			r.assertNotRun(t)
			if !filepath.IsAbs(hooks) {
				hooks = filepath.Join(r.dir, hooks)
			}
			if fi, err := os.Stat(hooks); err != nil || !fi.IsDir() {
				t.Errorf("the hooks directory is not there (%v)", err)
			}
		})
	}
}

// TestIncludedConfigIsProtected: a config file that the repository's
// config includes from the workspace is read-only too (made empty when it
// is not there yet): a command could otherwise set core.fsmonitor there,
// or a hooks directory of its own.
func TestIncludedConfigIsProtected(t *testing.T) {
	for _, tc := range []struct {
		name string
		made bool
		set  string
	}{
		{"fsmonitor, not made yet", false, `[core]\n\tfsmonitor = "touch %s; false"\n`},
		{"hooksPath, made", true, `[core]\n\thooksPath = evil\n`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newHostRepo(t, "include.path", "../.gitconfig.local")
			local := filepath.Join(r.dir, ".gitconfig.local")
			if tc.made {
				writeFile(t, local, "")
				own(t, local)
			}
			set := tc.set
			if strings.Contains(set, "%s") {
				set = fmt.Sprintf(set, r.marker())
			}
			line := fmt.Sprintf(`printf '%s' > .gitconfig.local; mkdir evil; printf '#!/bin/sh\ntouch %s\n' > evil/post-index-change; chmod +x evil/post-index-change; touch a; echo ran`, set, r.marker())
			if out := runIn(t, r.dir, line); !strings.Contains(out.stdout, "ran") {
				t.Fatalf("the session did not run: exit %d: %s", out.code, out.output())
			}
			r.assertNotRun(t)
		})
	}
}

// TestPlantedRepositoryDoesNotBlockASession: a repository a command left
// that sandboxd cannot read whole (an index of an unknown version, a
// version 4 index with a path longer than any file system takes, more
// repositories than it protects), or that the session's user may not
// enter, does not keep the next session from starting: its .git is still
// read-only, the log names what was left unprotected as untrusted, and no
// message tells the person to run git there.
func TestPlantedRepositoryDoesNotBlockASession(t *testing.T) {
	index := func(version uint32, body []byte) string {
		b := append([]byte("DIRC"), binary.BigEndian.AppendUint32(nil, version)...)
		return string(append(b, body...))
	}
	// One entry of a version 4 index: the fixed part, then a prefix
	// length of 0 and a path longer than 64 KiB.
	long := binary.BigEndian.AppendUint32(nil, 1)
	long = append(long, make([]byte, 40+20)...)
	long = binary.BigEndian.AppendUint16(long, 0xfff)
	long = append(append(long, 0), strings.Repeat("p", 70<<10)...)
	long = append(long, 0)
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, ws string)
		warn  string
	}{
		{"index version 9", func(t *testing.T, ws string) {
			writeFile(t, filepath.Join(subdir(t, subdir(t, ws, "evil"), ".git"), "index"), index(9, make([]byte, 4)))
		}, "evil/.git/index"},
		{"version 4 index with a long path", func(t *testing.T, ws string) {
			writeFile(t, filepath.Join(subdir(t, subdir(t, ws, "evil"), ".git"), "index"), index(4, long))
		}, "evil/.git/index"},
		{"more repositories than protected", func(t *testing.T, ws string) {
			for i := range 300 {
				subdir(t, subdir(t, ws, fmt.Sprintf("evil%03d", i)), ".git")
			}
		}, "evil299"},
		// Protected whole, though stat cannot look at it from inside.
		{"a repository no one may enter", func(t *testing.T, ws string) {
			subdir(t, subdir(t, ws, "evil"), ".git")
			if err := os.Chmod(filepath.Join(ws, "evil"), 0); err != nil {
				t.Fatal(err)
			}
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := workspace(t)
			tc.plant(t, ws)
			out := runIn(t, ws, "{ chmod 755 evil; echo x >> evil/.git/config && echo changed; echo x >> evil000/.git/config && echo changed; touch ok && echo ran; } 2>/dev/null")
			if out.code != 0 || out.stdout != "ran\n" {
				t.Errorf("exit %d, stdout %q; want the session to start with the planted .git read-only: %s", out.code, out.stdout, out.stderr)
			}
			if tc.warn != "" && (!strings.Contains(out.stderr, filepath.Join(ws, tc.warn)) || !strings.Contains(out.stderr, "untrusted")) {
				t.Errorf("no warning naming %s as untrusted: %s", tc.warn, out.stderr)
			}
			if advisesGit.MatchString(out.output()) {
				t.Errorf("a message advises running git: %s", out.output())
			}
		})
	}
}

// runAsOwner runs `sandboxd run -- sh -c line` in dir as uid 1000, the
// workspace's owner, in the engine socket's group (the usual docker-group
// setup), with home as its home: it then has no more rights on the
// workspace than its commands.
func runAsOwner(t *testing.T, dir, home, line string) string {
	t.Helper()
	sock, err := os.Stat("/var/run/docker.sock")
	if err != nil || os.Getenv("DOCKER_HOST") != "" {
		t.Skip("the engine is not at the local socket, which a docker group would give access to")
	}
	// The user must reach the binary and the config.
	bin, config := copyForUser(t, home)
	cmd := exec.Command(bin, "run", "--config", config, "--", "sh", "-c", line)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+home)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{sock.Sys().(*syscall.Stat_t).Gid}}}
	out, _ := cmd.CombinedOutput()
	assertNoContainers(t, cmd.Process.Pid)
	return string(out)
}

// TestPlantedModeDoesNotHideGit: a directory a session's command set to
// mode 000 (a repository below the session directory, the directory of
// the hooks path) is kept read-only whole, mode and all, by the next
// session of sandboxd run as the workspace's owner, who cannot look below
// it either: a command there cannot set the mode back and plant a hook
// or core.fsmonitor that host git runs.
func TestPlantedModeDoesNotHideGit(t *testing.T) {
	for _, tc := range []struct {
		name, hide, plant string
		nested            bool
	}{
		{"repository below", "proj", `printf '[core]\n\tfsmonitor = "touch %[1]s; false"\n' >> proj/.git/config`, true},
		{"hooks path", ".husky", `printf '#!/bin/sh\ntouch %[1]s\n' > .husky/_/post-index-change; chmod +x .husky/_/post-index-change`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newHostRepo(t, "core.hooksPath", ".husky/_")
			subdir(t, subdir(t, r.dir, ".husky"), "_")
			ws := r.dir
			if tc.nested {
				// The session directory is a folder of projects.
				ws = workspace(t)
				proj := filepath.Join(ws, "proj")
				if err := os.Rename(r.dir, proj); err != nil {
					t.Fatal(err)
				}
				r.dir = proj
			}
			if out := runAsOwner(t, ws, r.home, "chmod 000 "+tc.hide+" && echo ran"); !strings.Contains(out, "ran") {
				t.Fatalf("the first session did not run: %s", out)
			}
			out := runAsOwner(t, ws, r.home, "chmod 755 "+tc.hide+"; "+fmt.Sprintf(tc.plant, r.marker())+"; touch "+tc.hide+"/a; echo ran")
			if !strings.Contains(out, "ran") {
				t.Fatalf("the second session did not run: %s", out)
			}
			if err := os.Chmod(filepath.Join(ws, tc.hide), 0o755); err != nil {
				t.Fatal(err)
			}
			r.assertNotRun(t)
		})
	}
}

// TestPlantedRepositoryDoesNotUseUpTheScan: a repository a command made
// beside the person's, named to come first, whose config names thousands
// of paths, uses up only its own bounds: the person's hooks path is still
// read-only.
func TestPlantedRepositoryDoesNotUseUpTheScan(t *testing.T) {
	r := newHostRepo(t, "core.hooksPath", ".husky/_")
	subdir(t, subdir(t, r.dir, ".husky"), "_")
	ws := workspace(t)
	proj := filepath.Join(ws, "proj")
	if err := os.Rename(r.dir, proj); err != nil {
		t.Fatal(err)
	}
	r.dir = proj
	aaa := subdir(t, ws, "aaa")
	subdir(t, aaa, ".git")
	writeFile(t, filepath.Join(aaa, ".git", "config"), strings.Repeat("[include]\n\tpath = ../x\n", 4100))
	line := fmt.Sprintf(`printf '#!/bin/sh\ntouch %[1]s\n' > proj/.husky/_/post-index-change; chmod +x proj/.husky/_/post-index-change; echo ran`, r.marker())
	if out := runIn(t, ws, line); !strings.Contains(out.stdout, "ran") {
		t.Fatalf("the session did not run: exit %d: %s", out.code, out.output())
	}
	r.assertNotRun(t)
}
