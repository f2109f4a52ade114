package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	acpsdk "github.com/coder/acp-go-sdk"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/sandbox"
)

// env is what every test shares: the built binary and an engine client.
type env struct {
	bin    string
	cli    *client.Client
	config string
}

var testEnv env // set once by TestMain, read-only afterwards

// testConfig shortens the kill grace so kill tests are quick, and lowers the
// maximums tests probe.
const testConfig = `
[session]
memory = "256MiB"
[session.max]
cpus = "2"
memory = "1GiB"
pids = 512
[terminal]
kill_grace = "1s"
max_output_byte_limit = "4MiB"
`

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	ctx := context.Background()
	cli, err := client.New(client.FromEnv)
	if err == nil {
		_, err = cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true})
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			fmt.Fprintf(os.Stderr, "integration: Docker Engine unreachable under CI=true: %v\n", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "integration: skipping, Docker Engine unreachable: %v\n", err)
		return 0
	}
	b := images.Builder{Client: cli, Progress: os.Stderr}
	if err := b.Ensure(ctx, images.DefaultRef); err != nil {
		fmt.Fprintf(os.Stderr, "integration: base image: %v\n", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "sandboxd-it-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "sandboxd")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, "../cmd/sandboxd")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "integration: build sandboxd: %v\n", err)
		return 1
	}
	cfg := filepath.Join(dir, "sandbox.toml")
	if err := os.WriteFile(cfg, []byte(testConfig), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	testEnv = env{bin: bin, cli: cli, config: cfg}
	return m.Run()
}

// workspace makes a workspace directory owned by an ordinary user, as a
// person's project would be.
func workspace(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	own(t, dir)
	return dir
}

// own gives path to uid 1000, whom sessions run as.
func own(t testing.TB, path string) {
	t.Helper()
	if err := os.Chown(path, 1000, 1000); err != nil {
		t.Fatalf("chown %s: %v", path, err)
	}
}

// subdir makes a directory of uid 1000 in dir.
func subdir(t testing.TB, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	own(t, p)
	return p
}

// server is a running `sandboxd serve` on stdio.
type server struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout io.Reader
	stderr *lockedBuffer
	done   chan struct{}
	err    error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// ranSandboxd is how one `sandboxd` command ended.
type ranSandboxd struct {
	code           int
	stdout, stderr string
	pid            int
}

// output is what it wrote to either stream.
func (r ranSandboxd) output() string { return r.stdout + r.stderr }

// runSandboxd runs `sandboxd ARGS...` in dir to its end, with stdin (nil:
// none) and env added to the test's environment.
func runSandboxd(t testing.TB, dir string, stdin io.Reader, env []string, args ...string) ranSandboxd {
	t.Helper()
	cmd := exec.Command(testEnv.bin, args...)
	cmd.Dir, cmd.Stdin = dir, stdin
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr lockedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil && cmd.ProcessState == nil {
		t.Fatal(err)
	}
	return ranSandboxd{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String(), pid: cmd.Process.Pid}
}

// startServe starts `sandboxd serve` with the test config and the given
// workspace as its working directory. Cleanup ends it and checks that it
// left no container behind.
func startServe(t testing.TB, dir string, args ...string) *server {
	t.Helper()
	cmd := exec.Command(testEnv.bin, serveArgs(args...)...)
	cmd.Dir = dir
	return startServeCmd(t, cmd)
}

// serveArgs are the arguments of `sandboxd serve` under test, then args.
func serveArgs(args ...string) []string {
	return append([]string{"serve", "--config", testEnv.config, "--log-level", "debug"}, args...)
}

// startServeCmd starts cmd, a `sandboxd serve` on stdio however it is
// started, and stops it at the end of the test.
func startServeCmd(t testing.TB, cmd *exec.Cmd) *server {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd, stdin: stdin, stdout: stdout, stderr: &lockedBuffer{}, done: make(chan struct{})}
	cmd.Stderr = s.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		s.err = cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() {
		s.stop(t)
		assertNoRace(t, s.stderr)
		if t.Failed() {
			t.Logf("sandboxd stderr:\n%s", s.stderr.String())
		}
		assertNoContainers(t, cmd.Process.Pid)
	})
	return s
}

// stop closes stdin, as an editor does, and waits for the exit.
func (s *server) stop(t testing.TB) {
	t.Helper()
	s.stdin.Close()
	select {
	case <-s.done:
	case <-time.After(60 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
		t.Errorf("sandboxd did not exit after stdin closed")
	}
}

// assertNoRace fails the test when a sandboxd built with the race
// detector reported a race on stderr.
func assertNoRace(t testing.TB, stderr *lockedBuffer) {
	t.Helper()
	if strings.Contains(stderr.String(), "WARNING: DATA RACE") {
		t.Errorf("sandboxd reported a data race")
	}
}

// containersOf lists the containers labelled with a sandboxd process's pid.
func containersOf(t testing.TB, pid int) []string {
	t.Helper()
	host, _ := os.Hostname()
	list, err := testEnv.cli.ContainerList(context.Background(), client.ContainerListOptions{
		All: true,
		Filters: make(client.Filters).
			Add("label", sandbox.LabelPid+"="+strconv.Itoa(pid)).
			Add("label", sandbox.LabelHost+"="+host),
	})
	if err != nil {
		t.Fatalf("list containers: %v", err)
	}
	ids := make([]string, 0, len(list.Items))
	for _, c := range list.Items {
		ids = append(ids, c.ID)
	}
	return ids
}

// sessionContainersOf is containersOf without the spare container that
// wrap keeps ready for the next session.
func sessionContainersOf(t testing.TB, pid int) []string {
	t.Helper()
	var ids []string
	for _, id := range containersOf(t, pid) {
		c, err := testEnv.cli.ContainerInspect(context.Background(), id, client.ContainerInspectOptions{})
		if err == nil && c.Container.Config.Labels[sandbox.LabelSession] != "spare" {
			ids = append(ids, id)
		}
	}
	return ids
}

func assertNoContainers(t testing.TB, pid int) {
	t.Helper()
	if ids := containersOf(t, pid); len(ids) > 0 {
		t.Errorf("sandboxd (pid %d) left %d container(s) behind: %v", pid, len(ids), ids)
	}
}

// idleAgent is the agent side of a test connection. sandboxd never calls
// agent methods, so none is implemented.
type idleAgent struct{ acpsdk.Agent }

// agent connects an ACP agent, built on the independent SDK, to the server.
func (s *server) agent() *acpsdk.AgentSideConnection {
	a := acpsdk.NewAgentSideConnection(idleAgent{}, s.stdin, s.stdout)
	a.SetLogger(quietLog)
	return a
}

// quietLog keeps the SDK's connection logs out of test output.
var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// rpcCode returns the JSON-RPC error code carried by err, or 0.
func rpcCode(err error) int {
	var re *acpsdk.RequestError
	if errors.As(err, &re) {
		return re.Code
	}
	return 0
}

func rpcMessage(err error) string {
	var re *acpsdk.RequestError
	if errors.As(err, &re) {
		return re.Message
	}
	if err == nil {
		return ""
	}
	return err.Error()
}

func ptr[T any](v T) *T { return &v }

// runCmd creates a terminal, waits for it and returns its output and status.
func runCmd(t testing.TB, ctx context.Context, a *acpsdk.AgentSideConnection, req acpsdk.CreateTerminalRequest) (acpsdk.TerminalOutputResponse, acpsdk.WaitForTerminalExitResponse) {
	t.Helper()
	created, err := a.CreateTerminal(ctx, req)
	if err != nil {
		t.Fatalf("create %q %q: %v", req.Command, req.Args, err)
	}
	id := created.TerminalId
	st, err := a.WaitForTerminalExit(ctx, acpsdk.WaitForTerminalExitRequest{SessionId: req.SessionId, TerminalId: id})
	if err != nil {
		t.Fatalf("wait %s: %v", id, err)
	}
	out, err := a.TerminalOutput(ctx, acpsdk.TerminalOutputRequest{SessionId: req.SessionId, TerminalId: id})
	if err != nil {
		t.Fatalf("output %s: %v", id, err)
	}
	if _, err := a.ReleaseTerminal(ctx, acpsdk.ReleaseTerminalRequest{SessionId: req.SessionId, TerminalId: id}); err != nil {
		t.Fatalf("release %s: %v", id, err)
	}
	return out, st
}

// containerOutput runs argv in a container through the Engine API, as the
// commands' user, and returns what it printed; the test fails if the engine
// does.
func containerOutput(t testing.TB, container string, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := bareExec(ctx, testEnv.cli, container, "1000:1000", argv, &out); err != nil {
		t.Fatalf("exec %q in %.12s: %v", argv, container, err)
	}
	return out.String()
}

// sh runs a shell command line in the session and returns output and status.
func sh(t testing.TB, ctx context.Context, a *acpsdk.AgentSideConnection, session, line string) (string, acpsdk.WaitForTerminalExitResponse) {
	t.Helper()
	out, st := runCmd(t, ctx, a, acpsdk.CreateTerminalRequest{SessionId: acpsdk.SessionId(session), Command: "/bin/sh", Args: []string{"-c", line}})
	return out.Output, st
}

func exitCode(st acpsdk.WaitForTerminalExitResponse) string {
	if st.Signal != nil {
		return "signal " + *st.Signal
	}
	if st.ExitCode != nil {
		return "exit " + strconv.Itoa(*st.ExitCode)
	}
	return "unknown"
}

// rawConn speaks newline-delimited JSON-RPC by hand, for what an SDK would
// not send: malformed lines, explicit cancel requests.
type rawConn struct {
	w io.Writer
	r *bufio.Reader
}

func (s *server) raw() *rawConn {
	return &rawConn{w: s.stdin, r: bufio.NewReader(s.stdout)}
}

func (c *rawConn) send(t testing.TB, line string) {
	t.Helper()
	if _, err := io.WriteString(c.w, line+"\n"); err != nil {
		t.Fatalf("send: %v", err)
	}
}

type rawReply struct {
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func (c *rawConn) recv(t testing.TB) rawReply {
	t.Helper()
	type res struct {
		line []byte
		err  error
	}
	ch := make(chan res, 1)
	go func() {
		line, err := c.r.ReadBytes('\n')
		ch <- res{line, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("recv: %v", r.err)
		}
		var rep rawReply
		if err := json.Unmarshal(r.line, &rep); err != nil {
			t.Fatalf("recv %q: %v", r.line, err)
		}
		return rep
	case <-time.After(60 * time.Second):
		t.Fatal("recv: no reply within 60s")
	}
	return rawReply{}
}

// call sends a request and returns its reply.
func (c *rawConn) call(t testing.TB, id int, method string, params any) rawReply {
	t.Helper()
	b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	if err != nil {
		t.Fatal(err)
	}
	c.send(t, string(b))
	return c.recv(t)
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for delay := time.Millisecond; ; delay = min(delay*2, 100*time.Millisecond) {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(delay)
	}
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func writeFile(t testing.TB, name, text string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// procStat reads /proc/PID/stat: the command's name, and the fields after
// it (state first, then the parent's pid, ...). ok is false when the
// process is gone.
func procStat(pid int) (name string, fields []string, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", nil, false
	}
	// The name, in parentheses, may hold anything: it ends at the last ')'.
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return "", nil, false
	}
	return string(b[open+1 : end]), strings.Fields(string(b[end+1:])), true
}

// copyForUser copies sandboxd and the test configuration into dir, for a
// test that runs sandboxd as another user, and returns their paths.
func copyForUser(t testing.TB, dir string) (bin, config string) {
	t.Helper()
	bin, config = filepath.Join(dir, "sandboxd"), filepath.Join(dir, "sandbox.toml")
	for src, dst := range map[string]string{testEnv.bin: bin, testEnv.config: config} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return bin, config
}
