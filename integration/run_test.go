package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/internal/console"
)

// TestRunPassesStdinWhenAsked: -i gives the command sandboxd's stdin, to
// its end; without -i the command's input is empty, so sandboxd in a loop
// that reads a file leaves the rest of it to the loop. -t without a
// terminal to take the size of is 80x24. -e and -w work as in docker run.
func TestRunPassesStdinWhenAsked(t *testing.T) {
	ws := workspace(t)
	subdir(t, ws, "sub")
	tests := []struct {
		name   string
		args   []string
		stdout string
		code   int
		stderr string
	}{
		{"with -i", []string{"-i", "--", "tr", "a-z", "A-Z"}, "HELLO\nWORLD\n", 0, ""},
		{"without -i", []string{"--", "cat"}, "", 0, ""},
		{"-it without a terminal", []string{"-it", "--", "cat"}, "", 2, "stdin is not a terminal"},
		{"-e and -w", []string{"-e", "A=1", "-e", "HOME", "-e", "SANDBOXD_UNSET_X", "-w", "sub", "--", "sh", "-c", `echo "$A $HOME ${SANDBOXD_UNSET_X-unset}"; pwd`}, "1 " + os.Getenv("HOME") + " unset\n" + ws + "/sub\n", 0, ""},
		// The size comes just after the start on API 1.41: asked until set.
		{"-t without a terminal is 80x24", []string{"-t", "--", "sh", "-c", `for i in $(seq 200); do s=$(stty size 2>/dev/null); case "$s" in [1-9]*" "[1-9]*) break;; esac; sleep 0.05; done; echo "$s"`}, "24 80\r\n", 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := runSandboxd(t, ws, strings.NewReader("hello\nworld\n"), nil, append([]string{"run", "--config", testEnv.config}, tc.args...)...)
			if r.code != tc.code || r.stdout != tc.stdout || !strings.Contains(r.stderr, tc.stderr) {
				t.Errorf("exit %d, stdout %q, stderr %q; want %d, %q, one naming %q", r.code, r.stdout, r.stderr, tc.code, tc.stdout, tc.stderr)
			}
			assertNoContainers(t, r.pid)
		})
	}
}

// TestRunOnATerminal: `sandboxd run -it -- sh` is a shell in the sandbox on
// the user's terminal: of its size, resized with it, Ctrl-C for the
// command inside, its exit code passed on, and the terminal's mode as it
// was afterwards.
func TestRunOnATerminal(t *testing.T) {
	ptm, pts, err := console.OpenPTY()
	if err != nil {
		t.Fatal(err)
	}
	defer ptm.Close()
	defer pts.Close()
	if err := console.SetSize(int(ptm.Fd()), console.Size{Cols: 100, Rows: 40}); err != nil {
		t.Fatal(err)
	}
	before := termios(t, pts)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testEnv.bin, "run", "--config", testEnv.config, "-it", "--", "sh")
	cmd.Dir = workspace(t)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pts, pts, pts
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var screen lockedBuffer
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := ptm.Read(buf)
			screen.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	// seen waits for want on the screen past offset from.
	seen := func(what string, from int, want string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(screen.String()[from:], want) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %q not on the screen within 30s: %q", what, want, screen.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	typeLine := func(line string) {
		t.Helper()
		if _, err := ptm.Write([]byte(line + "\r")); err != nil {
			t.Fatal(err)
		}
	}
	seen("a prompt", 0, "$ ")
	typeLine("stty size")
	seen("the terminal's size inside", 0, "40 100\r\n")
	if err := console.SetSize(int(ptm.Fd()), console.Size{Cols: 120, Rows: 50}); err != nil {
		t.Fatal(err)
	}
	// The resize reaches the container after the user's terminal changed:
	// ask until it has.
	eventually(t, "the new size inside", 30*time.Second, func() bool {
		typeLine("stty size")
		time.Sleep(100 * time.Millisecond)
		return strings.Contains(screen.String(), "50 120\r\n")
	})
	// Ctrl-C is the sandboxed shell's: it stops the sleep, not sandboxd.
	// It goes once the shell took the line (its echo, ended by the line
	// editor's newline), lest it cancel the typing instead.
	typeLine("sleep 300; echo slept")
	seen("the sleep line taken", 0, "sleep 300; echo slept\r\n")
	// One that comes before the shell made the sleep the terminal's
	// foreground goes to the shell: Ctrl-C again until the prompt is back.
	mark := len(screen.String())
	eventually(t, "a prompt after Ctrl-C", 30*time.Second, func() bool {
		ptm.Write([]byte{3})
		time.Sleep(200 * time.Millisecond)
		return strings.Contains(screen.String()[mark:], "$ ")
	})
	typeLine("echo still-$((40+2))")
	seen("the shell after Ctrl-C", mark, "still-42")
	typeLine("exit 3")
	err = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 3 {
		t.Errorf("exit code %d (%v), want 3; screen %q", code, err, screen.String())
	}
	if strings.Contains(screen.String(), "\r\nslept\r\n") {
		t.Errorf("the sleep ran to its end: screen %q", screen.String())
	}
	if after := termios(t, pts); after != before {
		t.Errorf("terminal mode after run: %+v, want it as before: %+v", after, before)
	}
	assertNoContainers(t, cmd.Process.Pid)
}

func termios(t *testing.T, f *os.File) syscall.Termios {
	t.Helper()
	var tio syscall.Termios
	if err := ioctl(f, syscall.TCGETS, unsafe.Pointer(&tio)); err != nil {
		t.Fatal(err)
	}
	return tio
}

func ioctl(f *os.File, req uintptr, arg unsafe.Pointer) error {
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), req, uintptr(arg)); errno != 0 {
		return errno
	}
	return nil
}

// TestOwnFilesInTheWorkspaceAreRefused: a workspace that holds sandboxd's
// configuration or its package cache is refused before anything runs: a
// command there could choose sandboxd's next configuration, or the busybox
// the next image build runs on the host.
func TestOwnFilesInTheWorkspaceAreRefused(t *testing.T) {
	ws := workspace(t)
	// The configuration in a workspace of sandboxd's own user: in one
	// of another user's, that user could change it, and it is refused
	// as such first (below).
	own := t.TempDir()
	cfg := filepath.Join(own, "sandbox.toml")
	writeFile(t, cfg, "")
	tests := []struct {
		name, ws string
		args     []string
		env      string
		want     string
	}{
		{"configuration", own, []string{"--config", cfg}, "", "holds " + cfg + ", a file of sandboxd's own"},
		{"package cache", ws, []string{"--config", testEnv.config}, "XDG_CACHE_HOME=" + filepath.Join(ws, ".cache"), "holds " + filepath.Join(ws, ".cache", "sandboxd", "debs") + ", a file of sandboxd's own"},
		{"configuration another user could change", ws, []string{"--config", filepath.Join(ws, "sandbox.toml")}, "", "is owned by uid"},
	}
	writeFile(t, filepath.Join(ws, "sandbox.toml"), "")
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := runSandboxd(t, tc.ws, nil, []string{tc.env}, append(append([]string{"run"}, tc.args...), "--", "touch", "ran")...)
			if r.code != 125 || !strings.Contains(r.output(), tc.want) {
				t.Errorf("exit %d, output %q; want 125 and %q", r.code, r.output(), tc.want)
			}
			if _, err := os.Stat(filepath.Join(tc.ws, "ran")); err == nil {
				t.Error("the command ran")
			}
			assertNoContainers(t, r.pid)
		})
	}
	// The log may lie there: it is opened neither through a link nor as
	// anything but a file, which is all a command could put in its place.
	log := filepath.Join(ws, "sandboxd.log")
	link := filepath.Join(ws, "link.log")
	if err := os.Symlink(filepath.Join(ws, "elsewhere"), link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(ws, "fifo.log")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		log  string
		code int
	}{{log, 0}, {link, 2}, {fifo, 2}} {
		if r := runSandboxd(t, ws, nil, nil, "run", "--config", testEnv.config, "--log", tc.log, "--", "true"); r.code != tc.code || tc.code != 0 && !strings.Contains(r.output(), "--log") {
			t.Errorf("log %s: exit %d, %q; want %d", tc.log, r.code, r.output(), tc.code)
		}
	}
	if _, err := os.Lstat(filepath.Join(ws, "elsewhere")); err == nil {
		t.Error("the log was written through the link")
	}
}

// TestRootsWorkspaceSaysWhyCommandsCannotWrite: in a workspace root owns,
// commands run as the fallback user, and sandboxd says so, since writes
// then fail for a reason the sandbox does not show.
func TestRootsWorkspaceSaysWhyCommandsCannotWrite(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to own a workspace")
	}
	ws := t.TempDir()
	if err := os.Chmod(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	r := runSandboxd(t, ws, nil, nil, "run", "--config", testEnv.config, "--", "id", "-u")
	if r.code != 0 || r.stdout != "65534\n" || !strings.Contains(r.stderr, "the workspace is root's") {
		t.Errorf("exit %d, stdout %q, stderr %q; want uid 65534 and the warning", r.code, r.stdout, r.stderr)
	}
	assertNoContainers(t, r.pid)
}

// TestHostNetworkByAnotherName: a configured network that is the engine's
// host network, named by its id, is refused at start like "host".
func TestHostNetworkByAnotherName(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	host, err := testEnv.cli.NetworkInspect(ctx, "host", client.NetworkInspectOptions{})
	if err != nil {
		t.Skipf("the engine has no host network: %v", err)
	}
	cfg := filepath.Join(t.TempDir(), "sandbox.toml")
	writeFile(t, cfg, fmt.Sprintf("[session]\nnetwork = %q\n", host.Network.ID))
	r := runSandboxd(t, workspace(t), nil, nil, "run", "--config", cfg, "--", "true")
	if r.code != 125 || !strings.Contains(r.output(), cfg+":2: session.network: ") || !strings.Contains(r.output(), "host network") {
		t.Errorf("exit %d, output %q; want 125 naming %s:2: session.network and the host network", r.code, r.output(), cfg)
	}
	assertNoContainers(t, r.pid)
}

// TestRunMountsWhatFlagsGrant: -v grants a host path read-only or
// read-write, --read-only makes the workspace read-only, and a -v the
// configuration's mounts would not allow is refused, naming the flag,
// before anything runs.
func TestRunMountsWhatFlagsGrant(t *testing.T) {
	ws, data := workspace(t), workspace(t)
	writeFile(t, filepath.Join(data, "f"), "hi\n")
	rel, err := filepath.Rel(ws, data)
	if err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(ws, "link")
	if err := os.Symlink(data, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		args   []string
		code   int
		want   string
		wrote  string // a file the command made on the host
		refuse string // a file it must not have made
	}{
		{"read-only", []string{"-v", data + ":/data:ro", "--", "sh", "-c", "cat /data/f; touch /data/x"}, 1, "hi\n", "", filepath.Join(data, "x")},
		{"read-write, relative", []string{"-v", rel + ":/data", "--", "touch", "/data/y"}, 0, "", filepath.Join(data, "y"), ""},
		{"workspace read-only", []string{"--read-only", "--", "touch", "z"}, 1, "Read-only file system", "", filepath.Join(ws, "z")},
		{"host directory", []string{"-v", "/proc:/p", "--", "touch", "ran"}, 2, `-v "/proc:/p": source "/proc" is or holds the host's /proc`, "", filepath.Join(ws, "ran")},
		{"a user's link", []string{"-v", link + ":/data", "--", "touch", "ran"}, 2, "-v " + strconv.Quote(link+":/data") + ": source " + strconv.Quote(link) + " passes the link", "", filepath.Join(ws, "ran")},
		{"the workspace again, read-only", []string{"-v", ".:/src:ro", "--", "test", "-L", "/src/link"}, 0, "", "", ""},
		{"over the workspace", []string{"-v", data + ":" + ws, "--", "touch", "ran"}, 2, "is or holds the workspace", "", filepath.Join(ws, "ran")},
		{"missing source", []string{"-v", "/nonexistent:/data", "--", "touch", "ran"}, 2, `source "/nonexistent": no such file or directory`, "", filepath.Join(ws, "ran")},
		{"a scratch path", []string{"-v", data + ":/tmp", "--", "touch", "ran"}, 2, `target "/tmp" is also a scratch path`, "", filepath.Join(ws, "ran")},
		{"bad mode", []string{"-v", data + ":/data:rx", "--", "touch", "ran"}, 2, `mode "rx" is not ro or rw`, "", filepath.Join(ws, "ran")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := runSandboxd(t, ws, nil, nil, append([]string{"run", "--config", testEnv.config}, tc.args...)...)
			if r.code != tc.code || !strings.Contains(r.output(), tc.want) {
				t.Errorf("exit %d, output %q; want %d and %q", r.code, r.output(), tc.code, tc.want)
			}
			if tc.wrote != "" {
				if _, err := os.Stat(tc.wrote); err != nil {
					t.Errorf("the command did not write %s: %v", tc.wrote, err)
				}
			}
			if tc.refuse != "" {
				if _, err := os.Stat(tc.refuse); err == nil {
					t.Errorf("%s was written", tc.refuse)
				}
			}
			assertNoContainers(t, r.pid)
		})
	}
	// The workspace granted again, writable: its git metadata, read-only
	// at the workspace's path, is read-only at the mount's as well, also
	// when the workspace itself is read-only.
	config := filepath.Join(subdir(t, ws, ".git"), "config")
	writeFile(t, config, "[core]\n")
	own(t, config)
	for _, flags := range [][]string{{"-v", ".:/src"}, {"--read-only", "-v", ".:/src"}} {
		args := append(append([]string{"run", "--config", testEnv.config}, flags...), "--", "sh", "-c", "{ echo x >> /src/.git/config && echo changed; touch /src/made && echo wrote; } 2>/dev/null")
		if r := runSandboxd(t, ws, nil, nil, args...); r.code != 0 || r.stdout != "wrote\n" {
			t.Errorf("%v: exit %d, output %q; want 0 and only \"wrote\"", flags, r.code, r.output())
		}
		if b, err := os.ReadFile(config); err != nil || string(b) != "[core]\n" {
			t.Errorf("%v: .git/config holds %q (%v)", flags, b, err)
		}
	}
	// The metadata itself granted writable: no place for a read-only
	// mount over it there.
	for _, src := range []string{".git", ".git/config"} {
		r := runSandboxd(t, ws, nil, nil, "run", "--config", testEnv.config, "-v", src+":/g", "--", "true")
		if r.code != 2 || !strings.Contains(r.output(), "is git metadata of the workspace") {
			t.Errorf("-v %s:/g: exit %d, output %q; want 2 and a refusal", src, r.code, r.output())
		}
	}
}

// TestRunInAnImageOfItsOwn: an image made for a tool, with an entrypoint
// that runs the tool and a PATH of its own, still keeps its container up
// and runs the command given, found through the image's PATH.
func TestRunInAnImageOfItsOwn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ref = "sandboxd-test/tool-image:1"
	created, err := testEnv.cli.ContainerCreate(ctx, client.ContainerCreateOptions{Image: images.DefaultRef})
	if err != nil {
		t.Fatal(err)
	}
	defer testEnv.cli.ContainerRemove(context.Background(), created.ID, client.ContainerRemoveOptions{Force: true})
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	tool := []byte("#!/bin/sh\necho \"the tool ran: $*\"\n")
	for _, h := range []*tar.Header{
		{Name: "opt/tool/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "opt/tool/bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "opt/tool/bin/mytool", Mode: 0o755, Size: int64(len(tool))},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	tw.Write(tool)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := testEnv.cli.CopyToContainer(ctx, created.ID, client.CopyToContainerOptions{DestinationPath: "/", Content: &layer}); err != nil {
		t.Fatal(err)
	}
	if _, err := testEnv.cli.ContainerCommit(ctx, created.ID, client.ContainerCommitOptions{Reference: ref, Changes: []string{
		`ENV PATH=/opt/tool/bin:/usr/local/bin:/usr/bin:/bin`,
		`ENTRYPOINT ["mytool"]`,
	}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		testEnv.cli.ImageRemove(context.Background(), ref, client.ImageRemoveOptions{Force: true})
	})
	ws := workspace(t)
	r := runSandboxd(t, ws, nil, nil, "run", "--config", testEnv.config, "--image", ref, "--", "mytool", "build")
	if r.code != 0 || r.stdout != "the tool ran: build\n" {
		t.Errorf("exit %d, stdout %q, stderr %q; want 0 and the tool's line", r.code, r.stdout, r.stderr)
	}
	assertNoContainers(t, r.pid)
}
