package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	acpsdk "github.com/coder/acp-go-sdk"
	"github.com/moby/moby/client"
)

// buildHelper builds a helper program of this directory (testagent,
// testrelay) into a temporary directory.
func buildHelper(name string) (string, error) {
	dir, err := os.MkdirTemp("", "sandboxd-"+name+"-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, name)
	out, err := exec.Command("go", "build", "-o", bin, "./"+name).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build %s: %v: %s", name, err, out)
	}
	return bin, nil
}

// testAgent builds integration/testagent once per test binary.
var testAgent = sync.OnceValues(func() (string, error) { return buildHelper("testagent") })

// editor is an ACP client, built on the independent SDK, in front of
// `sandboxd wrap -- testagent`. It records every session update.
type editor struct {
	acpsdk.Client // methods the agent never calls
	t             testing.TB

	mu      sync.Mutex
	updates []acpsdk.SessionNotification
	raw     []string // the updates as JSON, for _meta checks
	asked   []string // the permission requests as JSON
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
	b, _ := json.Marshal(p)
	e.mu.Lock()
	e.asked = append(e.asked, string(b))
	e.mu.Unlock()
	if p.ToolCall.ToolCallId == "perm_1" && (p.ToolCall.Title == nil || *p.ToolCall.Title != "Delete the build directory" || len(p.Options) != 2) {
		e.t.Errorf("permission request arrived changed: %+v", p)
	}
	return acpsdk.RequestPermissionResponse{Outcome: acpsdk.RequestPermissionOutcome{Selected: &acpsdk.RequestPermissionOutcomeSelected{OptionId: "allow"}}}, nil
}

func (e *editor) ReadTextFile(_ context.Context, p acpsdk.ReadTextFileRequest) (acpsdk.ReadTextFileResponse, error) {
	return acpsdk.ReadTextFileResponse{Content: "contents of " + p.Path + " ✓ <&>"}, nil
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
	cmd   *exec.Cmd
	stdin io.WriteCloser
	conn  *acpsdk.ClientSideConnection
	ed    *editor
	done  chan struct{}
	logs  *lockedBuffer
	// With record: the bytes the editor sent and received, and the
	// prefix of the agent's transcript files (.in, .out).
	sent, recv *lockedBuffer
	transcript string
}

func startWrap(t testing.TB, dir string, editorCaps acpsdk.ClientCapabilities) *wrapped {
	t.Helper()
	return startWrapWith(t, dir, editorCaps, false)
}

// startWrapWith starts `sandboxd wrap -- testagent` in dir and initializes
// it; record keeps transcripts of both connections. Cleanup closes stdin
// and checks that wrap exits and leaves no container.
func startWrapWith(t testing.TB, dir string, editorCaps acpsdk.ClientCapabilities, record bool, flags ...string) *wrapped {
	t.Helper()
	agentBin, err := testAgent()
	if err != nil {
		t.Fatal(err)
	}
	args := append(append([]string{"wrap", "--config", testEnv.config, "--log-level", "debug"}, flags...), "--", agentBin)
	cmd := exec.Command(testEnv.bin, args...)
	cmd.Dir = dir
	w := &wrapped{cmd: cmd, done: make(chan struct{}), logs: &lockedBuffer{}}
	if record {
		w.sent, w.recv = &lockedBuffer{}, &lockedBuffer{}
		w.transcript = filepath.Join(t.TempDir(), "agent")
		cmd.Env = append(os.Environ(), "TESTAGENT_TRANSCRIPT="+w.transcript)
	}
	if w.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = w.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		cmd.Wait()
		close(w.done)
	}()
	w.ed = &editor{t: t, changed: make(chan struct{})}
	var out io.Writer = w.stdin
	var in io.Reader = stdout
	if record {
		out, in = io.MultiWriter(w.stdin, w.sent), io.TeeReader(stdout, w.recv)
	}
	w.conn = acpsdk.NewClientSideConnection(w.ed, out, in)
	w.conn.SetLogger(quietLog)
	t.Cleanup(func() {
		w.stop(t)
		assertNoRace(t, w.logs)
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

// stop closes stdin, as an editor does when it quits, and waits for wrap
// to exit and the editor's connection to read everything.
func (w *wrapped) stop(t testing.TB) {
	t.Helper()
	w.stdin.Close()
	select {
	case <-w.done:
	case <-time.After(60 * time.Second):
		w.cmd.Process.Kill()
		<-w.done
		t.Error("wrap did not exit after the editor closed stdin")
	}
	<-w.conn.Done()
}

func (w *wrapped) newSession(t testing.TB, ctx context.Context, cwd string, dirs ...string) acpsdk.SessionId {
	t.Helper()
	res, err := w.conn.NewSession(ctx, acpsdk.NewSessionRequest{Cwd: cwd, AdditionalDirectories: dirs, McpServers: []acpsdk.McpServer{}})
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

var containerInMountinfo = regexp.MustCompile(`/containers/([0-9a-f]{64})/hostname `)

// containerOf runs a command in the session and returns the id of the
// container it ran in, which Docker's bind mount of /etc/hostname names.
func (w *wrapped) containerOf(t testing.TB, ctx context.Context, sid acpsdk.SessionId) string {
	t.Helper()
	out := w.prompt(t, ctx, sid, "run grep /etc/hostname /proc/self/mountinfo")
	m := containerInMountinfo.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no container id in the command's mountinfo: %q", out)
	}
	return m[1]
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
	// The command runs in the session's container, in the session's cwd,
	// as the workspace's owner.
	got := w.prompt(t, ctx, sid, "run hostname; pwd; id -u; cat /proc/1/cmdline | tr '\\0' ' '")
	want := fmt.Sprintf("exit=0 output=sandbox\n%s\n1000\n/sbin/docker-init -- sleep infinity ", ws)
	if got != want {
		t.Errorf("run in the container:\n got %q\nwant %q", got, want)
	}
	id := w.containerOf(t, ctx, sid)
	if !slices.Contains(containersOf(t, w.cmd.Process.Pid), id) {
		t.Errorf("the command ran in container %.12s, which is not one of this wrap's", id)
	}
	// The command is in the container's cgroup namespace, that of its
	// init, not the host's.
	info, err := testEnv.cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	own, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/cgroup", info.Container.State.Pid))
	if err != nil {
		t.Fatal(err)
	}
	host, err := os.Readlink("/proc/self/ns/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	inside := strings.TrimSpace(strings.TrimPrefix(w.prompt(t, ctx, sid, "run readlink /proc/self/ns/cgroup"), "exit=0 output="))
	if inside != own || inside == host {
		t.Errorf("the command's cgroup namespace is %s, want its container's %s (the host's is %s)", inside, own, host)
	}
}

// TestWrapFlagsHoldForEverySession: wrap's flags are the operator's word
// on what a session may have; a session id the agent makes up, which the
// editor never opened, gets them too, not the configuration's defaults.
func TestWrapFlagsHoldForEverySession(t *testing.T) {
	ws := workspace(t)
	w := startWrapWith(t, ws, acpsdk.ClientCapabilities{}, false, "--pids", "48")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sid := w.newSession(t, ctx, ws)
	for _, verb := range []string{"run", "elsewhere"} {
		if got := w.prompt(t, ctx, sid, verb+" cat /sys/fs/cgroup/pids/pids.max"); got != "exit=0 output=48\n" {
			t.Errorf("%s: %q, want pids.max 48", verb, got)
		}
	}
}

// TestWrapSharesTheAgentsContainerOverAHP: a person opens an AHP terminal
// in the agent's working directory and types into the container the
// agent's commands run in.
func TestWrapSharesTheAgentsContainerOverAHP(t *testing.T) {
	ws := workspace(t)
	w := startWrapWith(t, ws, acpsdk.ClientCapabilities{}, false, "--ahp-listen", "127.0.0.1:0", "--ahp-token-file", filepath.Join(t.TempDir(), "token"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sid := w.newSession(t, ctx, ws)
	id := w.containerOf(t, ctx, sid)

	before := containersOf(t, w.cmd.Process.Pid) // the session's, and wrap's spare
	a := ahpListening(t, w.logs)
	const term = "ahp-terminal:/shared"
	c := subscribedTerminal(t, a, "person", term, ws)
	c.input(term, "grep /etc/hostname /proc/self/mountinfo; pwd; echo do''ne\r", 1)
	eventually(t, "done", time.Minute, func() bool { return strings.Contains(c.data(term), "done\r\n") })
	d := c.data(term)
	if m := containerInMountinfo.FindStringSubmatch(d); m == nil || m[1] != id {
		t.Errorf("the terminal runs in another container than the agent's %.12s: %q", id, d)
	}
	if !strings.Contains(d, "\r\n"+ws+"\r\n") {
		t.Errorf("the terminal does not start in the session's cwd %s: %q", ws, d)
	}
	after := containersOf(t, w.cmd.Process.Pid)
	slices.Sort(before)
	slices.Sort(after)
	if !slices.Equal(after, before) {
		t.Errorf("containers %v became %v: the terminal got a container of its own", before, after)
	}
}

// TestWrapRelaysEverythingElseUnchanged compares, byte for byte, what the
// editor and the agent each sent with what the other received.
func TestWrapRelaysEverythingElseUnchanged(t *testing.T) {
	ws := workspace(t)
	w := startWrapWith(t, ws, acpsdk.ClientCapabilities{Fs: acpsdk.FileSystemCapabilities{ReadTextFile: true}}, true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sid := w.newSession(t, ctx, ws)
	for _, c := range []struct{ prompt, want string }{
		{"run echo hi", "exit=0 output=hi\n"},
		{"permission", "permission: allow"},
		{"read /some/file.txt", "read: contents of /some/file.txt ✓ <&>"},
		{"garbage", "ok"},
		{`hello <agent> & "friends" é 日本 \u2028`, `echo: hello <agent> & "friends" é 日本 \u2028`},
	} {
		if got := w.prompt(t, ctx, sid, c.prompt); got != c.want {
			t.Errorf("prompt %q: got %q, want %q", c.prompt, got, c.want)
		}
	}
	w.stop(t)

	edSent, edRecv := lines(w.sent.String()), lines(w.recv.String())
	agIn, agOut := readLines(t, w.transcript+".in"), readLines(t, w.transcript+".out")

	// Editor to agent: everything, in order, as sent, but for initialize;
	// besides, the agent got wrap's answers to its terminal requests.
	terminalCalls := map[string]bool{}
	for _, l := range agOut {
		if m := parse(l); strings.HasPrefix(m.Method, "terminal/") {
			terminalCalls[string(m.ID)] = true
		}
	}
	var fromEditor []string
	for _, l := range agIn {
		if m := parse(l); m.Method == "" && terminalCalls[string(m.ID)] {
			continue
		}
		fromEditor = append(fromEditor, l)
	}
	if len(fromEditor) != len(edSent) || len(edSent) < 6 {
		t.Fatalf("the editor sent %d messages, the agent got %d of them", len(edSent), len(fromEditor))
	}
	for i := range edSent {
		if parse(edSent[i]).Method == "initialize" {
			if !strings.Contains(fromEditor[i], `"terminal":true`) || strings.Contains(edSent[i], `"terminal":true`) {
				t.Errorf("initialize: editor sent %s\nagent got %s", edSent[i], fromEditor[i])
			}
			continue
		}
		if fromEditor[i] != edSent[i] {
			t.Errorf("message %d changed on its way to the agent:\nsent %s\n got %s", i, edSent[i], fromEditor[i])
		}
	}

	// Agent to editor: everything but terminal requests and the line that
	// is not JSON, in order, as sent; tool calls that show terminals are
	// rewritten, and wrap adds tool_call_updates of its own.
	var want []string
	for _, l := range agOut {
		if l == "this is not JSON" {
			continue
		}
		if m := parse(l); !strings.HasPrefix(m.Method, "terminal/") {
			want = append(want, l)
		}
	}
	next := 0
	for _, l := range edRecv {
		switch {
		case strings.Contains(l, "this is not JSON"):
			t.Errorf("a line that is not JSON reached the editor: %s", l)
		case strings.Contains(l, `"method":"terminal/`):
			t.Errorf("a terminal request reached the editor: %s", l)
		case next < len(want) && l == want[next]:
			next++
		case next < len(want) && strings.Contains(want[next], `"type":"terminal"`) && sameButContent(t, want[next], l):
			next++ // the agent's tool call, with the terminal shown as text
		case strings.Contains(l, `"sessionUpdate":"tool_call_update"`) && !strings.Contains(l, `"id"`):
			// wrap's own refresh
		default:
			t.Errorf("the editor got a message the agent did not send (expected next: %s):\n%s", want[min(next, len(want)-1)], l)
		}
	}
	if next != len(want) {
		t.Errorf("%d of the agent's messages did not reach the editor, from %s", len(want)-next, want[next])
	}
	if !strings.Contains(w.logs.String(), "not a JSON object") {
		t.Error("wrap did not log the line that is not JSON")
	}
}

// sameButContent reports whether two session/updates differ at most in the
// update's content, and the second shows no terminal.
func sameButContent(t testing.TB, a, b string) bool {
	t.Helper()
	var ma, mb map[string]any
	if json.Unmarshal([]byte(a), &ma) != nil || json.Unmarshal([]byte(b), &mb) != nil {
		return false
	}
	for _, m := range []map[string]any{ma, mb} {
		if p, ok := m["params"].(map[string]any); ok {
			if u, ok := p["update"].(map[string]any); ok {
				delete(u, "content")
			}
		}
	}
	return reflect.DeepEqual(ma, mb) && !strings.Contains(b, `"type":"terminal"`)
}

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

func readLines(t testing.TB, name string) []string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return lines(string(b))
}

type wireMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
}

func parse(line string) wireMessage {
	var m wireMessage
	json.Unmarshal([]byte(line), &m)
	return m
}

// toolCallTexts collects the text the editor was shown for tool calls.
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
		return slices.Contains(toolCallTexts(w.ed.rawUpdates()), "first\n")
	})
	if err := os.WriteFile(filepath.Join(ws, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := <-done; got != "exit=0 output=first\nsecond\n" {
		t.Errorf("agent result = %q", got)
	}
	// The agent released the terminal before its last update of the tool
	// call: the editor still gets the output, with the exit code.
	texts := toolCallTexts(w.ed.rawUpdates())
	if len(texts) == 0 || texts[len(texts)-1] != "first\nsecond\n\n[exit code 0]" {
		t.Errorf("editor's last view of the tool call: %q", texts)
	}
	for _, text := range texts {
		if strings.HasPrefix(text, "TERMINAL:") {
			t.Errorf("a bare terminal id reached an editor that never created it: %s", text)
		}
	}
}

// TestWrapShowsTheTerminalOfAPermissionRequest: the tool call a
// permission request asks about shows its terminal's output, not a bare
// id the editor never created.
func TestWrapShowsTheTerminalOfAPermissionRequest(t *testing.T) {
	ws := workspace(t)
	w := startWrap(t, ws, acpsdk.ClientCapabilities{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sid := w.newSession(t, ctx, ws)
	if got := w.prompt(t, ctx, sid, "ask echo about to delete; exit 3"); got != "permission: allow" {
		t.Errorf("agent result = %q", got)
	}
	w.ed.mu.Lock()
	asked := w.ed.asked
	w.ed.mu.Unlock()
	if len(asked) != 1 {
		t.Fatalf("permission requests: %q", asked)
	}
	var p acpsdk.RequestPermissionRequest
	if err := json.Unmarshal([]byte(asked[0]), &p); err != nil {
		t.Fatal(err)
	}
	c := p.ToolCall.Content
	if len(c) != 1 || c[0].Content == nil || c[0].Content.Content.Text == nil || c[0].Content.Content.Text.Text != "about to delete\n\n[exit code 3]" {
		t.Errorf("the permission request shows %s", asked[0])
	}
	if !strings.HasPrefix(string(p.ToolCall.ToolCallId), "ask_term_") || len(p.Options) != 1 || p.Options[0].OptionId != "allow" {
		t.Errorf("the permission request changed: %s", asked[0])
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
	var info, output, exit int
	eventually(t, "terminal_info, then terminal_output, then terminal_exit", 30*time.Second, func() bool {
		info, output, exit = -1, -1, -1
		for i, u := range w.ed.rawUpdates() {
			switch {
			case strings.Contains(u, `"sessionUpdate":"tool_call"`) && strings.Contains(u, `"terminal_info":{"cwd":"`+ws+`","terminal_id":"term_`):
				info = i
			case strings.Contains(u, `"terminal_output":{"data":"héllo\n","terminal_id":"term_`):
				output = i
			case strings.Contains(u, `"terminal_exit":{"exit_code":4,"signal":null,"terminal_id":"term_`):
				exit = i
			}
		}
		return info >= 0 && output >= 0 && exit >= 0
	})
	if !(info < output && output <= exit) {
		t.Errorf("updates out of order: terminal_info %d, terminal_output %d, terminal_exit %d", info, output, exit)
	}
	// The editor knows the terminal now: the tool call keeps it, also in
	// the agent's last update, sent after release.
	if texts := toolCallTexts(w.ed.rawUpdates()); len(texts) != 2 || !strings.HasPrefix(texts[0], "TERMINAL:term_") || texts[1] != texts[0] {
		t.Errorf("tool call content = %q, want the terminal twice", texts)
	}
}

func TestWrapSessionsGetTheirOwnContainers(t *testing.T) {
	ws := workspace(t)
	w := startWrap(t, ws, acpsdk.ClientCapabilities{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	other := workspace(t)
	s1 := w.newSession(t, ctx, ws)
	s2 := w.newSession(t, ctx, other)
	c1, c2 := w.containerOf(t, ctx, s1), w.containerOf(t, ctx, s2)
	if c1 == c2 {
		t.Fatalf("both sessions ran in container %.12s", c1)
	}
	if got := w.prompt(t, ctx, s2, "run pwd"); got != "exit=0 output="+other+"\n" {
		t.Errorf("second session's cwd: %q", got)
	}
	// A loaded session gets its container back.
	if _, err := w.conn.LoadSession(ctx, acpsdk.LoadSessionRequest{SessionId: s2, Cwd: other, McpServers: []acpsdk.McpServer{}}); err != nil {
		t.Fatalf("session/load: %v", err)
	}
	if c := w.containerOf(t, ctx, s2); c != c2 {
		t.Errorf("loaded session runs in %.12s, not in its container %.12s", c, c2)
	}
	exists := func(id string) bool { return slices.Contains(containersOf(t, w.cmd.Process.Pid), id) }
	// Loaded with a directory more, which no running container can gain:
	// it gets a new container that mounts it, and the old one goes.
	extra := workspace(t)
	writeFile(t, filepath.Join(extra, "marker"), "in the extra directory")
	if _, err := w.conn.LoadSession(ctx, acpsdk.LoadSessionRequest{SessionId: s2, Cwd: other, AdditionalDirectories: []string{extra}, McpServers: []acpsdk.McpServer{}}); err != nil {
		t.Fatalf("session/load with another directory: %v", err)
	}
	if got := w.prompt(t, ctx, s2, "run cat "+filepath.Join(extra, "marker")); got != "exit=0 output=in the extra directory" {
		t.Errorf("reloaded session reading its new directory: %q", got)
	}
	eventually(t, "the container without the directory removed", 60*time.Second, func() bool { return !exists(c2) })
	c2 = w.containerOf(t, ctx, s2)
	for _, c := range []struct {
		sid acpsdk.SessionId
		id  string
	}{{s1, c1}, {s2, c2}} {
		if _, err := w.conn.CloseSession(ctx, acpsdk.CloseSessionRequest{SessionId: c.sid}); err != nil {
			t.Fatalf("session/close: %v", err)
		}
		eventually(t, "closed session's container removed", 60*time.Second, func() bool { return !exists(c.id) })
	}
	if ids := sessionContainersOf(t, w.cmd.Process.Pid); len(ids) > 0 {
		t.Errorf("containers left after both sessions closed: %v", ids)
	}
}

// TestWrapSendsNothingForAClosedSession: a terminal still running in a
// tool call when the editor closes its session is killed with the
// container; the editor gets no update for the closed session after that.
func TestWrapSendsNothingForAClosedSession(t *testing.T) {
	for _, meta := range []bool{false, true} {
		t.Run(fmt.Sprintf("terminal_output=%v", meta), func(t *testing.T) {
			ws := workspace(t)
			caps := acpsdk.ClientCapabilities{}
			if meta {
				caps.Meta = map[string]any{"terminal_output": true}
			}
			w := startWrap(t, ws, caps)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			closing, other := w.newSession(t, ctx, ws), w.newSession(t, ctx, ws)
			if got := w.prompt(t, ctx, closing, "start echo begun; sleep 300"); !strings.Contains(got, "started ") {
				t.Fatalf("start: %q", got)
			}
			eventually(t, "the output shown", time.Minute, func() bool {
				// The output, not the title: begun and a newline, as JSON.
				return slices.ContainsFunc(w.ed.rawUpdates(), func(u string) bool { return strings.Contains(u, `begun\n`) })
			})
			if _, err := w.conn.CloseSession(ctx, acpsdk.CloseSessionRequest{SessionId: closing}); err != nil {
				t.Fatalf("session/close: %v", err)
			}
			closedAt := len(w.ed.rawUpdates())
			eventually(t, "the closed session's container removed", time.Minute, func() bool {
				return len(sessionContainersOf(t, w.cmd.Process.Pid)) == 1
			})
			// A whole command in the other session: the proxy has long
			// seen the closed session's terminal end.
			if got := w.prompt(t, ctx, other, "run echo after"); got != "exit=0 output=after\n" {
				t.Errorf("other session: %q", got)
			}
			for _, u := range w.ed.rawUpdates()[closedAt:] {
				if strings.Contains(u, string(closing)) {
					t.Errorf("update for the closed session: %s", u)
				}
			}
		})
	}
}

// TestNestedWorkspaceCannotBeSwappedForALink: a session whose cwd lies in
// another session's workspace opens, and while that other session's
// commands keep swapping the directory for a link to the host's /run, a
// new session there either fails to open or mounts the real directory,
// never the link's target.
func TestNestedWorkspaceCannotBeSwappedForALink(t *testing.T) {
	ws := workspace(t)
	sub := subdir(t, ws, "sub")
	writeFile(t, filepath.Join(sub, "marker"), "")
	own(t, filepath.Join(sub, "marker"))
	w := startWrap(t, ws, acpsdk.ClientCapabilities{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	outer := w.newSession(t, ctx, ws)
	if got := w.prompt(t, ctx, w.newSession(t, ctx, sub), "run ls"); got != "exit=0 output=marker\n" {
		t.Fatalf("nested session: %q", got)
	}
	if got := w.prompt(t, ctx, outer, "start cd "+ws+" && while :; do usleep 40000; mv sub sub.real && ln -s /run sub && usleep 40000 && rm sub && mv sub.real sub; done"); !strings.Contains(got, "started ") {
		t.Fatalf("start the swapping: %q", got)
	}
	for range 12 {
		got := w.prompt(t, ctx, w.newSession(t, ctx, sub), "run ls")
		if strings.Contains(got, "docker") || strings.HasPrefix(got, "exit=0") && !strings.Contains(got, "marker") {
			t.Errorf("a session in the swapped directory saw: %q", got)
		}
	}
	// A link on the way to a directory elsewhere, turned to /run and back:
	// what is mounted is where the link led when it was checked.
	other := workspace(t)
	writeFile(t, filepath.Join(other, "elsewhere"), "")
	if err := os.Symlink(other, filepath.Join(ws, "lnk")); err != nil {
		t.Fatal(err)
	}
	// A link in another session's writable workspace is that session's
	// to plant: it may lead anywhere the user can reach.
	if got := w.prompt(t, ctx, w.newSession(t, ctx, filepath.Join(ws, "lnk")), "run ls"); !strings.Contains(got, "passes the link") {
		t.Errorf("a session behind a link in another session's workspace: %q, want it refused", got)
	}
	if got := w.prompt(t, ctx, outer, "start cd "+ws+" && while :; do usleep 40000; ln -sfn /run lnk; usleep 40000; ln -sfn "+other+" lnk; done"); !strings.Contains(got, "started ") {
		t.Fatalf("start the turning: %q", got)
	}
	for range 12 {
		got := w.prompt(t, ctx, w.newSession(t, ctx, filepath.Join(ws, "lnk")), "run ls")
		if strings.Contains(got, "docker") || strings.HasPrefix(got, "exit=0") && !strings.Contains(got, "elsewhere") {
			t.Errorf("a session behind the turned link saw: %q", got)
		}
	}
}

// TestNestedDirectoriesMountOnce: a session directory inside another of
// the same session is shown through the outer mount, never mounted again:
// the engine would find the inner target through the outer one, a host
// directory other sandboxes may write, where a link could send the mount
// anywhere in the container. One that resolves elsewhere is refused.
func TestNestedDirectoriesMountOnce(t *testing.T) {
	ws := workspace(t)
	sub := subdir(t, ws, "sub")
	writeFile(t, filepath.Join(ws, "top"), "top\n")
	w := startWrap(t, ws, acpsdk.ClientCapabilities{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mounts := "awk -v ws=" + ws + " '$5 == ws || index($5, ws \"/\") == 1 {print $5}' /proc/self/mountinfo"
	for _, dirs := range [][]string{{sub, ws}, {ws, sub}} {
		sid := w.newSession(t, ctx, dirs[0], dirs[1:]...)
		got := w.prompt(t, ctx, sid, "run cd "+sub+" && cat ../top && echo made >> made && "+mounts)
		if want := "exit=0 output=top\n" + ws + "\n"; got != want {
			t.Errorf("session in %s with %s: %q, want %q: the files and one mount, of the outer directory", dirs[0], dirs[1], got, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(sub, "made")); err != nil || string(b) != "made\nmade\n" {
		t.Errorf("files made in the inner directory, on the host: %q, %v", b, err)
	}
	// Inside, but a filesystem of its own, which the outer mount, not
	// recursive, does not show: mounted after all (mounting takes root,
	// which CI has).
	if os.Geteuid() == 0 {
		data := subdir(t, ws, "data")
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "uid=1000,gid=1000", "data", data).CombinedOutput(); err != nil {
			t.Fatalf("mount tmpfs at %s: %v: %s", data, err, out)
		}
		t.Cleanup(func() { exec.Command("umount", "-l", data).Run() })
		writeFile(t, filepath.Join(data, "f"), "own filesystem")
		sid := w.newSession(t, ctx, ws, data)
		if got := w.prompt(t, ctx, sid, "run cat "+filepath.Join(data, "f")); got != "exit=0 output=own filesystem" {
			t.Errorf("a session directory on a filesystem of its own inside the workspace: %q", got)
		}
		// One below it: mounted in the cover that hides the rest of the
		// filesystem.
		raw := subdir(t, data, "raw")
		writeFile(t, filepath.Join(raw, "g"), "raw data")
		sid = w.newSession(t, ctx, ws, raw)
		if got := w.prompt(t, ctx, sid, "run cat "+filepath.Join(raw, "g")+"; ls "+data); got != "exit=0 output=raw data"+"raw\n" {
			t.Errorf("a session directory below a filesystem of its own inside the workspace: %q", got)
		}
	}
	// A directory inside that is a link elsewhere cannot be shown through
	// the outer mount. (Apart from the workspace the other sessions may
	// write, where such a link is refused anyway.)
	apart := workspace(t)
	if err := os.Mkdir(filepath.Join(apart, "other"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(apart, "other"), filepath.Join(apart, "link")); err != nil {
		t.Fatal(err)
	}
	sid := w.newSession(t, ctx, apart, filepath.Join(apart, "link"))
	if got := w.prompt(t, ctx, sid, "run ls"); !strings.Contains(got, "lies inside") {
		t.Errorf("a session with a linked directory inside its workspace: %q, want it refused", got)
	}
}

// TestSpareOfAnotherRepositoryIsNotTaken: the spare container started
// before the workspace had a repository has no read-only mount over its
// .git; a session opened after `git init` on the host gets one that has.
func TestSpareOfAnotherRepositoryIsNotTaken(t *testing.T) {
	ws := workspace(t)
	w := startWrap(t, ws, acpsdk.ClientCapabilities{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	eventually(t, "the spare container ready", time.Minute, func() bool { return strings.Contains(w.logs.String(), "spare container ready") })
	config := filepath.Join(subdir(t, ws, ".git"), "config")
	writeFile(t, config, "[core]\n")
	own(t, config)
	sid := w.newSession(t, ctx, ws)
	if got := w.prompt(t, ctx, sid, "run { echo x >> .git/config && echo changed; } 2>/dev/null; cat .git/config"); got != "exit=0 output=[core]\n" {
		t.Errorf("a session opened after the repository was made: %q, want its .git read-only", got)
	}
	if !strings.Contains(w.logs.String(), "spare container dropped") {
		t.Error("the spare was not dropped")
	}
}

// TestWorktreeAndItsRepositoryStayReadOnly: a session in a worktree with
// its main checkout as another directory: the main .git, the worktree's
// git directory in it and all below stay read-only, and nothing on the way
// can be moved aside.
func TestWorktreeAndItsRepositoryStayReadOnly(t *testing.T) {
	main, wt := workspace(t), workspace(t)
	gitDir := subdir(t, main, ".git")
	for _, f := range []struct{ path, text string }{
		{filepath.Join(gitDir, "HEAD"), "ref: refs/heads/main\n"},
		{filepath.Join(gitDir, "config"), "[core]\n"},
	} {
		writeFile(t, f.path, f.text)
		own(t, f.path)
	}
	wtDir := subdir(t, subdir(t, gitDir, "worktrees"), "wt")
	writeFile(t, filepath.Join(wtDir, "HEAD"), "ref: refs/heads/wt\n")
	writeFile(t, filepath.Join(wtDir, "commondir"), "../..\n")
	own(t, filepath.Join(wtDir, "commondir"))
	writeFile(t, filepath.Join(wt, ".git"), "gitdir: "+wtDir+"\n")
	own(t, filepath.Join(wt, ".git"))
	w := startWrap(t, wt, acpsdk.ClientCapabilities{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, dirs := range [][]string{{wt, main}, {main, wt}} {
		sid := w.newSession(t, ctx, dirs[0], dirs[1:]...)
		try := "{ echo x >> " + gitDir + "/config && echo changed config; " +
			"echo .. > " + wtDir + "/commondir && echo changed commondir; " +
			"mv " + gitDir + "/worktrees " + gitDir + "/w2 && echo moved worktrees; " +
			"mv " + gitDir + " " + main + "/g2 && echo moved git; " +
			"echo gitdir: /tmp > " + wt + "/.git && echo changed pointer; } 2>/dev/null; echo tried"
		if got := w.prompt(t, ctx, sid, "run "+try); got != "exit=0 output=tried\n" {
			t.Errorf("session in %s with %s: %q, want every change refused", dirs[0], dirs[1], got)
		}
	}
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

func TestWrapAgentExitPassesItsLastWordsOn(t *testing.T) {
	ws := workspace(t)
	w := startWrap(t, ws, acpsdk.ClientCapabilities{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sid := w.newSession(t, ctx, ws)
	w.conn.Prompt(ctx, acpsdk.PromptRequest{SessionId: sid, Prompt: []acpsdk.ContentBlock{acpsdk.TextBlock("quit 5")}})
	select {
	case <-w.done:
	case <-time.After(60 * time.Second):
		t.Fatal("wrap did not exit after the agent did")
	}
	<-w.conn.Done()
	if msgs := w.ed.messages(); len(msgs) == 0 || msgs[len(msgs)-1] != "bye" {
		t.Errorf("the agent's last message did not reach the editor: %q", msgs)
	}
	if code := w.cmd.ProcessState.ExitCode(); code != 5 {
		t.Errorf("wrap exit code = %d, want the agent's 5", code)
	}
}

func TestWrapEditorEOFLeavesNothing(t *testing.T) {
	ws := workspace(t)
	w := startWrap(t, ws, acpsdk.ClientCapabilities{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sid := w.newSession(t, ctx, ws)
	go w.conn.Prompt(ctx, acpsdk.PromptRequest{SessionId: sid, Prompt: []acpsdk.ContentBlock{acpsdk.TextBlock("run sleep 300")}})
	eventually(t, "command running", 60*time.Second, func() bool {
		return strings.Contains(w.logs.String(), "sleep 300") || len(toolCallTexts(w.ed.rawUpdates())) > 0
	})
	w.stop(t)
	if code := w.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("wrap exit code after editor EOF = %d, want 0", code)
	}
	assertNoContainers(t, w.cmd.Process.Pid)
}

func TestWrapRefusesToStart(t *testing.T) {
	notExec := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want []string // in the message
	}{
		{"missing agent", []string{"--", "/no/such/agent"}, []string{"start agent", "/no/such/agent", "no such file"}},
		{"agent not in PATH", []string{"--", "no-such-agent-anywhere"}, []string{"start agent", "no-such-agent-anywhere", "not found"}},
		{"agent not executable", []string{"--", notExec}, []string{"start agent", notExec, "permission denied"}},
		{"no agent", nil, []string{"no agent given"}},
		{"memory above the maximum", []string{"--memory", "64GiB", "--", "true"}, []string{"memory", "maximum"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"wrap", "--config", testEnv.config}, tc.args...)
			cmd := exec.Command(testEnv.bin, args...)
			cmd.Stdin = bytes.NewReader(nil)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("wrap %v succeeded: %s", tc.args, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("message %q does not say %q", out, w)
				}
			}
		})
	}
}

func TestWrapKillsAnAgentThatIgnoresSIGTERM(t *testing.T) {
	// A launcher that ignores SIGTERM and the end of its input, with a
	// child of its own, as wrapper scripts have.
	var child struct{ Pid int }
	w := startScriptWrap(t, "500ms", `trap "" TERM; sleep 300 & echo "{\"pid\":$!}"; while :; do sleep 1; done`, &child)
	t0 := time.Now()
	w.stdin.Close()
	if code := w.wait(t, 30*time.Second); code != 0 {
		t.Errorf("wrap exit code = %d, want 0\n%s", code, w.logs.String())
	}
	if d := time.Since(t0); d < 500*time.Millisecond {
		t.Errorf("wrap exited after %v, before the grace period", d)
	}
	eventually(t, "the agent's child killed with it", 10*time.Second, func() bool { return processGone(child.Pid) })
	assertNoContainers(t, w.cmd.Process.Pid)
}

// TestWrapEndsWhatTheAgentLeft: an agent that exits leaves nothing of its
// process group running on the host (a launcher's tool servers, say).
func TestWrapEndsWhatTheAgentLeft(t *testing.T) {
	var child struct{ Pid int }
	w := startScriptWrap(t, "2s", `sleep 302 </dev/null >/dev/null 2>&1 & echo "{\"pid\":$!}"; exit 3`, &child)
	if code := w.wait(t, 60*time.Second); code != 3 {
		t.Errorf("wrap exit code = %d, want the agent's 3\n%s", code, w.logs.String())
	}
	eventually(t, "the agent's child ended", 10*time.Second, func() bool { return processGone(child.Pid) })
}

// TestWrapSeesTheEditorGoWhileTheAgentReadsNothing: an editor that closes
// its end while the wrap waits to hand a message to an agent that reads
// nothing ends the wrap all the same.
func TestWrapSeesTheEditorGoWhileTheAgentReadsNothing(t *testing.T) {
	var ready struct{ Ready int }
	w := startScriptWrap(t, "1s", `echo '{"ready":1}'; exec sleep 303`, &ready)
	// More than a pipe holds, so that the wrap is left waiting to
	// write it to the agent.
	prompt := `{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s","prompt":[{"type":"text","text":"` + strings.Repeat("x", 300<<10) + `"}]}}` + "\n"
	if _, err := io.WriteString(w.stdin, prompt); err != nil {
		t.Fatal(err)
	}
	w.stdin.Close()
	if code := w.wait(t, 30*time.Second); code != 0 {
		t.Errorf("wrap exit code after the editor went = %d, want 0\n%s", code, w.logs.String())
	}
	assertNoContainers(t, w.cmd.Process.Pid)
}

// scriptWrap is `sandboxd wrap` in a new workspace around an agent that is
// a shell script, with the editor's end as plain pipes.
type scriptWrap struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser // the editor's end
	logs  *lockedBuffer
	done  chan struct{} // closed once wrap exited
}

// startScriptWrap starts wrap around `sh -c script` and decodes the
// agent's first line, a JSON object, into first.
func startScriptWrap(t *testing.T, grace, script string, first any) *scriptWrap {
	t.Helper()
	cmd := exec.Command(testEnv.bin, "wrap", "--config", testEnv.config, "--agent-grace", grace, "--", "/bin/sh", "-c", script)
	cmd.Dir = workspace(t)
	w := &scriptWrap{cmd: cmd, logs: &lockedBuffer{}, done: make(chan struct{})}
	var err error
	if w.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = w.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		cmd.Wait()
		close(w.done)
	}()
	t.Cleanup(func() {
		w.stdin.Close()
		cmd.Process.Kill()
		<-w.done
	})
	if err := json.NewDecoder(stdout).Decode(first); err != nil {
		t.Fatalf("the agent's first line: %v\n%s", err, w.logs.String())
	}
	return w
}

// wait waits for wrap to exit, within d, and returns its exit code.
func (w *scriptWrap) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-w.done:
	case <-time.After(d):
		t.Fatalf("wrap did not exit within %v:\n%s", d, w.logs.String())
	}
	return w.cmd.ProcessState.ExitCode()
}

// processGone reports whether process pid has ended (a zombie not yet
// reaped counts).
func processGone(pid int) bool {
	_, f, ok := procStat(pid)
	return !ok || f[0] == "Z"
}

// TestWrapStoppedBySignal: a wrap told to stop by a signal stops the
// agent, removes its containers and says so in its exit code.
func TestWrapStoppedBySignal(t *testing.T) {
	ws := workspace(t)
	w := startWrap(t, ws, acpsdk.ClientCapabilities{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w.containerOf(t, ctx, w.newSession(t, ctx, ws))
	w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.done:
	case <-time.After(60 * time.Second):
		t.Fatal("wrap did not exit on SIGTERM")
	}
	if code := w.cmd.ProcessState.ExitCode(); code != 128+int(syscall.SIGTERM) {
		t.Errorf("wrap exit code after SIGTERM = %d, want %d", code, 128+int(syscall.SIGTERM))
	}
	assertNoContainers(t, w.cmd.Process.Pid)
}

// TestWrapLeavesNoAgentWhenStoppedAtOnce: an agent that ignores SIGTERM,
// and a process of its group that does too, are killed when sandboxd is
// told a second time to stop and stops at once; and the agent itself when
// sandboxd is killed outright (the rest of its group is then beyond
// reach). Neither may run on, unsandboxed, on the host.
func TestWrapLeavesNoAgentWhenStoppedAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(p *os.Process)
		gone func(agent, child int) []int // the processes that must end
	}{
		{"signalled again", func(p *os.Process) { p.Signal(syscall.SIGTERM) }, func(agent, child int) []int { return []int{agent, child} }},
		{"killed", func(p *os.Process) { p.Kill() }, func(agent, child int) []int { return []int{agent} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := workspace(t)
			pids := filepath.Join(t.TempDir(), "pids")
			cmd := exec.Command(testEnv.bin, "wrap", "--config", testEnv.config, "--agent-grace", "60s", "--",
				"sh", "-c", `trap "" TERM; sleep 1000 & echo $$ $! > "$0"; wait`, pids)
			cmd.Dir = ws
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			defer stdin.Close()
			// A file, not a pipe: what the agent leaves behind of its
			// group holds its stderr open.
			logs, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
			if err != nil {
				t.Fatal(err)
			}
			defer logs.Close()
			cmd.Stderr = logs
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() {
				cmd.Wait()
				close(done)
			}()
			var agent, child int
			eventually(t, "the agent's pids", time.Minute, func() bool {
				b, err := os.ReadFile(pids)
				_, serr := fmt.Sscan(string(b), &agent, &child)
				return err == nil && serr == nil
			})
			defer syscall.Kill(child, syscall.SIGKILL)
			defer syscall.Kill(agent, syscall.SIGKILL)
			tc.stop(cmd.Process)
			// Told again until it stops at once (it waits 2 s for the
			// orderly stop first).
			for deadline := time.Now().Add(30 * time.Second); ; {
				select {
				case <-done:
				case <-time.After(200 * time.Millisecond):
					if time.Now().After(deadline) {
						b, _ := os.ReadFile(logs.Name())
						t.Fatalf("wrap did not stop:\n%s", b)
					}
					tc.stop(cmd.Process)
					continue
				}
				break
			}
			for _, pid := range tc.gone(agent, child) {
				eventually(t, fmt.Sprintf("process %d gone", pid), 10*time.Second, func() bool { return processGone(pid) })
			}
		})
	}
}
