package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	acpsdk "github.com/coder/acp-go-sdk"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/sandbox"
)

func TestMemoryHogIsReportedAsSIGKILL(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := a.CallExtension(ctx, "_sandboxd/session/open", map[string]any{"sessionId": "hog", "cwd": ws, "memory": "64MiB"}); err != nil {
		t.Fatalf("open: %v", err)
	}
	// dd fills a 256 MiB block buffer: four times the limit.
	out, st := sh(t, ctx, a, "hog", "dd if=/dev/zero of=/dev/null bs=256M count=1")
	if got := exitCode(st); got != "signal SIGKILL" {
		t.Errorf("memory hog: %s (output %q), want signal SIGKILL", got, out)
	}
	// A plain `exit 137` is an exit code, not a signal.
	if _, st := sh(t, ctx, a, "hog", "exit 137"); exitCode(st) != "exit 137" {
		t.Errorf("exit 137: %s, want exit 137", exitCode(st))
	}
	if out, st := sh(t, ctx, a, "hog", "echo still here"); out != "still here\n" || exitCode(st) != "exit 0" {
		t.Errorf("session after the OOM kill: %q %s", out, exitCode(st))
	}
}

func TestForkBombIsStoppedByPidsLimit(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := a.CallExtension(ctx, "_sandboxd/session/open", map[string]any{"sessionId": "bomb", "cwd": ws, "pids": 64})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	var opened struct{ Container string }
	if err := json.Unmarshal(res, &opened); err != nil {
		t.Fatal(err)
	}
	// Two bombs, killed at the same time below: each kill borrows pids,
	// and the limit goes back only when both are done.
	var bombs []string
	for range 2 {
		created, err := a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{
			SessionId: "bomb", Command: "/bin/sh", Args: []string{"-c", "while :; do sleep 305 & done"}, OutputByteLimit: ptr(4096),
		})
		if err != nil {
			t.Fatal(err)
		}
		bombs = append(bombs, created.TerminalId)
	}
	// The bombs fill the pids cgroup and can go no further (the second
	// may find it full before its first fork).
	eventually(t, "fork failures", 60*time.Second, func() bool {
		out, err := a.TerminalOutput(ctx, acpsdk.TerminalOutputRequest{SessionId: "bomb", TerminalId: bombs[0]})
		return err == nil && strings.Contains(out.Output, "can't fork")
	})
	pids := func() uint64 {
		stats, err := testEnv.cli.ContainerStats(ctx, opened.Container, client.ContainerStatsOptions{Stream: false})
		if err != nil {
			t.Fatal(err)
		}
		defer stats.Body.Close()
		var s struct {
			PidsStats struct {
				Current uint64 `json:"current"`
			} `json:"pids_stats"`
		}
		if err := json.NewDecoder(stats.Body).Decode(&s); err != nil {
			t.Fatal(err)
		}
		return s.PidsStats.Current
	}
	// A process an exec starts joins the cgroup past its limit (the
	// engine moves it in; only forks are refused): each terminal's first
	// process may be one over. While forks start failing, the engine's
	// exec of a terminal may briefly hold a few more: the count is taken
	// once it settles, and a bomb the limit did not hold never does.
	eventually(t, "the bomb held at the limit of 64 pids", 30*time.Second, func() bool {
		n := pids()
		return n <= uint64(64+len(bombs)) && n >= 32
	})
	// The kills still work with no pid to spare, and the session recovers.
	errs := make(chan error, len(bombs))
	for _, id := range bombs {
		go func() {
			_, err := a.KillTerminal(ctx, acpsdk.KillTerminalRequest{SessionId: "bomb", TerminalId: id})
			errs <- err
		}()
	}
	for range bombs {
		if err := <-errs; err != nil {
			t.Errorf("kill of a bomb: %v", err)
		}
	}
	if out, st := sh(t, ctx, a, "bomb", "ps -o pid,args | grep -c '[s]leep 305' ; cat /sys/fs/cgroup/pids/pids.max"); out != "0\n64\n" {
		t.Errorf("after kill: %q %s; want no sleep left and the limit restored", out, exitCode(st))
	}
}

func TestCrashedInstanceLeavesNothing(t *testing.T) {
	// crash starts sandboxd with a running command, SIGKILLs it and returns
	// its pid, with the orphaned container still there.
	crash := func(t *testing.T, ws string) int {
		srv := startServe(t, ws)
		a := srv.agent()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if _, err := a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: "crash", Command: "sleep", Args: []string{"306"}}); err != nil {
			t.Fatal(err)
		}
		pid := srv.cmd.Process.Pid
		if n := len(containersOf(t, pid)); n != 1 {
			t.Fatalf("containers before the crash = %d, want 1", n)
		}
		srv.cmd.Process.Signal(syscall.SIGKILL)
		<-srv.done
		if n := len(containersOf(t, pid)); n != 1 {
			t.Fatalf("containers right after SIGKILL = %d, want the orphan still there", n)
		}
		return pid
	}
	t.Run("next start removes them", func(t *testing.T) {
		ws := workspace(t)
		pid := crash(t, ws)
		next := startServe(t, ws)
		c := next.raw()
		// The new instance serves at once; the dead one's container goes
		// beside that, so a slow removal holds up no session.
		if rep := c.call(t, 1, "terminal/output", map[string]any{"sessionId": "x", "terminalId": "y"}); rep.Error == nil || rep.Error.Code != -32002 {
			t.Fatalf("new instance not serving: %+v", rep)
		}
		eventually(t, "the crashed instance's containers removed by the next start", time.Minute, func() bool {
			return len(containersOf(t, pid)) == 0
		})
	})
	t.Run("gc removes them", func(t *testing.T) {
		ws := workspace(t)
		pid := crash(t, ws)
		out, err := exec.Command(testEnv.bin, "gc").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "container(s) removed") {
			t.Fatalf("gc: %v %s", err, out)
		}
		assertNoContainers(t, pid)
	})
}

func TestSignalRemovesContainers(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			ws := workspace(t)
			srv := startServe(t, ws)
			a := srv.agent()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if _, err := a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: "sig", Command: "sleep", Args: []string{"307"}}); err != nil {
				t.Fatal(err)
			}
			// Twice, as a closed terminal sends SIGHUP, or Ctrl-C reaches
			// both a wrapper and sandboxd: one request to shut down.
			srv.cmd.Process.Signal(sig)
			srv.cmd.Process.Signal(sig)
			select {
			case <-srv.done:
			case <-time.After(60 * time.Second):
				t.Fatal("sandboxd did not exit on signal")
			}
			assertNoContainers(t, srv.cmd.Process.Pid)
		})
	}
}

// startServeUnix starts `sandboxd serve` on a unix socket in a new
// workspace and returns it once the socket is there.
func startServeUnix(t *testing.T) (*server, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "sandboxd.sock")
	srv := startServe(t, workspace(t), "--listen", "unix:"+sock)
	eventually(t, "socket", 60*time.Second, func() bool {
		_, err := os.Stat(sock)
		return err == nil
	})
	return srv, sock
}

func TestUnixSocketConnectionsAreIsolated(t *testing.T) {
	srv, sock := startServeUnix(t)
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Errorf("socket mode = %o, want 600", perm)
	}
	dial := func() (*acpsdk.AgentSideConnection, net.Conn) {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		a := acpsdk.NewAgentSideConnection(idleAgent{}, c, c)
		a.SetLogger(quietLog)
		return a, c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a1, c1 := dial()
	a2, _ := dial()
	created, err := a1.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: "shared-name", Command: "echo", Args: []string{"mine"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = a2.TerminalOutput(ctx, acpsdk.TerminalOutputRequest{SessionId: "shared-name", TerminalId: created.TerminalId})
	if rpcCode(err) != -32002 {
		t.Errorf("second connection reading the first's terminal: err = %v, want -32002", err)
	}
	// The same session name on the second connection is its own session.
	out, _ := runCmd(t, ctx, a2, acpsdk.CreateTerminalRequest{SessionId: "shared-name", Command: "echo", Args: []string{"yours"}})
	if out.Output != "yours\n" {
		t.Errorf("second connection output = %q", out.Output)
	}
	if n := len(containersOf(t, srv.cmd.Process.Pid)); n != 2 {
		t.Errorf("containers = %d, want one per connection", n)
	}
	// A connection's sessions close when it ends.
	c1.Close()
	eventually(t, "first connection's container removed", 60*time.Second, func() bool {
		return len(containersOf(t, srv.cmd.Process.Pid)) == 1
	})
	srv.cmd.Process.Signal(syscall.SIGTERM)
	<-srv.done
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left after exit: %v", err)
	}
}

func TestRunPassesExitCodeAndOutput(t *testing.T) {
	ws := workspace(t)
	tests := []struct {
		name       string
		args       []string
		code       int
		stdout     string
		stderrPart string
	}{
		{"exit code", []string{"--", "sh", "-c", "echo out; echo err >&2; exit 7"}, 7, "out\n", "err\n"},
		{"signal is 128+n", []string{"--", "sh", "-c", "kill -KILL $$"}, 137, "", ""},
		{"limits apply", []string{"--cpus", "0.5", "--pids", "32", "--", "cat", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/pids/pids.max"}, 0, "50000\n32\n", ""},
		{"workspace is the current directory", []string{"--", "pwd"}, 0, ws + "\n", ""},
		{"a command the image lacks", []string{"--", "nosuchcmd", "x"}, 127, "", "sandboxd: nosuchcmd: No such file or directory (in sandboxd/base:1"},
		{"bad flag value", []string{"--memory", "lots", "--", "true"}, 2, "", "--memory"},
		{"no command", []string{}, 2, "", "no command"},
		// sandboxd's own failure has a code apart from the command's.
		{"missing image", []string{"--image", "sandboxd/missing:1", "--", "true"}, 125, "", "sandboxd/missing:1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := runSandboxd(t, ws, nil, nil, append([]string{"run", "--config", testEnv.config}, tc.args...)...)
			if r.code != tc.code {
				t.Errorf("exit code = %d, want %d (stderr %q)", r.code, tc.code, r.stderr)
			}
			if r.stdout != tc.stdout {
				t.Errorf("stdout = %q, want %q", r.stdout, tc.stdout)
			}
			if !strings.Contains(r.stderr, tc.stderrPart) {
				t.Errorf("stderr = %q, want it to contain %q", r.stderr, tc.stderrPart)
			}
			assertNoContainers(t, r.pid)
		})
	}
}

// startRun starts `sandboxd run --config config -- argv...` in a new
// workspace and returns once the command's output began with first; its
// stdout is out, to read on or close.
func startRun(t *testing.T, ctx context.Context, config, first string, argv ...string) (cmd *exec.Cmd, out io.ReadCloser, stderr *lockedBuffer) {
	t.Helper()
	cmd = exec.CommandContext(ctx, testEnv.bin, append([]string{"run", "--config", config, "--"}, argv...)...)
	cmd.Dir = workspace(t)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr = &lockedBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(first))
	if _, err := io.ReadFull(out, got); err != nil || string(got) != first {
		t.Fatalf("first output %q: %v; stderr %q", got, err, stderr.String())
	}
	return cmd, out, stderr
}

// TestRunIntoAClosedPipe: `sandboxd run -- yes | head -1` closes sandboxd's
// stdout early; as in a shell pipeline, the command ends (sandboxd exits
// 141, 128+SIGPIPE, without dying of the signal itself) and its container
// goes. So too when the command wrote all it had and ended while sandboxd
// still handed the output on: not all of it arrived.
func TestRunIntoAClosedPipe(t *testing.T) {
	for _, tc := range []struct {
		name, first string
		argv        []string
	}{
		{"while the command writes", "y\n", []string{"yes"}},
		{"after the command ended", "x", []string{"sh", "-c", "head -c 2000000 /dev/zero | tr '\\0' x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd, out, stderr := startRun(t, ctx, testEnv.config, tc.first, tc.argv...)
			out.Close()
			cmd.Wait()
			if ctx.Err() != nil {
				t.Fatalf("sandboxd went on running the command after its reader went away; stderr %q", stderr.String())
			}
			if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				t.Errorf("sandboxd died of %v; stderr %q", ws.Signal(), stderr.String())
			}
			if code := cmd.ProcessState.ExitCode(); code != 141 {
				t.Errorf("exit code %d, want 141 (128+SIGPIPE); stderr %q", code, stderr.String())
			}
			assertNoContainers(t, cmd.Process.Pid)
		})
	}
}

// TestRunStopsWhileItsReaderDoesNotRead: SIGTERM stops `sandboxd run`
// whose output's reader stopped reading (`| less` left open), and the
// container goes: the stream from the engine is read on, or the kill
// could not get through.
func TestRunStopsWhileItsReaderDoesNotRead(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd, out, stderr := startRun(t, ctx, testEnv.config, "y\n", "yes")
	defer out.Close()
	// Nothing more is read: the pipe fills, and the command with it.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if ctx.Err() != nil {
		t.Fatalf("sandboxd did not stop while its reader read nothing; stderr %q", stderr.String())
	}
	assertNoContainers(t, cmd.Process.Pid)
}

// TestRunIntoAFullDisk: output that cannot be written (`> /dev/full`) ends
// the command, and sandboxd says so and exits 125, rather than 0 with the
// output lost.
func TestRunIntoAFullDisk(t *testing.T) {
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip(err)
	}
	defer full.Close()
	cmd := exec.Command(testEnv.bin, "run", "--config", testEnv.config, "--", "echo", "hi")
	cmd.Dir = workspace(t)
	var stderr lockedBuffer
	cmd.Stdout, cmd.Stderr = full, &stderr
	cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != 125 || !strings.Contains(stderr.String(), "no space left on device") {
		t.Errorf("exit %d, stderr %q; want 125 and the write's error", code, stderr.String())
	}
	assertNoContainers(t, cmd.Process.Pid)
}

// TestExitRemovesContainersLeftBehind: a container of the instance that no
// session holds any more (its removal failed while the engine was busy) is
// removed when sandboxd exits, not left for a next start that may never
// come.
func TestExitRemovesContainersLeftBehind(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, _ := sh(t, ctx, a, "kept", "echo ok"); out != "ok\n" {
		t.Fatalf("command: %q", out)
	}
	pid := srv.cmd.Process.Pid
	ids := containersOf(t, pid)
	if len(ids) != 1 {
		t.Fatalf("containers = %d, want 1", len(ids))
	}
	own, err := testEnv.cli.ContainerInspect(ctx, ids[0], client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// One the instance made and lost track of: its labels, no session.
	labels := own.Container.Config.Labels
	labels[sandbox.LabelSession] = "lost"
	lost, err := testEnv.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{Image: own.Container.Config.Image, Cmd: []string{"sleep", "307"}, Labels: labels},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		testEnv.cli.ContainerRemove(context.Background(), lost.ID, client.ContainerRemoveOptions{Force: true})
	})
	srv.stop(t)
	assertNoContainers(t, pid)
}

// TestRunDiesOfCtrlC: Ctrl-C kills the command and removes its container,
// and then sandboxd dies of the SIGINT itself, so that a shell running it
// in a loop or a script stops too (a child that merely exits 130 or 143
// lets the loop go on).
func TestRunDiesOfCtrlC(t *testing.T) {
	if signal.Ignored(syscall.SIGINT) {
		t.Skip("SIGINT is ignored here, and so in the sandboxd started")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd, _, stderr := startRun(t, ctx, testEnv.config, "started\n", "sh", "-c", "echo started; sleep 308")
	cmd.Process.Signal(syscall.SIGINT)
	cmd.Wait()
	if ctx.Err() != nil {
		t.Fatalf("sandboxd did not end on SIGINT; stderr %q", stderr.String())
	}
	if st, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !st.Signaled() || st.Signal() != syscall.SIGINT {
		t.Errorf("sandboxd ended with %v, want death by SIGINT; stderr %q", cmd.ProcessState, stderr.String())
	}
	if !strings.Contains(stderr.String(), "sandboxd: stopping") {
		t.Errorf("stderr %q, want it to say it is stopping", stderr.String())
	}
	assertNoContainers(t, cmd.Process.Pid)
}

// TestIgnoredSIGHUPStaysIgnored: `nohup sandboxd serve ... &` must go on
// serving when the terminal it was started from closes.
func TestIgnoredSIGHUPStaysIgnored(t *testing.T) {
	cmd := exec.Command("/bin/sh", append([]string{"-c", `trap "" HUP; exec "$0" "$@"`, testEnv.bin}, serveArgs()...)...)
	cmd.Dir = workspace(t)
	srv := startServeCmd(t, cmd)
	c := srv.raw()
	// Serving: the handlers are in place before the first answer.
	if rep := c.call(t, 1, "terminal/output", map[string]any{"sessionId": "x", "terminalId": "y"}); rep.Error == nil || rep.Error.Code != -32002 {
		t.Fatalf("answer %+v", rep)
	}
	// Still ignored, as the kernel says: no handler took it over.
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`(?m)^SigIgn:\s*([0-9a-f]+)$`).FindSubmatch(status); m == nil {
		t.Fatalf("no SigIgn in %s", status)
	} else if mask, _ := strconv.ParseUint(string(m[1]), 16, 64); mask&(1<<(syscall.SIGHUP-1)) == 0 {
		t.Errorf("SIGHUP is no longer ignored (SigIgn %s)", m[1])
	}
	cmd.Process.Signal(syscall.SIGHUP)
	if rep := c.call(t, 2, "terminal/output", map[string]any{"sessionId": "x", "terminalId": "y"}); rep.Error == nil || rep.Error.Code != -32002 {
		t.Errorf("after SIGHUP: %+v, want sandboxd still serving", rep)
	}
	srv.stop(t)
	if srv.err != nil {
		t.Errorf("exit after stdin closed: %v", srv.err)
	}
}

// TestSecondSignalStopsAtOnce: a shutdown that takes long (here a command
// that ignores SIGTERM under a long kill grace) ends at once on a second
// Ctrl-C that comes 2 s or more after the first, saying what it leaves;
// the ones that come sooner are the same request.
func TestSecondSignalStopsAtOnce(t *testing.T) {
	if signal.Ignored(syscall.SIGINT) {
		t.Skip("SIGINT is ignored here, and so in the sandboxd started")
	}
	cfg := filepath.Join(t.TempDir(), "slow.toml")
	writeFile(t, cfg, "[terminal]\nkill_grace = \"5m\"\n")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd, _, stderr := startRun(t, ctx, cfg, "started\n", "sh", "-c", "trap '' TERM; echo started; while :; do sleep 1; done")
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		exec.Command(testEnv.bin, "gc").Run()
		assertNoContainers(t, pid)
	})
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	// Ctrl-C again and again, as an impatient person does, until it ends.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	sent := 0
	for ended := false; !ended; {
		select {
		case <-tick.C:
			cmd.Process.Signal(syscall.SIGINT)
			sent++
		case <-done:
			ended = true
		case <-ctx.Done():
			t.Fatalf("sandboxd did not stop after %d Ctrl-C; stderr %q", sent, stderr.String())
		}
	}
	if st, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !st.Signaled() || st.Signal() != syscall.SIGINT {
		t.Errorf("sandboxd ended with %v, want death by SIGINT", cmd.ProcessState)
	}
	if !strings.Contains(stderr.String(), "stopping at once") || !strings.Contains(stderr.String(), "sandboxd gc") {
		t.Errorf("stderr %q, want it to say it stops at once and what removes what it left", stderr.String())
	}
	if sent < 2 {
		t.Errorf("ended after %d Ctrl-C; the command ignores SIGTERM for 5 minutes", sent)
	}
}

// TestConnectionClosedMidCreateLeavesNothing: a peer that asks for a
// terminal and hangs up at once leaves no container on a server that goes
// on serving others (each would hold one of server.max_sessions for good).
func TestConnectionClosedMidCreateLeavesNothing(t *testing.T) {
	srv, sock := startServeUnix(t)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			c, err := net.Dial("unix", sock)
			if err != nil {
				t.Error(err)
				return
			}
			fmt.Fprintf(c, `{"jsonrpc":"2.0","id":1,"method":"terminal/create","params":{"sessionId":"s%d","command":"sleep","args":["309"]}}`+"\n", i)
			c.Close()
		})
	}
	wg.Wait()
	// Each connection's sessions close as it ends, once its requests are
	// answered; none may come after.
	eventually(t, "every connection closed", 60*time.Second, func() bool {
		return strings.Count(srv.stderr.String(), `msg="connection closed"`) == 20
	})
	pid := srv.cmd.Process.Pid
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(c, `{"jsonrpc":"2.0","id":1,"method":"terminal/output","params":{"sessionId":"x","terminalId":"y"}}`)
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.Contains(line, "-32002") {
		t.Fatalf("server not serving: %q, %v", line, err)
	}
	c.Close()
	assertNoContainers(t, pid)
	srv.cmd.Process.Signal(syscall.SIGTERM)
	<-srv.done
}

// TestHelperFloodLeavesSandboxdAlone: sandboxd's own commands in a
// container run as the session's user, so a command of the session can
// stop one and write into its output without end. sandboxd reads a bounded
// amount and gives up on it: the exit status still comes, the kill is
// still answered, and sandboxd's memory does not follow the flood.
func TestHelperFloodLeavesSandboxdAlone(t *testing.T) {
	bin, err := buildHelper("testflood")
	if err != nil {
		t.Fatal(err)
	}
	ws := workspace(t)
	flood := filepath.Join(ws, "testflood")
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, flood, string(b))
	if err := os.Chmod(flood, 0o755); err != nil {
		t.Fatal(err)
	}
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	peak := procStatus(t, srv.cmd.Process.Pid, "VmHWM")
	// exit 137 makes sandboxd read the OOM-kill counter with cat. The
	// pattern is put together, lest the command's own shell match it.
	_, st := sh(t, ctx, a, "flood", "p=oom_; "+flood+" ${p}control /tmp/ready >/dev/null 2>&1 & while [ ! -e /tmp/ready ]; do sleep 0.01; done; exit 137")
	if got := exitCode(st); got != "exit 137" {
		t.Errorf("exit status %s, want exit 137", got)
	}
	// terminal/kill runs the kill script.
	created, err := a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: "flood", Command: "k=known; " + flood + " $k= /tmp/ready2 & while [ ! -e /tmp/ready2 ]; do sleep 0.01; done; echo watching; sleep 300"})
	if err != nil {
		t.Fatal(err)
	}
	ids := acpsdk.KillTerminalRequest{SessionId: "flood", TerminalId: created.TerminalId}
	eventually(t, "the flood watching", time.Minute, func() bool {
		out, err := a.TerminalOutput(ctx, acpsdk.TerminalOutputRequest{SessionId: "flood", TerminalId: created.TerminalId})
		return err == nil && strings.Contains(out.Output, "watching")
	})
	// Answered, as an error: the kill script's output was flooded, and so
	// was its retry's.
	if _, err := a.KillTerminal(ctx, ids); err != nil && ctx.Err() != nil {
		t.Fatalf("kill not answered: %v", err)
	}
	// sandboxd reads at most 4 MiB of each of two streams per helper; the
	// race detector's shadow memory multiplies what it allocates.
	limit := int64(64 << 20)
	if raceEnabled {
		limit *= 8
	}
	grew := procStatus(t, srv.cmd.Process.Pid, "VmHWM") - peak
	t.Logf("sandboxd's peak memory grew by %d MiB", grew>>20)
	if grew > limit {
		t.Errorf("sandboxd's peak memory grew by %d MiB with the flood, want at most %d", grew>>20, limit>>20)
	}
}
