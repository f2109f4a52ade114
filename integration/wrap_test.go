package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	acpsdk "github.com/coder/acp-go-sdk"
)

// testAgent builds integration/testagent once per test binary.
var testAgent = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "sandboxd-testagent-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "testagent")
	out, err := exec.Command("go", "build", "-o", bin, "./testagent").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build testagent: %v: %s", err, out)
	}
	return bin, nil
})

// editor is an ACP client, built on the independent SDK, in front of
// `sandboxd wrap -- testagent`. It records every session update.
type editor struct {
	acpsdk.Client // methods the agent never calls
	t             testing.TB

	mu      sync.Mutex
	updates []acpsdk.SessionNotification
	raw     []string // the updates as JSON, for _meta checks
	changed chan struct{}
}

func (e *editor) SessionUpdate(_ context.Context, n acpsdk.SessionNotification) error {
	b, _ := json.Marshal(n)
	e.mu.Lock()
	e.updates = append(e.updates, n)
	e.raw = append(e.raw, string(b))
	close(e.changed)
	e.changed = make(chan struct{})
	e.mu.Unlock()
	return nil
}

func (e *editor) RequestPermission(_ context.Context, p acpsdk.RequestPermissionRequest) (acpsdk.RequestPermissionResponse, error) {
	if p.ToolCall.Title == nil || *p.ToolCall.Title != "Delete the build directory" || len(p.Options) != 2 {
		e.t.Errorf("permission request arrived changed: %+v", p)
	}
	return acpsdk.RequestPermissionResponse{Outcome: acpsdk.RequestPermissionOutcome{Selected: &acpsdk.RequestPermissionOutcomeSelected{OptionId: "allow"}}}, nil
}

func (e *editor) ReadTextFile(_ context.Context, p acpsdk.ReadTextFileRequest) (acpsdk.ReadTextFileResponse, error) {
	return acpsdk.ReadTextFileResponse{Content: "contents of " + p.Path + " ✓"}, nil
}

func (e *editor) CreateTerminal(context.Context, acpsdk.CreateTerminalRequest) (acpsdk.CreateTerminalResponse, error) {
	e.t.Error("a terminal request reached the editor")
	return acpsdk.CreateTerminalResponse{}, acpsdk.NewInternalError(nil)
}

// messages returns the agent's message texts so far.
func (e *editor) messages() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, u := range e.updates {
		if c := u.Update.AgentMessageChunk; c != nil && c.Content.Text != nil {
			out = append(out, c.Content.Text.Text)
		}
	}
	return out
}

func (e *editor) rawUpdates() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.raw...)
}

// wrapped is a running `sandboxd wrap` with an editor in front.
type wrapped struct {
	cmd  *exec.Cmd
	conn *acpsdk.ClientSideConnection
	ed   *editor
	done chan struct{}
	err  error
	logs *lockedBuffer
}

func startWrap(t testing.TB, dir string, editorCaps acpsdk.ClientCapabilities) *wrapped {
	t.Helper()
	agentBin, err := testAgent()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(testEnv.bin, "wrap", "--config", testEnv.config, "--log-level", "debug", "--", agentBin)
	cmd.Dir = dir
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	w := &wrapped{cmd: cmd, done: make(chan struct{}), logs: &lockedBuffer{}}
	cmd.Stderr = w.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		w.err = cmd.Wait()
		close(w.done)
	}()
	w.ed = &editor{t: t, changed: make(chan struct{})}
	w.conn = acpsdk.NewClientSideConnection(w.ed, stdin, stdout)
	w.conn.SetLogger(quietLog)
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-w.done:
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			<-w.done
			t.Error("wrap did not exit after the editor closed stdin")
		}
		if t.Failed() {
			t.Logf("wrap stderr:\n%s", w.logs.String())
		}
		assertNoContainers(t, cmd.Process.Pid)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := w.conn.Initialize(ctx, acpsdk.InitializeRequest{ProtocolVersion: acpsdk.ProtocolVersionNumber, ClientCapabilities: editorCaps}); err != nil {
		t.Fatalf("initialize: %v", err)
	}
	return w
}

func (w *wrapped) newSession(t testing.TB, ctx context.Context, cwd string) acpsdk.SessionId {
	t.Helper()
	res, err := w.conn.NewSession(ctx, acpsdk.NewSessionRequest{Cwd: cwd, McpServers: []acpsdk.McpServer{}})
	if err != nil {
		t.Fatalf("session/new: %v", err)
	}
	return res.SessionId
}

// prompt sends text and returns the agent's last message of the turn.
func (w *wrapped) prompt(t testing.TB, ctx context.Context, sid acpsdk.SessionId, text string) string {
	t.Helper()
	before := len(w.ed.messages())
	if _, err := w.conn.Prompt(ctx, acpsdk.PromptRequest{SessionId: sid, Prompt: []acpsdk.ContentBlock{acpsdk.TextBlock(text)}}); err != nil {
		t.Fatalf("prompt %q: %v", text, err)
	}
	msgs := w.ed.messages()
	if len(msgs) <= before {
		t.Fatalf("prompt %q: no agent message", text)
	}
	return msgs[len(msgs)-1]
}

func TestWrapGivesTheAgentTerminals(t *testing.T) {
	ws := workspace(t)
	w := startWrap(t, ws, acpsdk.ClientCapabilities{Terminal: false, Fs: acpsdk.FileSystemCapabilities{ReadTextFile: true}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sid := w.newSession(t, ctx, ws)

	caps := w.prompt(t, ctx, sid, "caps")
	if !strings.Contains(caps, `"terminal":true`) || !strings.Contains(caps, `"readTextFile":true`) {
		t.Errorf("agent saw capabilities %s; want terminal true and the editor's fs kept", caps)
	}
	// The command runs in the session's container, in the session's cwd.
	got := w.prompt(t, ctx, sid, "run hostname; pwd; id -u; cat /proc/1/cmdline | tr '\\0' ' '")
	want := fmt.Sprintf("exit=0 output=sandbox\n%s\n1000\n/sbin/docker-init -- sleep infinity ", ws)
	if got != want {
		t.Errorf("run in the container:\n got %q\nwant %q", got, want)
	}
	// Non-terminal traffic passes through unchanged.
	if got := w.prompt(t, ctx, sid, "permission"); got != "permission: allow" {
		t.Errorf("permission round trip = %q", got)
	}
	if got := w.prompt(t, ctx, sid, "read /some/file.txt"); got != "read: contents of /some/file.txt ✓" {
		t.Errorf("file read round trip = %q", got)
	}
	if got := w.prompt(t, ctx, sid, "hello, agent"); got != "echo: hello, agent" {
		t.Errorf("prompt text = %q", got)
	}
}

// toolCallTexts collects the text the editor was shown for a tool call.
func toolCallTexts(raw []string) []string {
	var texts []string
	for _, r := range raw {
		var n struct {
			Update struct {
				Content []struct {
					Type    string `json:"type"`
					Content struct {
						Text string `json:"text"`
					} `json:"content"`
					TerminalID string `json:"terminalId"`
				} `json:"content"`
			} `json:"update"`
		}
		json.Unmarshal([]byte(r), &n)
		for _, c := range n.Update.Content {
			if c.Type == "content" {
				texts = append(texts, c.Content.Text)
			}
			if c.Type == "terminal" {
				texts = append(texts, "TERMINAL:"+c.TerminalID)
			}
		}
	}
	return texts
}

func TestWrapShowsLiveOutputAsText(t *testing.T) {
	ws := workspace(t)
	w := startWrap(t, ws, acpsdk.ClientCapabilities{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sid := w.newSession(t, ctx, ws)
	// The command prints, then waits for a file that the test creates only
	// once the editor has shown the first line: the output is live.
	done := make(chan string, 1)
	go func() {
		done <- w.prompt(t, ctx, sid, "run echo first; while [ ! -e go ]; do sleep 0.05; done; echo second")
	}()
	eventually(t, "editor shows the first line while the command runs", 30*time.Second, func() bool {
		for _, text := range toolCallTexts(w.ed.rawUpdates()) {
			if text == "first\n" {
				return true
			}
		}
		return false
	})
	if err := os.WriteFile(filepath.Join(ws, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := <-done; got != "exit=0 output=first\nsecond\n" {
		t.Errorf("agent result = %q", got)
	}
	eventually(t, "editor shows the final output with the exit code", 30*time.Second, func() bool {
		texts := toolCallTexts(w.ed.rawUpdates())
		return len(texts) > 0 && texts[len(texts)-1] == "first\nsecond\n\n[exit code 0]"
	})
	for _, text := range toolCallTexts(w.ed.rawUpdates()) {
		if strings.HasPrefix(text, "TERMINAL:") {
			t.Errorf("a bare terminal id reached an editor that never created it: %s", text)
		}
	}
}

func TestWrapUsesTerminalMetaWhenTheEditorDoes(t *testing.T) {
	ws := workspace(t)
	w := startWrap(t, ws, acpsdk.ClientCapabilities{Terminal: true, Meta: map[string]any{"terminal_output": true}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sid := w.newSession(t, ctx, ws)
	if got := w.prompt(t, ctx, sid, "run echo héllo; exit 4"); got != "exit=4 output=héllo\n" {
		t.Errorf("agent result = %q", got)
	}
	eventually(t, "terminal_info, terminal_output and terminal_exit", 30*time.Second, func() bool {
		all := strings.Join(w.ed.rawUpdates(), "\n")
		return strings.Contains(all, `"terminal_info":{`) &&
			strings.Contains(all, `"terminal_output":{"data":"héllo\n"`) &&
			strings.Contains(all, `"terminal_exit":{"exit_code":4,"signal":null`)
	})
}

func TestWrapSessionsGetTheirOwnContainers(t *testing.T) {
	ws := workspace(t)
	w := startWrap(t, ws, acpsdk.ClientCapabilities{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	other := workspace(t)
	s1 := w.newSession(t, ctx, ws)
	s2 := w.newSession(t, ctx, other)
	// Containers are prepared as soon as the sessions exist.
	eventually(t, "two containers", 60*time.Second, func() bool {
		return len(sessionContainersOf(t, w.cmd.Process.Pid)) == 2
	})
	h1 := w.prompt(t, ctx, s1, "run cat /etc/hostname; pwd; cat /proc/self/cgroup | head -1")
	h2 := w.prompt(t, ctx, s2, "run cat /etc/hostname; pwd; cat /proc/self/cgroup | head -1")
	if !strings.Contains(h1, ws+"\n") || !strings.Contains(h2, other+"\n") || h1[strings.LastIndex(h1, ":"):] == h2[strings.LastIndex(h2, ":"):] {
		t.Errorf("sessions share a container or a cwd:\n%s\n%s", h1, h2)
	}
	if _, err := w.conn.CloseSession(ctx, acpsdk.CloseSessionRequest{SessionId: s1}); err != nil {
		t.Fatalf("session/close: %v", err)
	}
	eventually(t, "closed session's container removed", 60*time.Second, func() bool {
		return len(sessionContainersOf(t, w.cmd.Process.Pid)) == 1
	})
}

func TestWrapAgentCrashLeavesNothing(t *testing.T) {
	ws := workspace(t)
	w := startWrap(t, ws, acpsdk.ClientCapabilities{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sid := w.newSession(t, ctx, ws)
	w.conn.Prompt(ctx, acpsdk.PromptRequest{SessionId: sid, Prompt: []acpsdk.ContentBlock{acpsdk.TextBlock("crash sleep 300")}})
	select {
	case <-w.done:
	case <-time.After(60 * time.Second):
		t.Fatal("wrap did not exit after the agent crashed")
	}
	if code := w.cmd.ProcessState.ExitCode(); code != 3 {
		t.Errorf("wrap exit code = %d, want the agent's 3", code)
	}
	assertNoContainers(t, w.cmd.Process.Pid)
}

func TestWrapEditorEOFLeavesNothing(t *testing.T) {
	ws := workspace(t)
	w := startWrap(t, ws, acpsdk.ClientCapabilities{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sid := w.newSession(t, ctx, ws)
	go w.conn.Prompt(ctx, acpsdk.PromptRequest{SessionId: sid, Prompt: []acpsdk.ContentBlock{acpsdk.TextBlock("run sleep 300")}})
	eventually(t, "command running", 60*time.Second, func() bool {
		return len(sessionContainersOf(t, w.cmd.Process.Pid)) == 1
	})
	// Cleanup closes stdin and checks that no container is left.
}

func TestWrapAgentThatCannotStart(t *testing.T) {
	out, err := exec.Command(testEnv.bin, "wrap", "--config", testEnv.config, "--", "/no/such/agent").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "start agent") || !strings.Contains(string(out), "/no/such/agent") {
		t.Errorf("err %v, output %q: want a failure naming the agent", err, out)
	}
}
