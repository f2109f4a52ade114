package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	acpsdk "github.com/coder/acp-go-sdk"
)

// staticAgent builds integration/testagent statically (CGO_ENABLED=0), so
// that it runs in any image, the busybox base included.
var staticAgent = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "sandboxd-testagent-static-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "testagent")
	cmd := exec.Command("go", "build", "-o", bin, "./testagent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build static testagent: %v: %s", err, out)
	}
	return bin, nil
})

// startContained starts `sandboxd wrap --contain` in ws with flags, the
// static test agent mounted read-only where the host has the test agent,
// whose path the wrap is given (and looks up in the container).
func startContained(t testing.TB, ws string, flags ...string) *wrapped {
	t.Helper()
	static, err := staticAgent()
	if err != nil {
		t.Fatal(err)
	}
	agentBin, err := testAgent()
	if err != nil {
		t.Fatal(err)
	}
	return startWrapWith(t, ws, acpsdk.ClientCapabilities{}, false, append([]string{"--contain", "-v", static + ":" + agentBin + ":ro"}, flags...)...)
}

// hostServer serves "hello from the host" on the host's loopback and
// returns its port.
func hostServer(t testing.TB) int {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from the host")
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().(*net.TCPAddr).Port
}

// auditEvents reads the audit log's events.
func auditEvents(t testing.TB, file string) []map[string]any {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var evs []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var ev map[string]any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("audit line %q: %v", sc.Text(), err)
		}
		if _, err := time.Parse(time.RFC3339Nano, fmt.Sprint(ev["time"])); err != nil || !strings.Contains(fmt.Sprint(ev["time"]), ".") {
			t.Errorf("audit time %v: not RFC 3339 with a fraction of a second", ev["time"])
		}
		evs = append(evs, ev)
	}
	return evs
}

// findEvent returns the first event of kind for which match holds.
func findEvent(evs []map[string]any, kind string, match func(map[string]any) bool) map[string]any {
	for _, ev := range evs {
		if ev["event"] == kind && match(ev) {
			return ev
		}
	}
	return nil
}

// TestContainRunsTheAgentInside: the agent runs in the container, with
// everything it does itself, and its only way out is the allowlist.
func TestContainRunsTheAgentInside(t *testing.T) {
	ws := workspace(t)
	hostOnly := filepath.Join(t.TempDir(), "host-only")
	writeFile(t, hostOnly, "secret")
	allowed, other := hostServer(t), hostServer(t)
	auditFile := filepath.Join(t.TempDir(), "audit.jsonl")
	t.Setenv("SANDBOXD_TEST_SECRET", "s3cr3t-value")
	w := startContained(t, ws, "--allow-host", fmt.Sprintf("localhost:%d", allowed), "--audit", auditFile, "--env", "SANDBOXD_TEST_SECRET")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sid := w.newSession(t, ctx, ws)

	t.Run("its own commands run inside", func(t *testing.T) {
		out := w.prompt(t, ctx, sid, fmt.Sprintf("exec cat %s || echo invisible; echo made > made.txt; id -u", hostOnly))
		if strings.Contains(out, "secret") || !strings.Contains(out, "invisible") || !strings.Contains(out, "output=") {
			t.Errorf("a host-only file from the agent's own command: %q", out)
		}
		fi, err := os.Stat(filepath.Join(ws, "made.txt"))
		if err != nil {
			t.Fatalf("the agent's write in the workspace is not on the host: %v", err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1000 || st.Gid != 1000 {
			t.Errorf("made.txt is owned by %d:%d, want the workspace's owner 1000:1000", st.Uid, st.Gid)
		}
	})
	t.Run("its environment", func(t *testing.T) {
		out := w.prompt(t, ctx, sid, "exec echo $SANDBOXD_TEST_SECRET $HTTPS_PROXY $https_proxy $NO_PROXY")
		if want := "s3cr3t-value http://127.0.0.1:3128 http://127.0.0.1:3128 localhost,127.0.0.1"; !strings.Contains(out, want) {
			t.Errorf("environment %q, want %q", out, want)
		}
	})
	t.Run("an allowed host through the proxy", func(t *testing.T) {
		if out := w.prompt(t, ctx, sid, fmt.Sprintf("get http://localhost:%d/", allowed)); out != "status=200 body=hello from the host" {
			t.Errorf("GET of the allowed server: %q", out)
		}
	})
	t.Run("another port is refused", func(t *testing.T) {
		out := w.prompt(t, ctx, sid, fmt.Sprintf("get http://127.0.0.1:%d/", other))
		if want := fmt.Sprintf("status=403 body=sandboxd egress: 127.0.0.1:%d is not allowed", other); !strings.HasPrefix(out, want) {
			t.Errorf("GET of a server not allowed: %q, want %q...", out, want)
		}
	})
	t.Run("no way around the proxy", func(t *testing.T) {
		if out := w.prompt(t, ctx, sid, fmt.Sprintf("dial 127.0.0.1:%d", allowed)); out == "dial: ok" || !strings.HasPrefix(out, "dial: ") {
			t.Errorf("a direct connection to the allowed port: %q", out)
		}
	})
	t.Run("no name resolution", func(t *testing.T) {
		host, _ := os.Hostname()
		if _, err := net.LookupHost(host); err != nil {
			t.Skipf("the host cannot resolve its own name %q either: %v", host, err)
		}
		if out := w.prompt(t, ctx, sid, "lookup "+host); !strings.HasPrefix(out, "lookup: error") {
			t.Errorf("a name lookup inside: %q", out)
		}
	})
	var agentContainer string
	t.Run("terminals run in the agent's container", func(t *testing.T) {
		mine := containerInMountinfo.FindStringSubmatch(w.prompt(t, ctx, sid, "exec grep /etc/hostname /proc/self/mountinfo"))
		if mine == nil {
			t.Fatal("the agent's container is not in its mountinfo")
		}
		agentContainer = mine[1]
		if got := w.containerOf(t, ctx, sid); got != agentContainer {
			t.Errorf("a terminal ran in %.12s, the agent in %.12s", got, agentContainer)
		}
		// Also the terminal of a session the editor never opened.
		if out := w.prompt(t, ctx, sid, "elsewhere grep -c "+agentContainer+" /proc/self/mountinfo"); !strings.HasPrefix(out, "exit=0") {
			t.Errorf("a terminal of another session id: %q", out)
		}
		if ids := containersOf(t, w.cmd.Process.Pid); len(ids) != 1 || ids[0] != agentContainer {
			t.Errorf("containers of the wrap: %v, want the agent's alone", ids)
		}
	})
	t.Run("a session elsewhere is refused", func(t *testing.T) {
		elsewhere := t.TempDir()
		_, err := w.conn.NewSession(ctx, acpsdk.NewSessionRequest{Cwd: elsewhere, McpServers: []acpsdk.McpServer{}})
		if msg := rpcMessage(err); !strings.Contains(msg, elsewhere) || !strings.Contains(msg, ws) {
			t.Errorf("session/new outside the workspace: %v", err)
		}
	})
	w.stop(t)
	if strings.Contains(w.logs.String(), "s3cr3t-value") {
		t.Error("the value of an --env variable is in the log")
	}

	evs := auditEvents(t, auditFile)
	t.Run("audit", func(t *testing.T) {
		if ev := findEvent(evs, "agent_start", func(ev map[string]any) bool { return ev["session"] == "contain" }); ev == nil {
			t.Errorf("no agent_start: %v", evs)
		}
		if ev := findEvent(evs, "agent_end", func(ev map[string]any) bool { return ev["exit_code"] != nil && ev["duration_ms"] != nil }); ev == nil {
			t.Errorf("no agent_end with its exit status: %v", evs)
		}
		ok := findEvent(evs, "egress", func(ev map[string]any) bool {
			return ev["host"] == "localhost" && ev["port"] == float64(allowed) && ev["allowed"] == true && ev["method"] == "GET" &&
				ev["bytes_received"].(float64) == float64(len("hello from the host")) && ev["bytes_sent"] != nil && ev["duration_ms"] != nil
		})
		if ok == nil {
			t.Errorf("no egress event for the allowed GET: %v", evs)
		}
		refused := findEvent(evs, "egress", func(ev map[string]any) bool {
			return ev["host"] == "127.0.0.1" && ev["port"] == float64(other) && ev["allowed"] == false && strings.Contains(fmt.Sprint(ev["reason"]), "not allowed")
		})
		if refused == nil {
			t.Errorf("no egress event for the refused GET: %v", evs)
		}
		if ev := findEvent(evs, "egress", func(ev map[string]any) bool { return ev["port"] == float64(allowed) && ev["host"] != "localhost" }); ev != nil {
			t.Errorf("an egress event for a connection that never reached the proxy: %v", ev)
		}
		start := findEvent(evs, "command_start", func(ev map[string]any) bool {
			return strings.Contains(fmt.Sprint(ev["argv"]), "/etc/hostname") && ev["session"] == string(sid) && ev["cwd"] == ws
		})
		if start == nil {
			t.Fatalf("no command_start for the terminal: %v", evs)
		}
		end := findEvent(evs, "command_end", func(ev map[string]any) bool { return ev["terminal"] == start["terminal"] })
		if end == nil || end["exit_code"] != 0.0 || end["output_bytes"].(float64) <= 0 || end["duration_ms"] == nil {
			t.Errorf("command_end of %v: %v", start["terminal"], end)
		}
	})
}

// TestContainWarnsOnlyWithoutIt: an agent that runs a command itself is
// named in the log of a wrap without --contain, once.
func TestContainWarnsOnlyWithoutIt(t *testing.T) {
	const warning = "this agent runs commands itself"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ws := workspace(t)
	w := startWrap(t, ws, acpsdk.ClientCapabilities{})
	sid := w.newSession(t, ctx, ws)
	w.prompt(t, ctx, sid, "run true")
	if strings.Contains(w.logs.String(), warning) {
		t.Error("warned of an agent whose command ran in a terminal of sandboxd's")
	}
	w.prompt(t, ctx, sid, "exec true")
	w.prompt(t, ctx, sid, "exec true")
	if n := strings.Count(w.logs.String(), warning); n != 1 || !strings.Contains(w.logs.String(), "--contain") {
		t.Errorf("warned %d times, want once, naming --contain:\n%s", n, w.logs.String())
	}
	c := startContained(t, workspace(t))
	csid := c.newSession(t, ctx, c.cmd.Dir)
	c.prompt(t, ctx, csid, "exec true")
	if strings.Contains(c.logs.String(), warning) {
		t.Error("warned of a contained agent")
	}
}

// TestContainLeavesNoContainer: however the wrap ends, no container is
// left; the agent's exit code is the wrap's.
func TestContainLeavesNoContainer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, w *wrapped, sid acpsdk.SessionId)
		code int
	}{
		{"editor EOF", func(t *testing.T, w *wrapped, sid acpsdk.SessionId) { w.stdin.Close() }, 0},
		{"agent crash", func(t *testing.T, w *wrapped, sid acpsdk.SessionId) {
			go w.conn.Prompt(ctx, acpsdk.PromptRequest{SessionId: sid, Prompt: []acpsdk.ContentBlock{acpsdk.TextBlock("crash sleep 300")}})
		}, 3},
		{"SIGTERM", func(t *testing.T, w *wrapped, sid acpsdk.SessionId) { w.cmd.Process.Signal(syscall.SIGTERM) }, 128 + int(syscall.SIGTERM)},
		{"SIGKILL and gc", func(t *testing.T, w *wrapped, sid acpsdk.SessionId) {
			w.cmd.Process.Kill()
			<-w.done
			if len(containersOf(t, w.cmd.Process.Pid)) == 0 {
				t.Error("no container to remove after the SIGKILL (the test shows nothing)")
			}
			if r := runSandboxd(t, w.cmd.Dir, nil, nil, "gc"); r.code != 0 {
				t.Errorf("gc: %d %s", r.code, r.output())
			}
		}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := workspace(t)
			w := startContained(t, ws)
			sid := w.newSession(t, ctx, ws)
			// A command of the agent's own, and one in a terminal, left
			// running.
			w.prompt(t, ctx, sid, "exec sleep 300 >/dev/null 2>&1 &")
			w.prompt(t, ctx, sid, "start sleep 301")
			tc.end(t, w, sid)
			select {
			case <-w.done:
			case <-time.After(60 * time.Second):
				t.Fatal("wrap did not exit")
			}
			if code := w.cmd.ProcessState.ExitCode(); code != tc.code {
				t.Errorf("wrap exit code = %d, want %d", code, tc.code)
			}
			assertNoContainers(t, w.cmd.Process.Pid)
		})
	}
}

// TestContainRefusesBadInput: each is refused at start, with exit 2 and a
// message, before any container.
func TestContainRefusesBadInput(t *testing.T) {
	ws := workspace(t)
	os.Unsetenv("SANDBOXD_NOT_SET")
	for _, tc := range []struct {
		name string
		args []string
		want string
		code int // 2 unless set
	}{
		{"allow entry", []string{"--contain", "--allow-host", "not a host:x"}, "--allow-host", 0},
		{"allow wildcard of a whole domain", []string{"--contain", "--allow-host", "*.com"}, "wildcard", 0},
		{"env not set", []string{"--contain", "--env", "SANDBOXD_NOT_SET"}, `--env "SANDBOXD_NOT_SET" is not set`, 0},
		{"-v of /proc", []string{"--contain", "-v", "/proc:/p"}, "/proc", 0},
		{"-v onto the gateway", []string{"--contain", "-v", ws + ":/run/sandboxd"}, "egress gateway", 0},
		{"-v without --contain", []string{"-v", ws + ":/x"}, "needs --contain", 0},
		{"an agent the image lacks", []string{"--contain", "--log-level", "error"}, "cannot run the agent agent: no such file or directory (looked up on the container's PATH", 125},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runSandboxd(t, ws, strings.NewReader(""), nil, append(append([]string{"wrap", "--config", testEnv.config}, tc.args...), "--", "agent")...)
			code, lines := 2, 1
			if tc.code != 0 {
				code, lines = tc.code, 2 // the agent's own line, then sandboxd's
			}
			if r.code != code || !strings.Contains(r.stderr, tc.want) || strings.Count(strings.TrimSpace(r.stderr), "\n") >= lines {
				t.Errorf("exit %d, stderr %q; want %d and %d line(s) saying %q", r.code, r.stderr, code, lines, tc.want)
			}
			assertNoContainers(t, r.pid)
		})
	}
}
