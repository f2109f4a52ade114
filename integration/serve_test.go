package integration

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	acpsdk "github.com/coder/acp-go-sdk"
	"github.com/moby/moby/client"
)

func TestTerminalBasics(t *testing.T) {
	ws := workspace(t)
	if err := os.Mkdir(filepath.Join(ws, "sub dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const sid = "basics"

	tests := []struct {
		name     string
		req      acpsdk.CreateTerminalRequest
		want     string
		wantExit string
	}{
		// First: the create that opens the session names a cwd, which
		// the creates after it that name none do not inherit.
		{"cwd", acpsdk.CreateTerminalRequest{Command: "pwd", Cwd: ptr(filepath.Join(ws, "sub dir"))}, filepath.Join(ws, "sub dir") + "\n", "exit 0"},
		{"output and exit code", acpsdk.CreateTerminalRequest{Command: "/bin/sh", Args: []string{"-c", "echo hello; exit 3"}}, "hello\n", "exit 3"},
		{"stderr merged", acpsdk.CreateTerminalRequest{Command: "/bin/sh", Args: []string{"-c", "echo out; echo err >&2; echo out2"}}, "out\nerr\nout2\n", "exit 0"},
		{"args passed exactly", acpsdk.CreateTerminalRequest{Command: "printf", Args: []string{"[%s]", "a b", `it's "q"`, "$HOME", "*", ""}}, `[a b][it's "q"][$HOME][*][]`, "exit 0"},
		{"command line runs in sh", acpsdk.CreateTerminalRequest{Command: "echo one && echo two | tr a-z A-Z"}, "one\nTWO\n", "exit 0"},
		{"env", acpsdk.CreateTerminalRequest{Command: "/bin/sh", Args: []string{"-c", `printf '%s\n' "$GREETING"`}, Env: []acpsdk.EnvVariable{{Name: "GREETING", Value: "hi there; $x"}}}, "hi there; $x\n", "exit 0"},
		{"default cwd is the workspace", acpsdk.CreateTerminalRequest{Command: "pwd"}, ws + "\n", "exit 0"},
		{"missing command is 126 or 127", acpsdk.CreateTerminalRequest{Command: "/no/such/command"}, "", "exit 12"},
		{"runs as the workspace owner", acpsdk.CreateTerminalRequest{Command: "id", Args: []string{"-u"}}, "1000\n", "exit 0"},
		{"workspace is writable", acpsdk.CreateTerminalRequest{Command: "/bin/sh", Args: []string{"-c", "echo x > f && cat f && rm f"}}, "x\n", "exit 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.SessionId = sid
			out, st := runCmd(t, ctx, a, tc.req)
			got := exitCode(st)
			if !strings.HasPrefix(got, tc.wantExit) {
				t.Errorf("status = %s, want %s", got, tc.wantExit)
			}
			if tc.want != "" && out.Output != tc.want {
				t.Errorf("output = %q, want %q", out.Output, tc.want)
			}
			if out.Truncated {
				t.Errorf("truncated = true")
			}
			if out.ExitStatus == nil || exitCode(acpsdk.WaitForTerminalExitResponse{ExitCode: out.ExitStatus.ExitCode, Signal: out.ExitStatus.Signal}) != got {
				t.Errorf("terminal/output exitStatus = %+v, want the same as wait_for_exit (%s)", out.ExitStatus, got)
			}
		})
	}
}

func TestOutputLimitKeepsValidUTF8Tail(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// 18 bytes a line, three multi-byte characters in it: 555556 lines are
	// just over 10 MB.
	const line = "héllo wörld ✓\n"
	out, st := runCmd(t, ctx, a, acpsdk.CreateTerminalRequest{
		SessionId:       "utf8",
		Command:         "/bin/sh",
		Args:            []string{"-c", "yes 'héllo wörld ✓' | head -n 555556"},
		OutputByteLimit: ptr(1024),
	})
	if got := exitCode(st); got != "exit 0" {
		t.Fatalf("status = %s", got)
	}
	if !out.Truncated {
		t.Error("truncated = false after 10 MB through a 1 KiB limit")
	}
	if n := len(out.Output); n > 1024 || n < 1024-3 {
		t.Errorf("len(output) = %d, want 1021..1024", n)
	}
	if !utf8.ValidString(out.Output) {
		t.Error("output is not valid UTF-8")
	}
	if !strings.HasSuffix(out.Output, line) {
		t.Errorf("output does not end with the last line: %q", out.Output[max(0, len(out.Output)-40):])
	}
	if !strings.HasSuffix(strings.Repeat(line, 1024/len(line)+2), out.Output) {
		t.Errorf("output is not a tail of the stream: %q", out.Output[:40])
	}
}

func TestKill(t *testing.T) {
	tests := []struct {
		name, line, ready, leftover, want string
	}{
		{"background children", "echo started; sleep 300 & sleep 300 & wait", "started\n", "sleep 300", "signal SIGTERM"},
		// Ignores SIGTERM and starts a process in a session of its own.
		{"SIGTERM ignored, child escaped its session", "trap '' TERM; setsid sleep 301 & echo ready; while :; do sleep 1; done", "ready\n", "sleep 301", "signal SIGKILL"},
		// The marker is gone, but the process is still the child of
		// the command's reaper.
		{"command removed the marker", "exec env -u SANDBOXD_TERMINAL sh -c 'echo ready; exec sleep 302'", "ready\n", "sleep 302", "signal SIGTERM"},
		// Removed the marker and was orphaned; ignores SIGTERM, so by
		// the SIGKILL its parents are gone and the reaper with them:
		// the kill finds it again as what the SIGTERM reached.
		{"orphan removed the marker and ignores SIGTERM", "(env -u SANDBOXD_TERMINAL sh -c \"trap '' TERM; echo ready; exec sleep 303\" &); while :; do sleep 1; done", "ready\n", "sleep 303", "signal SIGTERM"},
		// Removed the marker, and forks on SIGTERM while the command
		// exits: the child outlives the command's reaper and is the
		// container init's, no marker, no pid the SIGTERM reached, no
		// descent. The kill takes what init adopted since it began.
		{"forked on SIGTERM past the command's end", "env -u SANDBOXD_TERMINAL sh -c \"exec 2>/dev/null; trap '(exec sleep 304 &); exit 0' TERM; echo ready; while :; do sleep 1; done\" & c=$!; trap 'wait $c; exit 0' TERM; wait", "ready\n", "sleep 304", "exit 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ws := workspace(t)
			srv := startServe(t, ws)
			a := srv.agent()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			const sid = "kill"
			created, err := a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: sid, Command: "/bin/sh", Args: []string{"-c", tc.line}})
			if err != nil {
				t.Fatal(err)
			}
			id := created.TerminalId
			eventually(t, "output "+tc.ready, 30*time.Second, func() bool {
				out, err := a.TerminalOutput(ctx, acpsdk.TerminalOutputRequest{SessionId: sid, TerminalId: id})
				return err == nil && out.Output == tc.ready
			})
			if _, err := a.KillTerminal(ctx, acpsdk.KillTerminalRequest{SessionId: sid, TerminalId: id}); err != nil {
				t.Fatalf("kill: %v", err)
			}
			st, err := a.WaitForTerminalExit(ctx, acpsdk.WaitForTerminalExitRequest{SessionId: sid, TerminalId: id})
			if err != nil {
				t.Fatal(err)
			}
			if got := exitCode(st); got != tc.want {
				t.Errorf("status after kill = %s, want %s", got, tc.want)
			}
			if ps, _ := sh(t, ctx, a, sid, "ps -o pid,args"); strings.Contains(ps, tc.leftover) {
				t.Errorf("processes of the killed command are left:\n%s", ps)
			}
			// Output stays readable, and a kill after exit changes nothing.
			for range 2 {
				if _, err := a.KillTerminal(ctx, acpsdk.KillTerminalRequest{SessionId: sid, TerminalId: id}); err != nil {
					t.Fatalf("kill after exit: %v", err)
				}
				out, err := a.TerminalOutput(ctx, acpsdk.TerminalOutputRequest{SessionId: sid, TerminalId: id})
				if err != nil {
					t.Fatalf("output after kill: %v", err)
				}
				got := exitCode(acpsdk.WaitForTerminalExitResponse{ExitCode: out.ExitStatus.ExitCode, Signal: out.ExitStatus.Signal})
				if out.Output != tc.ready || got != tc.want {
					t.Errorf("output after kill = %q, %s", out.Output, got)
				}
			}
		})
	}
}

// TestKillLeavesOtherCommandsAlone: while one command is being killed,
// another command of the session ends and leaves a process without the
// marker to the container's init, started after the kill began: it is of
// the other command's process group, not the killed one's, and the kill
// leaves it running.
func TestKillLeavesOtherCommandsAlone(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const sid = "kill-others"
	killed, err := a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: sid, Command: "/bin/sh", Args: []string{"-c",
		// On SIGTERM it waits, before it ends, until the other
		// command's leftover is the init's.
		`trap 'touch /tmp/got-term; until grep -qs "(sh) S 1 " /proc/[0-9]*/stat; do sleep 0.05; done; exit 0' TERM; echo ready; while :; do sleep 1; done`}})
	if err != nil {
		t.Fatal(err)
	}
	other, err := a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: sid, Command: "/bin/sh", Args: []string{"-c",
		`while [ ! -e /tmp/got-term ]; do sleep 0.05; done; env -i X=1 /bin/sh -c 'sleep 305; :' &`}})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "ready", 30*time.Second, func() bool {
		out, err := a.TerminalOutput(ctx, acpsdk.TerminalOutputRequest{SessionId: sid, TerminalId: killed.TerminalId})
		return err == nil && out.Output == "ready\n"
	})
	if _, err := a.KillTerminal(ctx, acpsdk.KillTerminalRequest{SessionId: sid, TerminalId: killed.TerminalId}); err != nil {
		t.Fatalf("kill: %v", err)
	}
	if st, err := a.WaitForTerminalExit(ctx, acpsdk.WaitForTerminalExitRequest{SessionId: sid, TerminalId: other.TerminalId}); err != nil || exitCode(st) != "exit 0" {
		t.Fatalf("the other command: %v, %v", exitCode(st), err)
	}
	if ps, _ := sh(t, ctx, a, sid, "ps -o pid,ppid,args"); !strings.Contains(ps, "sleep 305") {
		t.Errorf("the kill took another command's process:\n%s", ps)
	}
}

func TestReleaseMakesIDUnknown(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const sid = "release"
	created, err := a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: sid, Command: "sleep", Args: []string{"302"}})
	if err != nil {
		t.Fatal(err)
	}
	id := created.TerminalId
	if _, err := a.ReleaseTerminal(ctx, acpsdk.ReleaseTerminalRequest{SessionId: sid, TerminalId: id}); err != nil {
		t.Fatalf("release of a running terminal: %v", err)
	}
	calls := map[string]func() error{
		"output": func() error {
			_, err := a.TerminalOutput(ctx, acpsdk.TerminalOutputRequest{SessionId: sid, TerminalId: id})
			return err
		},
		"wait_for_exit": func() error {
			_, err := a.WaitForTerminalExit(ctx, acpsdk.WaitForTerminalExitRequest{SessionId: sid, TerminalId: id})
			return err
		},
		"kill": func() error {
			_, err := a.KillTerminal(ctx, acpsdk.KillTerminalRequest{SessionId: sid, TerminalId: id})
			return err
		},
		"release": func() error {
			_, err := a.ReleaseTerminal(ctx, acpsdk.ReleaseTerminalRequest{SessionId: sid, TerminalId: id})
			return err
		},
	}
	for name, call := range calls {
		if err := call(); rpcCode(err) != -32002 || !strings.Contains(rpcMessage(err), string(id)) {
			t.Errorf("%s after release: err = %v, want -32002 naming %s", name, err, id)
		}
	}
	if ps, _ := sh(t, ctx, a, sid, "ps -o pid,args"); strings.Contains(ps, "sleep 302") {
		t.Errorf("release left the command running:\n%s", ps)
	}
}

func TestConcurrentTerminalsAndWaiters(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const sid = "many"
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan string, 3*n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			created, err := a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{
				SessionId: sid, Command: "/bin/sh", Args: []string{"-c", "sleep 1; echo $N"},
				Env: []acpsdk.EnvVariable{{Name: "N", Value: string(rune('a' + i))}},
			})
			if err != nil {
				errs <- err.Error()
				return
			}
			// Two waiters on the same terminal both get the status.
			var ww sync.WaitGroup
			for range 2 {
				ww.Add(1)
				go func() {
					defer ww.Done()
					st, err := a.WaitForTerminalExit(ctx, acpsdk.WaitForTerminalExitRequest{SessionId: sid, TerminalId: created.TerminalId})
					if err != nil || exitCode(st) != "exit 0" {
						errs <- "wait: " + exitCode(st) + rpcMessage(err)
					}
				}()
			}
			ww.Wait()
			out, err := a.TerminalOutput(ctx, acpsdk.TerminalOutputRequest{SessionId: sid, TerminalId: created.TerminalId})
			if err != nil || out.Output != string(rune('a'+i))+"\n" {
				errs <- "output: " + out.Output + rpcMessage(err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestCancelWaitForExit(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	c := srv.raw()
	rep := c.call(t, 1, "terminal/create", map[string]any{"sessionId": "cancel", "command": "sleep", "args": []string{"303"}})
	if rep.Error != nil {
		t.Fatalf("create: %+v", rep.Error)
	}
	var created struct{ TerminalID string }
	if err := jsonUnmarshal(rep.Result, &created); err != nil {
		t.Fatal(err)
	}
	c.send(t, `{"jsonrpc":"2.0","id":2,"method":"terminal/wait_for_exit","params":{"sessionId":"cancel","terminalId":"`+created.TerminalID+`"}}`)
	c.send(t, `{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":2}}`)
	rep = c.recv(t)
	if string(rep.ID) != "2" || rep.Error == nil || rep.Error.Code != -32800 {
		t.Fatalf("reply to cancelled wait = id %s %+v, want error -32800", rep.ID, rep.Error)
	}
	// The terminal itself is untouched by the cancel.
	rep = c.call(t, 3, "terminal/output", map[string]any{"sessionId": "cancel", "terminalId": created.TerminalID})
	if rep.Error != nil || strings.Contains(string(rep.Result), "exitStatus") {
		t.Fatalf("output after cancel = %s %+v, want a running terminal", rep.Result, rep.Error)
	}
}

func TestContainerIsHardened(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const sid = "hardened"
	checks := []struct {
		name, line, want string
	}{
		{"uid is not 0", "id -u", "1000\n"},
		{"no network but loopback", "ls /sys/class/net", "lo\n"},
		{"root is read-only", "touch /etc/x 2>&1; echo $?", "touch: /etc/x: Read-only file system\n1\n"},
		{"no docker socket", "ls /var/run/docker.sock /run/docker.sock 2>/dev/null; echo $?", "1\n"},
		{"cpu quota of 1 cpu", "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n100000\n"},
		{"memory limit", "cat /sys/fs/cgroup/memory/memory.limit_in_bytes", "268435456\n"},
		{"pids limit", "cat /sys/fs/cgroup/pids/pids.max", "256\n"},
		{"no capabilities", "grep CapEff /proc/self/status", "CapEff:\t0000000000000000\n"},
		{"no new privileges", "grep NoNewPrivs /proc/self/status", "NoNewPrivs:\t1\n"},
		{"scratch is writable and executable", "printf '#!/bin/sh\\necho x\\n' > /tmp/x && chmod +x /tmp/x && /tmp/x", "x\n"},
		{"cgroups of its own, not the host's", `grep -cv ':/$' /proc/self/cgroup`, "0\n"},
		{"the container's own output is not the commands'", `head -c 3000000 /dev/zero | tr '\0' a 2>/dev/null > /proc/1/fd/1 || echo refused`, "refused\n"},
		{"no host path but the workspace", `awk '$2 !~ /^\/(proc|sys|dev)(\/|$)/ && $2 !~ /^\/(tmp|var\/tmp|run|home|etc\/hosts|etc\/hostname|etc\/resolv.conf|sbin\/docker-init)$/ && $2 != "/" {print $2}' /proc/self/mounts`, ws + "\n"},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			out, st := sh(t, ctx, a, sid, c.line)
			if out != c.want {
				t.Errorf("%s: output %q (%s), want %q", c.line, out, exitCode(st), c.want)
			}
		})
	}
	// The container's log is bounded all the same (a stock engine's
	// json-file has none), should its processes ever write to it.
	ids := sessionContainersOf(t, srv.cmd.Process.Pid)
	if len(ids) != 1 {
		t.Fatalf("containers %v, want the session's one", ids)
	}
	info, err := testEnv.cli.ContainerInspect(ctx, ids[0], client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lc := info.Container.HostConfig.LogConfig
	if lc.Type != "json-file" || lc.Config["max-size"] != "1m" || lc.Config["max-file"] != "1" {
		t.Errorf("log config %+v, want json-file of at most 1m in 1 file", lc)
	}
	// Killing whatever the commands' user may does not stop the
	// container: the next command runs.
	sh(t, ctx, a, sid, "pkill -9 -x sleep; kill -9 -1")
	if out, st := sh(t, ctx, a, sid, "echo alive"); out != "alive\n" {
		t.Errorf("after kill -9 -1: %q (%s), want the session still there", out, exitCode(st))
	}
	if info, err := testEnv.cli.ContainerInspect(ctx, ids[0], client.ContainerInspectOptions{}); err != nil || !info.Container.State.Running {
		t.Errorf("after kill -9 -1 the session's container is not running: %v", err)
	}
}

func TestReleaseEndsBackgroundLeftovers(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const sid = "leftovers"
	// The command exits at once and leaves a daemon behind, detached from
	// its output so the terminal ends.
	out, st := sh(t, ctx, a, sid, "setsid sleep 311 >/dev/null 2>&1 & echo started")
	if out != "started\n" || exitCode(st) != "exit 0" {
		t.Fatalf("command: %q %s", out, exitCode(st))
	}
	// sh released the terminal; its leftover is swept shortly after.
	eventually(t, "leftover process killed after release", 30*time.Second, func() bool {
		ps, _ := sh(t, ctx, a, sid, "ps -o args | grep -c '[s]leep 311'")
		return ps == "0\n"
	})
}

// TestSymlinkInWorkspaceReachesNoHostDirectory: the workspace is the
// agent's to write, links included. A directory it names for a new session
// (as cwd, or to _sandboxd/session/open) must not become a mount source,
// or a link there would mount any host directory in the next container.
func TestSymlinkInWorkspaceReachesNoHostDirectory(t *testing.T) {
	ws := workspace(t)
	outside := t.TempDir()
	writeFile(t, filepath.Join(outside, "secret"), "host secret\n")
	if err := os.Chmod(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The agent makes the link from inside its first session.
	link := filepath.Join(ws, "escape")
	if out, st := sh(t, ctx, a, "first", "ln -s "+outside+" "+link+" && echo linked"); out != "linked\n" {
		t.Fatalf("ln: %q (%s)", out, exitCode(st))
	}
	read := "cat secret 2>&1; cat " + link + "/secret 2>&1; grep -c " + outside + " /proc/self/mountinfo"
	for _, sid := range []string{"second", "opened"} {
		if sid == "opened" {
			if _, err := a.CallExtension(ctx, "_sandboxd/session/open", map[string]any{"sessionId": sid, "cwd": ws, "additionalDirectories": []string{link}}); err != nil {
				t.Fatalf("open: %v", err)
			}
		}
		created, err := a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: acpsdk.SessionId(sid), Command: "/bin/sh", Args: []string{"-c", read}, Cwd: ptr(link)})
		if err != nil {
			continue // the directory does not exist in the container: refused, fine
		}
		if _, err := a.WaitForTerminalExit(ctx, acpsdk.WaitForTerminalExitRequest{SessionId: acpsdk.SessionId(sid), TerminalId: created.TerminalId}); err != nil {
			t.Fatal(err)
		}
		out, err := a.TerminalOutput(ctx, acpsdk.TerminalOutputRequest{SessionId: acpsdk.SessionId(sid), TerminalId: created.TerminalId})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out.Output, "host secret") {
			t.Errorf("session %s reads a host directory through a link in the workspace: %q", sid, out.Output)
		}
	}
	// The file is still reachable where the link points inside the
	// container: nowhere.
	if out, _ := sh(t, ctx, a, "first", "cat "+link+"/secret 2>/dev/null; echo done"); out != "done\n" {
		t.Errorf("the first session reads through the link: %q", out)
	}
}

// TestFilesystemsBelowTheWorkspaceStayOut: a filesystem mounted inside
// the workspace, or inside a writable grant of session.mounts, on the
// host (a chroot's /proc, say), or a file bound there, was never
// checked, so the container sees only the directory it is mounted on, or
// an empty file. Mounting takes root, which CI has.
func TestFilesystemsBelowTheWorkspaceStayOut(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a filesystem below the workspace takes root")
	}
	ws, grant := workspace(t), workspace(t)
	var below []string // as the container shows them
	for _, dir := range []string{ws, grant} {
		p := subdir(t, dir, "proc")
		if out, err := exec.Command("mount", "-t", "proc", "proc", p).CombinedOutput(); err != nil {
			t.Fatalf("mount proc at %s: %v: %s", p, err, out)
		}
		t.Cleanup(func() { exec.Command("umount", "-l", p).Run() })
	}
	// A file the host binds there (as a container's own /etc/hosts).
	secret := filepath.Join(t.TempDir(), "secret")
	writeFile(t, secret, "host secret\n")
	file := filepath.Join(grant, "file")
	writeFile(t, file, "")
	if out, err := exec.Command("mount", "--bind", secret, file).CombinedOutput(); err != nil {
		t.Fatalf("bind %s at %s: %v: %s", secret, file, err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", file).Run() })
	below = []string{filepath.Join(ws, "proc"), "/data/proc"}
	srv := startServeWithConfig(t, ws, fmt.Sprintf("[[session.mounts]]\nsource = %q\ntarget = \"/data\"\nmode = \"rw\"\n", grant))
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, p := range below {
		if out, st := sh(t, ctx, a, "s", "ls -A "+p+"; echo listed"); out != "listed\n" {
			t.Errorf("the host's /proc mounted below %s shows in the container: %q (%s)", filepath.Dir(p), out, exitCode(st))
		}
		// Nor can a command detach the host's mount by removing or
		// moving the directory it is on.
		if out, st := sh(t, ctx, a, "s", "{ rmdir "+p+" && echo removed; mv "+p+" "+p+"-moved && echo moved; } 2>/dev/null; echo tried"); out != "tried\n" {
			t.Errorf("rmdir and mv of the mount point %s: %q (%s)", p, out, exitCode(st))
		}
	}
	if out, st := sh(t, ctx, a, "s", "cat /data/file; { rm /data/file && echo removed; mv /data/file /data/moved && echo moved; } 2>/dev/null; echo tried"); out != "tried\n" {
		t.Errorf("the file the host binds below the grant: %q (%s), want it empty and neither removed nor moved", out, exitCode(st))
	}
	info, err := os.ReadFile("/proc/self/mountinfo")
	for _, p := range []string{filepath.Join(ws, "proc"), filepath.Join(grant, "proc"), file} {
		if err != nil || !strings.Contains(string(info), " "+p+" ") {
			t.Errorf("the host's mount at %s is gone", p)
		}
	}
}

// TestGitMetadataIsReadOnly: commands cannot change a workspace's .git,
// which the person's own git reads on the host (a hook or core.fsmonitor
// set there would run outside the sandbox), nor move it out of the way;
// they still read it, and the rest of the workspace stays writable. A
// worktree's .git file is kept as well. protect_git = false lets them.
func TestGitMetadataIsReadOnly(t *testing.T) {
	repo := workspace(t)
	config := filepath.Join(subdir(t, repo, ".git"), "config")
	writeFile(t, config, "[core]\n")
	own(t, config)
	worktree := workspace(t)
	writeFile(t, filepath.Join(worktree, ".git"), "gitdir: "+repo+"/.git\n")
	own(t, filepath.Join(worktree, ".git"))
	// git clone --separate-git-dir: the .git file names a directory in
	// the workspace, which holds the config.
	separate := workspace(t)
	writeFile(t, filepath.Join(separate, ".git"), "gitdir: meta\n")
	own(t, filepath.Join(separate, ".git"))
	meta := filepath.Join(subdir(t, separate, "meta"), "config")
	writeFile(t, meta, "[core]\n")
	own(t, meta)
	writeFile(t, filepath.Join(separate, "meta", "HEAD"), "ref: refs/heads/main\n")
	// The same one directory deeper: the directory above it is pinned,
	// or moving it aside would move the read-only mount along.
	deeper := workspace(t)
	writeFile(t, filepath.Join(deeper, ".git"), "gitdir: .repos/meta\n")
	own(t, filepath.Join(deeper, ".git"))
	repos := subdir(t, deeper, ".repos")
	meta = filepath.Join(subdir(t, repos, "meta"), "config")
	writeFile(t, meta, "[core]\n")
	own(t, meta)
	writeFile(t, filepath.Join(repos, "meta", "HEAD"), "ref: refs/heads/main\n")
	// A folder of projects, opened as the workspace: a repository one
	// level down, whose directory is pinned too.
	projects := workspace(t)
	svc := subdir(t, projects, "svc")
	config = filepath.Join(subdir(t, svc, ".git"), "config")
	writeFile(t, config, "[core]\n")
	own(t, config)
	// A submodule two levels down, whose .git file names its git
	// directory in the repository's.
	super := workspace(t)
	module := subdir(t, subdir(t, subdir(t, super, ".git"), "modules"), "lib")
	writeFile(t, filepath.Join(super, ".git", "HEAD"), "ref: refs/heads/main\n")
	writeFile(t, filepath.Join(module, "HEAD"), "ref: refs/heads/main\n")
	writeFile(t, filepath.Join(module, "config"), "[core]\n\tworktree = ../../../vendor/lib\n")
	lib := subdir(t, subdir(t, super, "vendor"), "lib")
	writeFile(t, filepath.Join(lib, ".git"), "gitdir: ../../.git/modules/lib\n")
	own(t, filepath.Join(lib, ".git"))
	try := "{ echo '\tfsmonitor = ./evil' >> .git/config && echo changed config; " +
		"echo 'gitdir: /tmp/evil' > .git && echo changed file; " +
		"mv .git .git-old && echo moved; " +
		"echo '\tfsmonitor = ./evil' >> meta/config && echo changed meta; " +
		"echo '\tfsmonitor = ./evil' >> .repos/meta/config && echo changed repos; " +
		"mv .repos .r && echo moved repos; " +
		"cat .git/config .git | head -1; touch ok && echo wrote; } 2>/dev/null"
	for _, tc := range []struct {
		name, config string
		dir          string
		pre          string // run before try
		want         string
	}{
		{"repository", "", repo, "", "[core]\nwrote\n"},
		{"submodule two levels down", "", super, "cd vendor/lib && ", "gitdir: ../../.git/modules/lib\nwrote\n"},
		{"repository one level down", "", projects, "{ mv svc svc-old && echo moved repository; } 2>/dev/null; cd svc && ", "[core]\nwrote\n"},
		{"worktree", "", worktree, "", "gitdir: " + repo + "/.git\nwrote\n"},
		{"separate git directory", "", separate, "", "gitdir: meta\nwrote\n"},
		{"separate git directory deeper", "", deeper, "", "gitdir: .repos/meta\nwrote\n"},
		{"not protected", "[session]\nprotect_git = false\n", repo, "", "changed config\nmoved\nwrote\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startServeWithConfig(t, tc.dir, tc.config)
			a := srv.agent()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if out, st := sh(t, ctx, a, "s", tc.pre+try); out != tc.want {
				t.Errorf("got %q (%s), want %q", out, exitCode(st), tc.want)
			}
		})
	}
}

// TestSubmodulesInTheIndexAreProtected: host git goes into every
// submodule its index records that has a .git, set up or not. A command
// can neither make a repository in one never checked out (its fsmonitor
// would run on the host at the next `git status`) nor change the config of
// one whose .git is a directory two levels down; the rest stays writable.
func TestSubmodulesInTheIndexAreProtected(t *testing.T) {
	ws := workspace(t)
	dotgit := subdir(t, ws, ".git")
	writeFile(t, filepath.Join(dotgit, "HEAD"), "ref: refs/heads/main\n")
	writeFile(t, filepath.Join(dotgit, "index"), string(gitIndex("vendor/mod", "vendor/old")))
	vendor := subdir(t, ws, "vendor")
	subdir(t, vendor, "mod")
	config := filepath.Join(subdir(t, subdir(t, vendor, "old"), ".git"), "config")
	writeFile(t, config, "[core]\n")
	own(t, config)
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	try := "{ mkdir vendor/mod/.git && echo made a repository; " +
		"echo '\tfsmonitor = ./evil' >> vendor/old/.git/config && echo changed config; " +
		"mv vendor/old vendor/o && echo moved; " +
		"ls -a vendor/mod | wc -l; cat vendor/old/.git/config; touch vendor/ok && echo wrote; } 2>/dev/null"
	if out, st := sh(t, ctx, a, "s", try); out != "2\n[core]\nwrote\n" {
		t.Errorf("got %q (%s), want no repository made, the config unchanged and nothing moved", out, exitCode(st))
	}
}

// gitIndex is a git index (version 2, SHA-1) that records a submodule at
// each path.
func gitIndex(paths ...string) []byte {
	b := []byte("DIRC")
	b = binary.BigEndian.AppendUint32(b, 2)
	b = binary.BigEndian.AppendUint32(b, uint32(len(paths)))
	for _, p := range paths {
		start := len(b)
		b = append(b, make([]byte, 24)...)
		b = binary.BigEndian.AppendUint32(b, 0o160000)
		b = append(b, make([]byte, 12+20)...)
		b = binary.BigEndian.AppendUint16(b, uint16(len(p)))
		b = append(append(b, p...), 0)
		for (len(b)-start)%8 != 0 {
			b = append(b, 0)
		}
	}
	return append(b, make([]byte, 20)...)
}

// TestGitMadeDuringASessionIsReported: a repository made in a session,
// which no read-only mount covers, is named in the log when the session
// closes, for the person to look at before running git in it; one that
// was there and protected is not.
func TestGitMadeDuringASessionIsReported(t *testing.T) {
	ws := workspace(t)
	subdir(t, subdir(t, ws, "old"), ".git")
	subdir(t, ws, "new")
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, st := sh(t, ctx, a, "s", "mkdir new/.git && echo 'ref: refs/heads/main' > new/.git/HEAD && echo made"); out != "made\n" {
		t.Fatalf("got %q (%s)", out, exitCode(st))
	}
	srv.stop(t)
	logs := srv.stderr.String()
	i := strings.Index(logs, "git metadata appeared")
	if i < 0 {
		t.Fatalf("no warning of the repository made in the session:\n%s", logs)
	}
	line, _, _ := strings.Cut(logs[i:], "\n")
	if !strings.Contains(line, filepath.Join(ws, "new", ".git")) || strings.Contains(line, filepath.Join(ws, "old")) {
		t.Errorf("the warning names other paths than the one made: %s", line)
	}
}

// TestGrantedMountOverARepository: a granted mount at a directory of the
// workspace that holds a repository shows what it grants; the repository
// there, which the container does not show, gets no mounts of its own.
func TestGrantedMountOverARepository(t *testing.T) {
	ws := workspace(t)
	subdir(t, subdir(t, ws, "sub"), ".git")
	tools := t.TempDir()
	writeFile(t, filepath.Join(tools, "tool"), "granted\n")
	if err := os.Chmod(tools, 0o755); err != nil {
		t.Fatal(err)
	}
	srv := startServeWithConfig(t, ws, fmt.Sprintf("[[session.mounts]]\nsource = %q\ntarget = %q\nmode = \"ro\"\n", tools, filepath.Join(ws, "sub")))
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, st := sh(t, ctx, a, "s", "cat sub/tool"); out != "granted\n" {
		t.Errorf("got %q (%s), want the granted file", out, exitCode(st))
	}
}

// TestGrantedMounts: what session.mounts grants is there, a directory or
// a single file, through a link on the host as well (its target is what
// is mounted), read-only when so configured.
func TestGrantedMounts(t *testing.T) {
	ws := workspace(t)
	tools := t.TempDir()
	writeFile(t, filepath.Join(tools, "tool"), "granted\n")
	one := filepath.Join(t.TempDir(), "one.txt")
	writeFile(t, one, "one file\n")
	link := filepath.Join(t.TempDir(), "tools-link")
	if err := os.Symlink(tools, link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{tools, filepath.Dir(one), filepath.Dir(link)} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	srv := startServeWithConfig(t, ws, fmt.Sprintf(`
[[session.mounts]]
source = %q
target = "/opt/tools"
mode = "ro"
[[session.mounts]]
source = %q
target = "/opt/one.txt"
mode = "ro"
`, link, one))
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, st := sh(t, ctx, a, "s", "cat /opt/tools/tool /opt/one.txt; touch /opt/tools/x 2>/dev/null || echo read-only")
	if want := "granted\none file\nread-only\n"; out != want {
		t.Errorf("got %q (%s), want %q", out, exitCode(st), want)
	}
}

// TestKillAndReleaseAsNotifications: terminal/kill and terminal/release
// sent without an id are done, and answered with nothing, as JSON-RPC
// has it for a notification.
func TestKillAndReleaseAsNotifications(t *testing.T) {
	srv := startServe(t, workspace(t))
	c := srv.raw()
	rep := c.call(t, 1, "terminal/create", map[string]any{"sessionId": "n", "command": "sleep", "args": []string{"306"}})
	var created struct {
		TerminalID string `json:"terminalId"`
	}
	if rep.Error != nil || jsonUnmarshal(rep.Result, &created) != nil {
		t.Fatalf("create: %+v", rep)
	}
	ids := map[string]any{"sessionId": "n", "terminalId": created.TerminalID}
	c.send(t, `{"jsonrpc":"2.0","method":"terminal/kill","params":{"sessionId":"n","terminalId":"`+created.TerminalID+`"}}`)
	// The next line on stdout is this answer: the notification got none.
	rep = c.call(t, 2, "terminal/wait_for_exit", ids)
	var st struct {
		Signal *string `json:"signal"`
	}
	if rep.Error != nil || jsonUnmarshal(rep.Result, &st) != nil || st.Signal == nil {
		t.Fatalf("wait_for_exit after a kill notification: %+v", rep)
	}
	c.send(t, `{"jsonrpc":"2.0","method":"terminal/release","params":{"sessionId":"n","terminalId":"`+created.TerminalID+`"}}`)
	id := 3
	eventually(t, "the terminal released", 30*time.Second, func() bool {
		id++
		rep := c.call(t, id, "terminal/output", ids)
		if string(rep.ID) != strconv.Itoa(id) {
			t.Fatalf("answer to %d has id %s: something answered the notification", id, rep.ID)
		}
		return rep.Error != nil && rep.Error.Code == -32002
	})
}

// TestUnverifiableMountsAreRefused: when stat in the container cannot
// look at a mount target (one below a directory the session user may not
// enter), the session is refused with stat's reason, rather than opened
// with none of its mounts verified.
func TestUnverifiableMountsAreRefused(t *testing.T) {
	ws := workspace(t)
	closed, open := t.TempDir(), t.TempDir() // root's
	if err := os.Chmod(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	srv := startServeWithConfig(t, ws, fmt.Sprintf(`
[[session.mounts]]
source = %q
target = "/opt/closed"
[[session.mounts]]
source = %q
target = "/opt/closed/inner"
`, closed, open))
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: "s", Command: "true"})
	if err == nil || !strings.Contains(rpcMessage(err), "verify mounts") || !strings.Contains(rpcMessage(err), "Permission denied") {
		t.Errorf("create with a mount stat cannot reach: %v, want it refused with stat's reason", err)
	}
	// The spare container, refused the same way, goes too.
	eventually(t, "no container left", 30*time.Second, func() bool { return len(containersOf(t, srv.cmd.Process.Pid)) == 0 })
}

// TestCommandNotFoundIs127: a command the container does not have exits
// 127, as in a shell, with the engine's reason as its output; one it has
// but cannot run stays 126.
func TestCommandNotFoundIs127(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, tc := range []struct {
		command, want string
	}{
		{"no-such-command", "exit 127"},
		{"/no/such/path", "exit 127"},
		{"/etc/passwd", "exit 126"},
	} {
		out, st := runCmd(t, ctx, a, acpsdk.CreateTerminalRequest{SessionId: "missing", Command: tc.command})
		if got := exitCode(st); got != tc.want || !strings.Contains(out.Output, tc.command) {
			t.Errorf("%s: %s, output %q; want %s and the engine's reason", tc.command, got, out.Output, tc.want)
		}
	}
}

// TestWritableGrantKeepsGitMetadataReadOnly: a writable grant of the
// folder the workspace is in, or of a repository in it, shows the
// workspace's git metadata at the grant's target too: read-only there as
// well (with the repository a worktree's .git names beside it), the rest
// of the grant writable. A grant of the metadata itself is refused.
func TestWritableGrantKeepsGitMetadataReadOnly(t *testing.T) {
	parent := t.TempDir() // root's, as a grant's way must be
	ws := subdir(t, parent, "proj")
	sub := subdir(t, ws, "sub")
	var configs []string
	for _, dir := range []string{ws, sub} {
		config := filepath.Join(subdir(t, dir, ".git"), "config")
		writeFile(t, config, "[core]\n")
		own(t, config)
		configs = append(configs, config)
	}
	// A worktree of a repository beside the workspace: host git in it
	// runs that repository's config and hooks.
	main := subdir(t, subdir(t, parent, "main"), ".git")
	for _, d := range []string{"objects", "refs", "worktrees"} {
		subdir(t, main, d)
	}
	writeFile(t, filepath.Join(main, "HEAD"), "ref: refs/heads/main\n")
	mainConfig := filepath.Join(main, "config")
	writeFile(t, mainConfig, "[core]\n")
	own(t, mainConfig)
	tree := subdir(t, parent, "tree")
	gitdir := subdir(t, filepath.Join(main, "worktrees"), "tree")
	writeFile(t, filepath.Join(gitdir, "HEAD"), "ref: refs/heads/tree\n")
	writeFile(t, filepath.Join(gitdir, "commondir"), "../..\n")
	writeFile(t, filepath.Join(tree, ".git"), "gitdir: "+gitdir+"\n")
	configs = append(configs, mainConfig)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := startServeWithConfig(t, ws, fmt.Sprintf("[[session.mounts]]\nsource = %q\ntarget = \"/p\"\n[[session.mounts]]\nsource = %q\ntarget = \"/x\"\n", parent, sub))
	a := srv.agent()
	out, st := sh(t, ctx, a, "s", "{ echo x >> /p/proj/.git/config && echo changed; "+
		"echo x >> /p/proj/sub/.git/config && echo changed sub; "+
		"echo x >> /x/.git/config && echo changed x; "+
		"mv /p/proj/.git /p/proj/.git-old && echo moved; "+
		"mv /p/proj /p/moved && echo moved workspace; "+
		"touch /p/proj/made /x/made && echo wrote; } 2>/dev/null")
	if out != "wrote\n" {
		t.Errorf("got %q (%s), want only \"wrote\"", out, exitCode(st))
	}
	// The worktree as the workspace: its repository's config, beside it,
	// is read-only through the grant.
	srv = startServeWithConfig(t, tree, fmt.Sprintf("[[session.mounts]]\nsource = %q\ntarget = \"/p\"\n", parent))
	out, st = sh(t, ctx, srv.agent(), "s", "{ echo x >> /p/main/.git/config && echo changed main; touch /p/main/made && echo wrote; } 2>/dev/null")
	if out != "wrote\n" {
		t.Errorf("worktree: got %q (%s), want only \"wrote\"", out, exitCode(st))
	}
	// A grant of the worktree's repository only, which holds none of the
	// workspace: read-only there too; and one of its git directory itself
	// is refused.
	srv = startServeWithConfig(t, tree, fmt.Sprintf("[[session.mounts]]\nsource = %q\ntarget = \"/m\"\n", filepath.Dir(main)))
	out, st = sh(t, ctx, srv.agent(), "s", "{ echo x >> /m/.git/config && echo changed main; touch /m/made && echo wrote; } 2>/dev/null")
	if out != "wrote\n" {
		t.Errorf("worktree, its repository granted: got %q (%s), want only \"wrote\"", out, exitCode(st))
	}
	srv = startServeWithConfig(t, tree, fmt.Sprintf("[[session.mounts]]\nsource = %q\ntarget = \"/g\"\n", main))
	if _, err := srv.agent().CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: "s", Command: "true"}); err == nil || !strings.Contains(err.Error(), "is git metadata of the session's directories") {
		t.Errorf("grant of a worktree's git directory: %v, want a refusal", err)
	}
	// A read-only grant mounted above the workspace's path (the folder
	// it is in, at its own path): the workspace's bind is mounted over
	// it, and its metadata stays read-only there.
	srv = startServeWithConfig(t, ws, fmt.Sprintf("[[session.mounts]]\nsource = %q\ntarget = %q\nmode = \"ro\"\n", parent, parent))
	out, st = sh(t, ctx, srv.agent(), "s", "{ echo x >> .git/config && echo changed; touch made && echo wrote; } 2>/dev/null")
	if out != "wrote\n" {
		t.Errorf("read-only grant above: got %q (%s), want only \"wrote\"", out, exitCode(st))
	}
	// The metadata itself granted writable: refused when the session
	// starts.
	srv = startServeWithConfig(t, ws, fmt.Sprintf("[[session.mounts]]\nsource = %q\ntarget = \"/g\"\n", filepath.Join(ws, ".git")))
	if _, err := srv.agent().CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: "s", Command: "true"}); err == nil || !strings.Contains(err.Error(), "is git metadata of the session's directories") {
		t.Errorf("grant of .git: %v, want a refusal", err)
	}
	for _, f := range configs {
		if b, err := os.ReadFile(f); err != nil || string(b) != "[core]\n" {
			t.Errorf("%s holds %q (%v)", f, b, err)
		}
	}
}
