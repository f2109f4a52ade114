package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	acpsdk "github.com/coder/acp-go-sdk"
)

// fdCount counts a process's open file descriptors.
func fdCount(t testing.TB, pid int) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestReleasedTerminalsLeaveNoDescriptors(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Warm up: the session, the engine connection pool.
	sh(t, ctx, a, "fds", "true")
	before := fdCount(t, srv.cmd.Process.Pid)
	ids := terminals(t, ctx, a, "fds", 20, "sleep", "308")
	for _, id := range ids {
		if _, err := a.ReleaseTerminal(ctx, acpsdk.ReleaseTerminalRequest{SessionId: "fds", TerminalId: id}); err != nil {
			t.Fatal(err)
		}
	}
	// Idle keep-alive connections to the engine may linger a little; the
	// 20 hijacked exec connections must not.
	eventually(t, "descriptors back to the baseline", 30*time.Second, func() bool {
		return fdCount(t, srv.cmd.Process.Pid) <= before+4
	})
	// Nor do finished terminals that are not released (yet): their
	// output stays, their connection goes.
	ids = terminals(t, ctx, a, "fds", 20, "true")
	for _, id := range ids {
		if _, err := a.WaitForTerminalExit(ctx, acpsdk.WaitForTerminalExitRequest{SessionId: "fds", TerminalId: id}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "descriptors of finished terminals closed", 30*time.Second, func() bool {
		return fdCount(t, srv.cmd.Process.Pid) <= before+4
	})
}

// startServeWithConfig serves ws with a configuration file holding text.
func startServeWithConfig(t *testing.T, ws, text string) *server {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "sandbox.toml")
	writeFile(t, cfg, text)
	return startServe(t, ws, "--config", cfg)
}

// sleepers starts n terminals that sleep in session and returns their ids.
func sleepers(t *testing.T, ctx context.Context, a *acpsdk.AgentSideConnection, session string, n int) []string {
	t.Helper()
	return terminals(t, ctx, a, session, n, "sleep", "309")
}

// terminals starts n terminals running command with args in session and
// returns their ids.
func terminals(t *testing.T, ctx context.Context, a *acpsdk.AgentSideConnection, session string, n int, command string, args ...string) []string {
	t.Helper()
	var ids []string
	for range n {
		c, err := a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: acpsdk.SessionId(session), Command: command, Args: args})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.TerminalId)
	}
	return ids
}

func TestConfiguredMaximums(t *testing.T) {
	ws := workspace(t)
	srv := startServeWithConfig(t, ws, `
[terminal]
max_terminals = 2
kill_grace = "1s"
[server]
max_sessions = 1
idle_timeout = "2s"
`)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ids := sleepers(t, ctx, a, "one", 2)
	_, err := a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: "one", Command: "true"})
	if err == nil || !strings.Contains(rpcMessage(err), "max_terminals") {
		t.Errorf("third terminal: err = %v, want a refusal naming max_terminals", err)
	}
	_, err = a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: "two", Command: "true"})
	if err == nil || !strings.Contains(rpcMessage(err), "max_sessions") {
		t.Errorf("second session: err = %v, want a refusal naming max_sessions", err)
	}
	// Released terminals free their slot.
	if _, err := a.ReleaseTerminal(ctx, acpsdk.ReleaseTerminalRequest{SessionId: "one", TerminalId: ids[0]}); err != nil {
		t.Fatal(err)
	}
	if out, _ := sh(t, ctx, a, "one", "echo slot"); out != "slot\n" {
		t.Errorf("after release: %q", out)
	}
	// A running command keeps the session alive past the idle timeout;
	// once it is gone and nothing is asked, the session is closed.
	if _, err := a.ReleaseTerminal(ctx, acpsdk.ReleaseTerminalRequest{SessionId: "one", TerminalId: ids[1]}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "idle session closed", 30*time.Second, func() bool {
		return len(containersOf(t, srv.cmd.Process.Pid)) == 0
	})
	_, err = a.TerminalOutput(ctx, acpsdk.TerminalOutputRequest{SessionId: "one", TerminalId: ids[1]})
	if rpcCode(err) != -32002 {
		t.Errorf("after idle close: err = %v, want -32002", err)
	}
	// The session's id is not spent: the next command opens it again,
	// and an explicitly opened session comes back as it was opened.
	if out, _ := sh(t, ctx, a, "one", "echo again"); out != "again\n" {
		t.Errorf("after idle close, a new command: %q", out)
	}
	if _, err := a.CallExtension(ctx, "_sandboxd/session/close", map[string]any{"sessionId": "one"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.CallExtension(ctx, "_sandboxd/session/open", map[string]any{"sessionId": "tuned", "cwd": ws, "pids": 64}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "idle session closed", 30*time.Second, func() bool {
		return len(containersOf(t, srv.cmd.Process.Pid)) == 0
	})
	if out, _ := sh(t, ctx, a, "tuned", "cat /sys/fs/cgroup/pids/pids.max"); out != "64\n" {
		t.Errorf("an opened session after idle close: pids.max %q, want its 64", out)
	}
}

// TestUnreleasedTerminalsOutliveTheIdleTimeout: a terminal id stays good
// until terminal/release, so a session holding an exited but unreleased
// terminal is not idle; one whose terminals are all released is.
func TestUnreleasedTerminalsOutliveTheIdleTimeout(t *testing.T) {
	ws := workspace(t)
	srv := startServeWithConfig(t, ws, "[server]\nidle_timeout = \"2s\"\n")
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Used first, so it is the longer idle of the two.
	kept, err := a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: "keep", Command: "echo kept"})
	if err != nil {
		t.Fatal(err)
	}
	ids := acpsdk.WaitForTerminalExitRequest{SessionId: "keep", TerminalId: kept.TerminalId}
	if _, err := a.WaitForTerminalExit(ctx, ids); err != nil {
		t.Fatal(err)
	}
	if out, _ := sh(t, ctx, a, "go", "true"); out != "" {
		t.Fatalf("go: %q", out)
	}
	eventually(t, "the session with nothing unreleased closed", 30*time.Second, func() bool {
		return len(containersOf(t, srv.cmd.Process.Pid)) == 1
	})
	out, err := a.TerminalOutput(ctx, acpsdk.TerminalOutputRequest{SessionId: "keep", TerminalId: kept.TerminalId})
	if err != nil || out.Output != "kept\n" || out.ExitStatus == nil {
		t.Fatalf("unreleased terminal after the idle timeout: %+v, %v", out, err)
	}
	if _, err := a.ReleaseTerminal(ctx, acpsdk.ReleaseTerminalRequest{SessionId: "keep", TerminalId: kept.TerminalId}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the released session closed", 30*time.Second, func() bool {
		return len(containersOf(t, srv.cmd.Process.Pid)) == 0
	})
}

// TestOutputMemoryIsBounded: the output buffers of unreleased terminals
// live in sandboxd's memory, so together they are bounded.
func TestOutputMemoryIsBounded(t *testing.T) {
	ws := workspace(t)
	srv := startServeWithConfig(t, ws, `
[terminal]
max_output_byte_limit = "1MiB"
[server]
max_output_memory = "2MiB"
`)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ids := sleepers(t, ctx, a, "one", 2)
	_, err := a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: "one", Command: "true"})
	if rpcCode(err) != -32800 || !strings.Contains(rpcMessage(err), "server.max_output_memory") {
		t.Errorf("a third 1 MiB buffer: err = %v, want -32800 naming server.max_output_memory", err)
	}
	if out, _ := runCmd(t, ctx, a, acpsdk.CreateTerminalRequest{SessionId: "one", Command: "echo", Args: []string{"x"}, OutputByteLimit: ptr(0)}); out.Output != "" {
		t.Errorf("a terminal that keeps no output: %q", out.Output)
	}
	if _, err := a.ReleaseTerminal(ctx, acpsdk.ReleaseTerminalRequest{SessionId: "one", TerminalId: ids[0]}); err != nil {
		t.Fatal(err)
	}
	if out, _ := sh(t, ctx, a, "one", "echo freed"); out != "freed\n" {
		t.Errorf("after release: %q", out)
	}
}

// TestReleaseKillsACommandWithoutItsMarker: without the engine's init, a
// command that drops the marker the kill finds processes by is still
// ended by its release (the kill also finds the session the engine gave
// the command), so its output buffer stops counting against
// server.max_output_memory.
func TestReleaseKillsACommandWithoutItsMarker(t *testing.T) {
	ws := workspace(t)
	srv := startServeWithConfig(t, ws, `
[session]
init = false
[terminal]
max_output_byte_limit = "1MiB"
kill_grace = "0s"
[server]
max_output_memory = "2MiB"
`)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mib := 1 << 20
	c, err := a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: "one", Command: "exec env -u SANDBOXD_TERMINAL sleep 300", OutputByteLimit: &mib})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.ReleaseTerminal(ctx, acpsdk.ReleaseTerminalRequest{SessionId: "one", TerminalId: c.TerminalId}); err != nil {
		t.Errorf("release of a command without its marker: %v", err)
	}
	for i := range 2 {
		if _, err := a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: "one", Command: "sleep 300", OutputByteLimit: &mib}); err != nil {
			t.Fatalf("1 MiB buffer %d after the release: %v", i+1, err)
		}
	}
	_, err = a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: "one", Command: "true", OutputByteLimit: &mib})
	if rpcCode(err) != -32800 || !strings.Contains(rpcMessage(err), "server.max_output_memory") {
		t.Errorf("a third 1 MiB buffer: err = %v, want -32800 naming server.max_output_memory", err)
	}
}

func TestKilledSessionReportsSIGKILL(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: "gone", Command: "sleep", Args: []string{"310"}})
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := a.WaitForTerminalExit(ctx, acpsdk.WaitForTerminalExitRequest{SessionId: "gone", TerminalId: c.TerminalId})
		waited <- err
	}()
	if _, err := a.CallExtension(ctx, "_sandboxd/session/close", map[string]any{"sessionId": "gone"}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		// The wait ends either with the status or with -32002 for a
		// terminal that no longer exists; it must not hang.
		if err != nil && rpcCode(err) != -32002 {
			t.Errorf("wait after session close: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("wait_for_exit hangs after its session closed")
	}
}

// TestPipelinedOutputRequestsDoNotStall: a peer that writes all its
// terminal/output requests before it reads any reply (more than the pipes
// hold either way) still gets every answer: sandboxd goes on reading
// while it bounds how many replies it builds at once.
func TestPipelinedOutputRequestsDoNotStall(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	c := srv.raw()
	rep := c.call(t, 1, "terminal/create", map[string]any{"sessionId": "p", "command": "head -c 50000 /dev/zero | tr '\\0' x"})
	if rep.Error != nil {
		t.Fatalf("create: %+v", rep.Error)
	}
	var term struct{ TerminalID string }
	if err := json.Unmarshal(rep.Result, &term); err != nil {
		t.Fatal(err)
	}
	ids := map[string]any{"sessionId": "p", "terminalId": term.TerminalID}
	if rep := c.call(t, 2, "terminal/wait_for_exit", ids); rep.Error != nil {
		t.Fatalf("wait: %+v", rep.Error)
	}
	// 400 requests of 1 KB, each answered with 50 KB.
	const n = 400
	pad := strings.Repeat("p", 1000)
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"jsonrpc":"2.0","id":%d,"method":"terminal/output","params":{"sessionId":"p","terminalId":%q,"_meta":{"pad":%q}}}`+"\n", 100+i, term.TerminalID, pad)
		if i == n/2 {
			// Each answered by the reader itself, not by a request's
			// goroutine: they must not stop it either.
			b.WriteString("not JSON\n")
			b.WriteString(`{"jsonrpc":"2.0","id":"c","method":"$/cancel_request","params":{"requestId":"none"}}` + "\n")
			b.WriteString(`{"jsonrpc":"2.0","id":null,"method":"terminal/output","params":{}}` + "\n")
		}
	}
	sent := make(chan error, 1)
	go func() {
		_, err := io.WriteString(srv.stdin, b.String())
		sent <- err
	}()
	select {
	case err := <-sent:
		if err != nil {
			t.Fatalf("send: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("sandboxd stopped reading requests while its replies waited to be read")
	}
	outputs := 0
	for range n + 3 {
		rep := c.recv(t)
		if strings.Contains(string(rep.Result), "xxxx") {
			outputs++
		} else if string(rep.ID) != `"c"` && rep.Error == nil {
			t.Fatalf("reply %s: %.200s", rep.ID, rep.Result)
		}
	}
	if outputs != n {
		t.Errorf("%d outputs answered, want %d", outputs, n)
	}
}
