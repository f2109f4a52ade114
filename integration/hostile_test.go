package integration

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	acpsdk "github.com/coder/acp-go-sdk"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/engine"
	"github.com/sandboxd/sandboxd/sandbox"
)

// stopLoop is a command that stops every process its user may signal, and
// each new one too: sandboxd's helpers in the container, the other
// commands, and runc's init of each exec that starts meanwhile, which then
// holds the engine's lock on the container.
const stopLoop = "while :; do kill -STOP -1 2>/dev/null; done"

// hostProc is a process of a container as this host sees it.
type hostProc struct {
	pid, uid int
	name     string
	state    string
}

// containerProcs lists the processes of container id from this host's
// /proc: those whose cgroup names it.
func containerProcs(t testing.TB, id string) []hostProc {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		t.Fatal(err)
	}
	var procs []hostProc
	for _, d := range dirs {
		cg, err := os.ReadFile(d + "/cgroup")
		if err != nil || !bytes.Contains(cg, []byte(id)) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(d))
		name, fields, ok := procStat(pid)
		st, err := os.ReadFile(d + "/status")
		if !ok || err != nil {
			continue
		}
		uid := -1
		for line := range strings.SplitSeq(string(st), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
				uid, _ = strconv.Atoi(f[1])
			}
		}
		procs = append(procs, hostProc{pid: pid, uid: uid, name: name, state: fields[0]})
	}
	return procs
}

// commandProcs are the processes of container id that run as the
// commands' user (1000), zombies aside.
func commandProcs(t testing.TB, id string) []hostProc {
	t.Helper()
	var procs []hostProc
	for _, p := range containerProcs(t, id) {
		if p.uid == 1000 && p.state != "Z" {
			procs = append(procs, p)
		}
	}
	return procs
}

// removeWedged removes container id at the end of the test, whatever
// sandboxd left, as sandboxd removes its containers: killed first,
// through the engine and, when the engine waits on the container, from
// this host.
func removeWedged(t testing.TB, id string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := engine.RemoveContainer(ctx, testEnv.cli, id); err != nil && !engine.IsNotFound(err) {
			t.Errorf("remove container %.12s: %v", id, err)
		}
	})
}

// startStopLoop starts the stop loop in session sid, next to a sleeping
// command, and more commands once the loop stopped the sleeper, whose
// execs the loop stops before they run; it returns the ids of the loop
// and the sleeper, and the session's container, once the engine waits on
// it.
func startStopLoop(t *testing.T, ctx context.Context, srv *server, a *acpsdk.AgentSideConnection, sid string) (loop, sleeper, container string, stopped []string) {
	t.Helper()
	create := func(line string) string {
		t.Helper()
		c, err := a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: acpsdk.SessionId(sid), Command: "/bin/sh", Args: []string{"-c", line}})
		if err != nil {
			t.Fatalf("create %q: %v", line, err)
		}
		return c.TerminalId
	}
	sleeper = create("sleep 600")
	ids := sessionContainersOf(t, srv.cmd.Process.Pid)
	if len(ids) != 1 {
		t.Fatalf("containers %v, want the session's one", ids)
	}
	container = ids[0]
	removeWedged(t, container)
	eventually(t, "the sleeper running", 30*time.Second, func() bool {
		for _, p := range commandProcs(t, container) {
			if p.name == "sleep" {
				return true
			}
		}
		return false
	})
	loop = create(stopLoop)
	eventually(t, "the sleeper stopped by the loop", 30*time.Second, func() bool {
		for _, p := range commandProcs(t, container) {
			if p.name == "sleep" && p.state == "T" {
				return true
			}
		}
		return false
	})
	// The loop stops runc's init of a new exec at some point of its start:
	// before the start is done, the engine waits for it, holding its lock
	// on the container. Commands are started until that happened, each
	// once the one before has started or was stopped later than that.
	for try := 1; ; try++ {
		stopped = append(stopped, create("echo never"))
		if wedgedWithin(container, 10*time.Second) {
			break
		}
		if try == 10 {
			t.Fatal("the engine never waited for a stopped exec")
		}
	}
	return loop, sleeper, container, stopped
}

// wedgedWithin says whether the engine stops answering the create of an
// exec in container id within limit: it waits for an exec's start. (A
// create that waits on in the engine holds up nothing else; an inspect
// would hold a kill of the container up too: inspectWaits.)
func wedgedWithin(id string, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for delay := 10 * time.Millisecond; time.Now().Before(deadline); delay = min(delay*2, 500*time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err := testEnv.cli.ExecCreate(ctx, id, client.ExecCreateOptions{Cmd: []string{"true"}})
		late := err != nil && ctx.Err() != nil
		cancel()
		if late {
			return true
		}
		time.Sleep(delay)
	}
	return false
}

// inspectWaits leaves an inspect of container id, which the engine waits
// on, waiting on in the engine (as someone's `docker inspect` that was
// given up on): it holds the container's lock, and a kill of the
// container waits for it too.
func inspectWaits(t *testing.T, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := testEnv.cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{}); err == nil {
		t.Fatal("the engine answered an inspect of a container it waits on")
	}
}

// within runs call and fails the test when it takes longer than limit.
func within(t *testing.T, what string, limit time.Duration, call func() error) {
	t.Helper()
	start := time.Now()
	err := call()
	took := time.Since(start)
	t.Logf("%s took %v", what, took.Round(time.Millisecond))
	if err != nil {
		t.Fatalf("%s: %v (after %v)", what, err, took.Round(time.Millisecond))
	}
	if took > limit {
		t.Errorf("%s took %v, want at most %v", what, took.Round(time.Millisecond), limit)
	}
}

// killBound is how long terminal/kill and release may take against the
// stop loop: the test's kill grace (1 s) and a few seconds.
const killBound = 15 * time.Second

// TestStopLoopIsKilled: a command that stops every process of its user
// in a loop, sandboxd's own helpers and runc's init of each new exec
// among them, is still killed within the grace and a few seconds, and so
// are the commands it stopped; the session then runs commands again, and
// closes; nothing of it is left. sandboxd, as root, ends the commands
// from the host, and the session keeps its container.
func TestStopLoopIsKilled(t *testing.T) {
	ws := workspace(t)
	if kept := stopLoopKilled(t, startServe(t, ws)); !kept {
		t.Error("the session lost its container; as root, sandboxd ends its commands from the host")
	}
}

// TestStopLoopIsKilledByAnotherUser: as the previous test, with sandboxd
// running as a user of the docker group, not root nor the commands' user,
// who may not signal the commands' processes: the session is closed, its
// container killed and removed through the engine, and it opens again.
func TestStopLoopIsKilledByAnotherUser(t *testing.T) {
	sock, err := os.Stat("/var/run/docker.sock")
	if err != nil || os.Getenv("DOCKER_HOST") != "" {
		t.Skip("the engine is not at the local socket, which a docker group would give access to")
	}
	group := sock.Sys().(*syscall.Stat_t).Gid
	ws := workspace(t)
	// The user must reach the binary, the config and the workspace.
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin, config := copyForUser(t, dir)
	cmd := exec.Command(bin, "serve", "--config", config, "--log-level", "debug")
	cmd.Dir = ws
	cmd.Env = append(os.Environ(), "HOME="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1234, Gid: 1234, Groups: []uint32{group}}}
	if kept := stopLoopKilled(t, startServeCmd(t, cmd)); kept {
		t.Error("the session kept its container; sandboxd cannot have ended its commands from the host")
	}
}

// stopLoopKilled runs the stop loop in a session of srv and kills it, and
// reports whether the session kept its container.
func stopLoopKilled(t *testing.T, srv *server) (kept bool) {
	t.Helper()
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const sid = "stop-loop"
	loop, sleeper, container, stopped := startStopLoop(t, ctx, srv, a, sid)

	within(t, "terminal/kill of the loop", killBound, func() error {
		_, err := a.KillTerminal(ctx, acpsdk.KillTerminalRequest{SessionId: sid, TerminalId: loop})
		return err
	})
	// The session goes on in its container, or was closed: then its
	// container is gone with every process in it.
	gone := func() bool {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := testEnv.cli.ContainerInspect(ctx, container, client.ContainerInspectOptions{})
		return engine.IsNotFound(err)
	}
	kept = !gone()
	if kept {
		// What the loop stopped was ended with it, by sandboxd.
		for _, id := range append([]string{loop, sleeper}, stopped...) {
			st, err := a.WaitForTerminalExit(ctx, acpsdk.WaitForTerminalExitRequest{SessionId: sid, TerminalId: id})
			if err != nil || exitCode(st) != "signal SIGKILL" {
				t.Errorf("terminal %s after the kill: %s, %v; want signal SIGKILL", id, exitCode(st), err)
			}
		}
		within(t, "terminal/release of the stopped sleeper", killBound, func() error {
			_, err := a.ReleaseTerminal(ctx, acpsdk.ReleaseTerminalRequest{SessionId: sid, TerminalId: sleeper})
			return err
		})
	}
	assertRecovered(t, ctx, a, sid, container)
	within(t, "_sandboxd/session/close", time.Minute, func() error {
		_, err := a.CallExtension(ctx, "_sandboxd/session/close", map[string]any{"sessionId": sid})
		return err
	})
	eventually(t, "the session's container removed", 30*time.Second, gone)
	return kept
}

// TestStopLoopReleased: terminal/release alone, with no kill before it,
// ends the loop and what it stopped.
func TestStopLoopReleased(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const sid = "stop-loop-release"
	loop, _, container, _ := startStopLoop(t, ctx, srv, a, sid)
	within(t, "terminal/release of the loop", killBound, func() error {
		_, err := a.ReleaseTerminal(ctx, acpsdk.ReleaseTerminalRequest{SessionId: sid, TerminalId: loop})
		return err
	})
	assertRecovered(t, ctx, a, sid, container)
}

// assertRecovered checks, once the stop loop was killed, that no process
// of the commands' user is left in the session's container (or that the
// container is gone), and that a new command runs in the session, in the
// same container or a new one.
func assertRecovered(t *testing.T, ctx context.Context, a *acpsdk.AgentSideConnection, sid, container string) {
	t.Helper()
	eventually(t, "no process of the commands' user left", 10*time.Second, func() bool {
		return len(commandProcs(t, container)) == 0
	})
	within(t, "a command after the kill", time.Minute, func() error {
		out, st := sh(t, ctx, a, sid, "echo alive")
		if out != "alive\n" || exitCode(st) != "exit 0" {
			t.Errorf("a command after the kill: %q, %s", out, exitCode(st))
		}
		return nil
	})
}

// TestStopLoopHoldsUpNoNewCommand: a command created while the engine
// waits on the session's container (the stop loop stopped an exec's
// start) runs all the same, soon: sandboxd frees the engine, ending the
// loop and what it stopped.
func TestStopLoopHoldsUpNoNewCommand(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const sid = "stop-loop-create"
	loop, _, container, _ := startStopLoop(t, ctx, srv, a, sid)
	within(t, "a command created while the engine waits", 30*time.Second, func() error {
		out, st := sh(t, ctx, a, sid, "echo alive")
		if out != "alive\n" || exitCode(st) != "exit 0" {
			t.Errorf("a command created while the engine waits: %q, %s", out, exitCode(st))
		}
		return nil
	})
	if st, err := a.WaitForTerminalExit(ctx, acpsdk.WaitForTerminalExitRequest{SessionId: sid, TerminalId: loop}); err != nil || exitCode(st) != "signal SIGKILL" {
		t.Errorf("the loop: %s, %v; want signal SIGKILL", exitCode(st), err)
	}
	if procs := commandProcs(t, container); len(procs) > 0 {
		t.Errorf("processes of the commands' user left: %v", procs)
	}
}

// runBounded runs `sandboxd ARGS...` in dir and fails the test when it
// does not end within limit (it is killed then).
func runBounded(t *testing.T, dir string, limit time.Duration, args ...string) ranSandboxd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, testEnv.bin, args...)
	cmd.Dir = dir
	var stdout, stderr lockedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err := cmd.Run()
	t.Logf("sandboxd %s took %v", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	if ctx.Err() != nil {
		t.Fatalf("sandboxd %s did not end within %v:\n%s%s", strings.Join(args, " "), limit, stdout.String(), stderr.String())
	}
	if err != nil && cmd.ProcessState == nil {
		t.Fatal(err)
	}
	return ranSandboxd{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String(), pid: cmd.Process.Pid}
}

// TestWedgedContainerOfACrashedInstance: sandboxd dies (SIGKILL) while the
// engine waits on a session's container, and someone's inspect of it
// waits too; the next start and `sandboxd gc` end within a bound, and the
// container goes.
func TestWedgedContainerOfACrashedInstance(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	_, _, container, _ := startStopLoop(t, ctx, srv, a, "crash")
	inspectWaits(t, container)
	srv.cmd.Process.Signal(syscall.SIGKILL)
	<-srv.done

	if r := runBounded(t, ws, 2*time.Minute, "run", "--config", testEnv.config, "--", "true"); r.code != 0 {
		t.Errorf("run -- true after the crash: exit %d: %s", r.code, r.output())
	}
	if r := runBounded(t, ws, 2*time.Minute, "gc"); r.code != 0 {
		t.Errorf("gc: exit %d: %s", r.code, r.output())
	}
	info, err := testEnv.cli.ContainerInspect(ctx, container, client.ContainerInspectOptions{})
	if !engine.IsNotFound(err) {
		t.Errorf("the crashed instance's container is still there (%v, %v)", err, info.Container.State)
	}
	list, err := testEnv.cli.ContainerList(ctx, client.ContainerListOptions{All: true,
		Filters: make(client.Filters).Add("label", sandbox.LabelSession+"=crash")})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list.Items {
		if c.ID == container {
			t.Errorf("docker ps -a still lists %.12s", c.ID)
		}
	}
}

// TestKillAllOfItsUserReportsTheTrueExit: a command that kills every other
// process of its user, and goes on, is reported with the status it ended
// with, not as killed; one that a process of its own killed is reported
// as the shell would (137).
func TestKillAllOfItsUserReportsTheTrueExit(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const sid = "kill-all"
	if out, st := sh(t, ctx, a, sid, "kill -9 -1; echo survived"); out != "survived\n" || exitCode(st) != "exit 0" {
		t.Errorf("kill -9 -1; echo survived: %q, %s; want \"survived\\n\", exit 0", out, exitCode(st))
	}
	if out, st := sh(t, ctx, a, sid, "kill -9 -1; exit 3"); out != "" || exitCode(st) != "exit 3" {
		t.Errorf("kill -9 -1; exit 3: %q, %s; want exit 3", out, exitCode(st))
	}
	// busybox's kill applet, a process of its own, kills the shell too.
	if out, st := sh(t, ctx, a, sid, "/bin/kill -9 -1; echo survived"); out != "" || exitCode(st) != "exit 137" {
		t.Errorf("/bin/kill -9 -1; echo survived: %q, %s; want exit 137", out, exitCode(st))
	}
}
