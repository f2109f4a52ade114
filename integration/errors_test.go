package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	acpsdk "github.com/coder/acp-go-sdk"
	"github.com/moby/moby/client"
)

func TestBadRequestsLeaveOthersAlone(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	c := srv.raw()
	// A terminal that must survive everything below.
	rep := c.call(t, 1, "terminal/create", map[string]any{"sessionId": "good", "command": "/bin/sh", "args": []string{"-c", "echo alive; sleep 304"}})
	if rep.Error != nil {
		t.Fatalf("create: %+v", rep.Error)
	}
	var good struct{ TerminalID string }
	if err := jsonUnmarshal(rep.Result, &good); err != nil {
		t.Fatal(err)
	}
	// Its output is there before the bad requests, so that the check
	// after them tells survival from a slow start.
	id := 10000
	eventually(t, "the good terminal's output", 30*time.Second, func() bool {
		id++
		rep := c.call(t, id, "terminal/output", map[string]any{"sessionId": "good", "terminalId": good.TerminalID})
		return rep.Error == nil && strings.Contains(string(rep.Result), `"output":"alive\n"`)
	})

	tests := []struct {
		name   string
		method string
		params any
		code   int
		names  string // the message must contain this
	}{
		{"unknown session", "terminal/output", map[string]any{"sessionId": "nope", "terminalId": "term_x"}, -32002, "nope"},
		{"unknown terminal", "terminal/output", map[string]any{"sessionId": "good", "terminalId": "term_missing"}, -32002, "term_missing"},
		{"missing terminalId", "terminal/wait_for_exit", map[string]any{"sessionId": "good"}, -32602, "terminalId"},
		{"missing command", "terminal/create", map[string]any{"sessionId": "good"}, -32602, "command"},
		{"wrong-typed sessionId", "terminal/kill", map[string]any{"sessionId": 7, "terminalId": "x"}, -32602, "sessionId"},
		{"params not an object", "terminal/create", []string{"x"}, -32602, "params"},
		{"relative cwd", "terminal/create", map[string]any{"sessionId": "good", "command": "true", "cwd": "sub"}, -32602, "cwd"},
		{"cwd outside the workspace", "terminal/create", map[string]any{"sessionId": "good", "command": "true", "cwd": "/etc"}, -32602, "cwd"},
		{"cwd that does not exist", "terminal/create", map[string]any{"sessionId": "good", "command": "true", "cwd": ws + "/nope"}, -32602, "nope"},
		{"a new session in a cwd that does not exist", "terminal/create", map[string]any{"sessionId": "other", "command": "true", "cwd": ws + "/nope"}, -32602, "nope"},
		{"open in a cwd that does not exist", "_sandboxd/session/open", map[string]any{"sessionId": "x", "cwd": ws + "/nope"}, -32602, "nope"},
		{"cwd escaping with ..", "terminal/create", map[string]any{"sessionId": "good", "command": "true", "cwd": ws + "/../.."}, -32602, "cwd"},
		// sh's exec would take it as an option: "illegal option", or in
		// bash -c's empty environment for the next word.
		{"command like an option", "terminal/create", map[string]any{"sessionId": "good", "command": "-c", "args": []string{"env"}}, -32602, "starts with '-'"},
		{"NUL in command", "terminal/create", map[string]any{"sessionId": "good", "command": "ec\u0000ho"}, -32602, "command"},
		{"NUL in an arg", "terminal/create", map[string]any{"sessionId": "good", "command": "echo", "args": []string{"a", "b\u0000"}}, -32602, "args[1]"},
		{"env name with =", "terminal/create", map[string]any{"sessionId": "good", "command": "true", "env": []map[string]string{{"name": "A=B", "value": "x"}}}, -32602, "env[0].name"},
		{"reserved env name", "terminal/create", map[string]any{"sessionId": "good", "command": "true", "env": []map[string]string{{"name": "SANDBOXD_TERMINAL", "value": "x"}}}, -32602, "env[0].name"},
		{"huge argument", "terminal/create", map[string]any{"sessionId": "good", "command": "true", "args": []string{strings.Repeat("x", 1<<20)}}, -32602, "args[0]"},
		{"args too large together", "terminal/create", map[string]any{"sessionId": "good", "command": "echo", "args": slices.Repeat([]string{strings.Repeat("x", 100<<10)}, 25)}, -32602, "ARG_MAX"},
		{"env too large together", "terminal/create", map[string]any{"sessionId": "good", "command": "true", "env": slices.Repeat([]map[string]string{{"name": "V", "value": strings.Repeat("x", 100<<10)}}, 25)}, -32602, "ARG_MAX"},
		{"message over 4 MiB", "terminal/create", map[string]any{"sessionId": "good", "command": "true", "args": []string{strings.Repeat("x", 8<<20)}}, -32600, "longer than"},
		{"unknown method", "terminal/frobnicate", map[string]any{}, -32601, "terminal/frobnicate"},
		{"open without cwd", "_sandboxd/session/open", map[string]any{"sessionId": "x"}, -32602, "cwd"},
		{"open with relative cwd", "_sandboxd/session/open", map[string]any{"sessionId": "x", "cwd": "rel"}, -32602, "cwd"},
		{"open above the maximum memory", "_sandboxd/session/open", map[string]any{"sessionId": "x", "cwd": ws, "memory": "64GiB"}, -32602, "memory"},
		{"open with nonsense cpus", "_sandboxd/session/open", map[string]any{"sessionId": "x", "cwd": ws, "cpus": "lots"}, -32602, "cpus"},
		{"open with too few pids", "_sandboxd/session/open", map[string]any{"sessionId": "x", "cwd": ws, "pids": 2}, -32602, "pids"},
		{"open with host network", "_sandboxd/session/open", map[string]any{"sessionId": "x", "cwd": ws, "network": "host"}, -32602, "network"},
		{"open with an image not allowed", "_sandboxd/session/open", map[string]any{"sessionId": "x", "cwd": ws, "image": "sandboxd/base:secrets"}, -32602, "session.images"},
		{"open an open session", "_sandboxd/session/open", map[string]any{"sessionId": "good", "cwd": ws}, -32602, "good"},
		{"close unknown session", "_sandboxd/session/close", map[string]any{"sessionId": "nope"}, -32002, "nope"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep := c.call(t, 100+i, tc.method, tc.params)
			if rep.Error == nil {
				t.Fatalf("result %s, want error %d", rep.Result, tc.code)
			}
			if rep.Error.Code != tc.code || !strings.Contains(rep.Error.Message, tc.names) {
				t.Errorf("error = %d %q, want %d naming %q", rep.Error.Code, rep.Error.Message, tc.code, tc.names)
			}
		})
	}

	t.Run("malformed JSON", func(t *testing.T) {
		c.send(t, `{"jsonrpc":"2.0","id":9,"method":`)
		rep := c.recv(t)
		if rep.Error == nil || rep.Error.Code != -32700 {
			t.Fatalf("reply = %+v, want parse error -32700", rep.Error)
		}
		c.send(t, `[1,2`)
		if rep := c.recv(t); rep.Error == nil || rep.Error.Code != -32700 {
			t.Fatalf("reply = %+v, want parse error -32700", rep.Error)
		}
	})

	// The good terminal is still running and readable.
	rep = c.call(t, 999, "terminal/output", map[string]any{"sessionId": "good", "terminalId": good.TerminalID})
	if rep.Error != nil || !strings.Contains(string(rep.Result), `"output":"alive\n"`) || strings.Contains(string(rep.Result), "exitStatus") {
		t.Errorf("good terminal after bad requests: %s %+v", rep.Result, rep.Error)
	}
}

func TestMissingImageAndEngineSaySo(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "missing-image.toml")
	writeFile(t, cfg, "[session]\nimage = \"sandboxd/does-not-exist:1\"\n")
	out, err := exec.Command(testEnv.bin, "serve", "--config", cfg).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "sandboxd/does-not-exist:1") || !strings.Contains(string(out), "docker pull") {
		t.Errorf("serve with a missing image: err %v, output %q; want a failure that names the image and what to run", err, out)
	}

	cmd := exec.Command(testEnv.bin, "serve")
	cmd.Env = append(cmd.Environ(), "DOCKER_HOST=unix://"+filepath.Join(dir, "no-engine.sock"))
	out, err = cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "Docker Engine running") {
		t.Errorf("serve without an engine: err %v, output %q; want a failure that says to start the engine", err, out)
	}
}

// TestImageWithoutSleepSaysSoAndLeavesNoContainer opens a session in an
// image that has no sleep: the engine starts its container as if all were
// well and it stops at once. The agent learns why, and the container is
// gone while sandboxd still runs, not only at its exit.
func TestImageWithoutSleepSaysSoAndLeavesNoContainer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ref = "sandboxd-test/no-sleep:1"
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	body := []byte("nothing to run here\n")
	if err := tw.WriteHeader(&tar.Header{Name: "README", Mode: 0o644, Size: int64(len(body))}); err != nil {
		t.Fatal(err)
	}
	tw.Write(body)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	res, err := testEnv.cli.ImageImport(ctx, client.ImageImportSource{Source: &layer, SourceName: "-"}, ref, client.ImageImportOptions{})
	if err != nil {
		t.Fatalf("import an image without sleep: %v", err)
	}
	io.Copy(io.Discard, res)
	res.Close()
	t.Cleanup(func() {
		testEnv.cli.ImageRemove(context.Background(), ref, client.ImageRemoveOptions{Force: true})
	})
	cfg := filepath.Join(t.TempDir(), "no-sleep.toml")
	writeFile(t, cfg, strings.Replace(testConfig, "[session]\n", "[session]\nimage = \""+ref+"\"\n", 1))

	cmd := exec.Command(testEnv.bin, "serve", "--config", cfg)
	cmd.Dir = workspace(t)
	srv := startServeCmd(t, cmd)
	c := srv.raw()
	rep := c.call(t, 1, "terminal/create", map[string]any{"sessionId": "s", "command": "true"})
	if rep.Error == nil {
		t.Fatalf("terminal/create in an image without sleep: %s, want an error", rep.Result)
	}
	for _, want := range []string{"exit code 127", "sleep", ref} {
		if !strings.Contains(rep.Error.Message, want) {
			t.Errorf("error %q does not say %q", rep.Error.Message, want)
		}
	}
	if ids := containersOf(t, cmd.Process.Pid); len(ids) > 0 {
		t.Errorf("the failed start left %d container(s) while sandboxd runs: %v", len(ids), ids)
	}
}

func TestBadConfigNamesFileLineAndKey(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, text, want string
	}{
		{"bad memory", "[session]\ncpus = \"1\"\nmemory = \"-5m\"\n", ":3: session.memory"},
		{"too few pids", "[session]\npids = 4\n", ":2: session.pids"},
		{"too many cpus", "[session]\ncpus = 4096\n", ":2: session.cpus"},
		{"unknown key", "[terminal]\nkill_grace = \"1s\"\nkil_grace = \"2s\"\n", ":3: terminal.kil_grace"},
		{"bad duration", "[terminal]\nkill_grace = \"soon\"\n", ":2: terminal.kill_grace"},
		{"root user", "[session]\nuser = \"0:0\"\n", ":2: session.user"},
		{"syntax", "[session\n", ":2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".toml")
			writeFile(t, file, tc.text)
			out, err := exec.Command(testEnv.bin, "serve", "--config", file).CombinedOutput()
			if err == nil || !strings.Contains(string(out), file+tc.want) {
				t.Errorf("err %v, output %q, want it to name %q", err, out, file+tc.want)
			}
		})
	}
}

func TestSessionOpenOverridesAndClose(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	a := srv.agent()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := a.CallExtension(ctx, "_sandboxd/session/open", map[string]any{
		"sessionId": "tuned", "cwd": ws, "cpus": "0.5", "memory": "128MiB", "pids": 64,
	})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	if !strings.Contains(string(res), `"memory":"128MiB"`) || !strings.Contains(string(res), `"pids":64`) {
		t.Errorf("open result = %s", res)
	}
	out, _ := sh(t, ctx, a, "tuned", "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max")
	if out != "50000\n134217728\n64\n" {
		t.Errorf("limits inside = %q", out)
	}
	if _, err := a.CallExtension(ctx, "_sandboxd/session/close", map[string]any{"sessionId": "tuned"}); err != nil {
		t.Fatalf("close: %v", err)
	}
	if ids := containersOf(t, srv.cmd.Process.Pid); len(ids) != 0 {
		t.Errorf("containers after session/close: %v", ids)
	}
	_, err = a.CreateTerminal(ctx, acpsdk.CreateTerminalRequest{SessionId: "tuned", Command: "true", Cwd: ptr("/etc")})
	if rpcCode(err) != -32602 {
		t.Errorf("after close, the session id opens anew with its cwd checked: err = %v", err)
	}
}

// TestCloseWhileOpeningLeavesNoContainer closes sessions while the engine
// is still creating their containers: none may outlive its session.
func TestCloseWhileOpeningLeavesNoContainer(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	c := srv.raw()
	for i := range 5 {
		sid := fmt.Sprintf("brief-%d", i)
		closeID := fmt.Sprint(3*i + 2)
		c.send(t, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"_sandboxd/session/open","params":{"sessionId":%q,"cwd":%q}}`, 3*i+1, sid, ws))
		c.send(t, fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"method":"_sandboxd/session/close","params":{"sessionId":%q}}`, closeID, sid))
		closed := true
		for range 2 {
			if r := c.recv(t); string(r.ID) == closeID && r.Error != nil {
				closed = false // handled before the open: nothing to close yet
			}
		}
		if !closed {
			if r := c.call(t, 3*i+3, "_sandboxd/session/close", map[string]any{"sessionId": sid}); r.Error != nil {
				t.Fatalf("close %s after its open: %+v", sid, r.Error)
			}
		}
	}
	eventually(t, "no containers", 30*time.Second, func() bool { return len(containersOf(t, srv.cmd.Process.Pid)) == 0 })
}

// TestOutputByteLimitOutOfRange: the schema takes a value that does not
// decode as a uint64 as absent (x-deserialize-default-on-error), and
// sandboxd holds a larger one to terminal.max_output_byte_limit (4 MiB in
// the test configuration), reporting the cut as truncation.
func TestOutputByteLimitOutOfRange(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	c := srv.raw()
	const printed = 5_000_000
	for i, tc := range []struct {
		name, limit string
		kept        int
	}{
		{"above the maximum", "1099511627776", 4 << 20},
		{"above int64", "18446744073709551615", 4 << 20},
		{"negative", "-1", 1 << 20},
		{"fractional", "1.5", 1 << 20},
		{"a string", `"lots"`, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := 3 * i
			c.send(t, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"terminal/create","params":{"sessionId":"s","command":"head -c %d /dev/zero | tr '\\0' x","outputByteLimit":%s}}`, id+1, printed, tc.limit))
			r := c.recv(t)
			var created struct {
				TerminalID string `json:"terminalId"`
			}
			if r.Error != nil || jsonUnmarshal(r.Result, &created) != nil {
				t.Fatalf("create: %+v %s", r.Error, r.Result)
			}
			if r := c.call(t, id+2, "terminal/wait_for_exit", map[string]any{"sessionId": "s", "terminalId": created.TerminalID}); r.Error != nil {
				t.Fatalf("wait: %+v", r.Error)
			}
			r = c.call(t, id+3, "terminal/output", map[string]any{"sessionId": "s", "terminalId": created.TerminalID})
			var out struct {
				Output    string `json:"output"`
				Truncated bool   `json:"truncated"`
			}
			if r.Error != nil || jsonUnmarshal(r.Result, &out) != nil {
				t.Fatalf("output: %+v", r.Error)
			}
			if len(out.Output) != tc.kept || !out.Truncated {
				t.Errorf("kept %d bytes (truncated %v), want %d (truncated)", len(out.Output), out.Truncated, tc.kept)
			}
		})
	}
}

// TestRunRefusesHostRuntimeDirectories: `cd /run && sandboxd run ...` would
// bind-mount the engine's socket into the sandbox; it is refused, and so
// is the host's root.
func TestRunRefusesHostRuntimeDirectories(t *testing.T) {
	for _, dir := range []string{"/run", "/"} {
		r := runSandboxd(t, dir, nil, nil, "run", "--config", testEnv.config, "--", "true")
		if r.code == 0 || !strings.Contains(r.output(), "workspace: \""+dir+"\"") {
			t.Errorf("run in %s: exit %d, %s; want it refused, naming the workspace", dir, r.code, r.output())
		}
		assertNoContainers(t, r.pid)
	}
}

// TestCreateReadsArgsEnvAndCwdAsTheSchemaSays: the schema marks args, env
// and cwd x-deserialize-default-on-error (and the arrays
// x-deserialize-skip-invalid-items): a value of the wrong type counts as
// absent and an item of the wrong shape is left out, as the reference SDK
// reads them, rather than failing the request.
func TestCreateReadsArgsEnvAndCwdAsTheSchemaSays(t *testing.T) {
	ws := workspace(t)
	srv := startServe(t, ws)
	c := srv.raw()
	tests := []struct {
		name   string
		params map[string]any
		want   string
	}{
		{"items of the wrong shape left out", map[string]any{
			"command": "/bin/sh", "args": []any{"-c", nil, 5, "echo $A $B; pwd"},
			"env": []any{map[string]any{"name": "A", "value": "1"}, map[string]any{"name": "X"}, "junk", map[string]any{"name": "B", "value": "2"}},
			"cwd": 7,
		}, "1 2\n" + ws + "\n"},
		{"args not an array", map[string]any{"command": "echo", "args": "a b"}, "\n"},
		{"env not an array", map[string]any{"command": "/bin/sh", "args": []string{"-c", "echo ${A-unset}"}, "env": map[string]string{"A": "1"}}, "unset\n"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.params["sessionId"] = "lenient"
			rep := c.call(t, 10*i+1, "terminal/create", tc.params)
			if rep.Error != nil {
				t.Fatalf("create: %+v", rep.Error)
			}
			var term struct{ TerminalID string }
			if err := jsonUnmarshal(rep.Result, &term); err != nil {
				t.Fatal(err)
			}
			ids := map[string]any{"sessionId": "lenient", "terminalId": term.TerminalID}
			if rep := c.call(t, 10*i+2, "terminal/wait_for_exit", ids); rep.Error != nil {
				t.Fatalf("wait: %+v", rep.Error)
			}
			rep = c.call(t, 10*i+3, "terminal/output", ids)
			var out struct{ Output string }
			if err := jsonUnmarshal(rep.Result, &out); err != nil || out.Output != tc.want {
				t.Errorf("output %q (%v), want %q", out.Output, err, tc.want)
			}
		})
	}
}

// TestCreateRacingCloseIsUnknownSession: a terminal/create that meets its
// session's close either starts or is told the session is gone (-32002),
// never the engine's words for a container removed under it.
func TestCreateRacingCloseIsUnknownSession(t *testing.T) {
	srv := startServe(t, workspace(t))
	c := srv.raw()
	for i := range 6 {
		sid := fmt.Sprintf("race%d", i)
		if rep := c.call(t, 1, "terminal/create", map[string]any{"sessionId": sid, "command": "true"}); rep.Error != nil {
			t.Fatalf("first create: %+v", rep.Error)
		}
		c.send(t, `{"jsonrpc":"2.0","id":2,"method":"terminal/create","params":{"sessionId":"`+sid+`","command":"sleep 1"}}`+"\n"+
			`{"jsonrpc":"2.0","id":3,"method":"_sandboxd/session/close","params":{"sessionId":"`+sid+`"}}`)
		for range 2 {
			rep := c.recv(t)
			if string(rep.ID) == "2" && rep.Error != nil && rep.Error.Code != -32002 {
				t.Errorf("create racing close: %d %q, want it started or -32002", rep.Error.Code, rep.Error.Message)
			}
		}
	}
}
