package acp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
	"github.com/sandboxd/sandboxd/sandbox"
)

// proxyPeers is a proxy between two in-memory peers. Unless it is started
// with a manager, its Terminals have none: every path such a test takes
// must answer without a container.
type proxyPeers struct {
	toProxyFromEditor, toProxyFromAgent io.WriteCloser
	editor, agent                       *bufio.Reader // what each peer receives
	logs                                *syncBuffer
	ended                               chan error
	p                                   *Proxy
	cancel                              context.CancelFunc // cancels Run
}

// rendersTerminalMeta makes the proxy's editor one that advertised
// _meta.terminal_output, as Zed does.
func (pp *proxyPeers) rendersTerminalMeta() {
	pp.p.mu.Lock()
	pp.p.editorMeta = true
	pp.p.mu.Unlock()
}

// createTerminal has the agent create a terminal running make in session
// s, with more params (e.g. `,"outputByteLimit":4`), and returns its id.
func (pp *proxyPeers) createTerminal(t *testing.T, more string) string {
	t.Helper()
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","id":2,"method":"terminal/create","params":{"sessionId":"s","command":"make"`+more+`}}`+"\n")
	var created struct {
		Result CreateTerminalResponse `json:"result"`
	}
	if line := recv(t, pp.agent); json.Unmarshal([]byte(line), &created) != nil || created.Result.TerminalID == "" {
		t.Fatalf("terminal/create answered %q", line)
	}
	return created.Result.TerminalID
}

// newSession has the editor open a session in a new directory, which the
// agent answers with sid.
func (pp *proxyPeers) newSession(t *testing.T, sid string) {
	t.Helper()
	send(t, pp.toProxyFromEditor, `{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"`+t.TempDir()+`","mcpServers":[]}}`+"\n")
	recv(t, pp.agent)
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","id":1,"result":{"sessionId":"`+sid+`"}}`+"\n")
	recv(t, pp.editor)
}

// syncBuffer is a bytes.Buffer the proxy's goroutines may log to while a
// test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testMaxMessage bounds a message in proxy tests.
const testMaxMessage = 1 << 20

func startProxy(t *testing.T) *proxyPeers {
	t.Helper()
	return startProxyWith(t, nil)
}

// startProxyWith is startProxy with the sessions of m.
func startProxyWith(t *testing.T, m *sandbox.Manager) *proxyPeers {
	t.Helper()
	return startProxyIn(t, m, "/")
}

// startProxyIn is startProxyWith for a wrap started in workspace.
func startProxyIn(t *testing.T, m *sandbox.Manager, workspace string) *proxyPeers {
	t.Helper()
	edInR, edInW := io.Pipe()
	edOutR, edOutW := io.Pipe()
	agInR, agInW := io.Pipe()
	agOutR, agOutW := io.Pipe()
	pp := &proxyPeers{
		toProxyFromEditor: edInW, toProxyFromAgent: agOutW,
		editor: bufio.NewReader(edOutR), agent: bufio.NewReader(agInR),
		logs: &syncBuffer{}, ended: make(chan error, 1),
	}
	log := slog.New(slog.NewTextHandler(pp.logs, nil))
	p := NewProxy(newTerminals(m, "test", workspace, sandbox.SessionSpec{}), pipeConn{edInR, edOutW}, pipeConn{agOutR, agInW}, log)
	// Over-long messages without pushing 64 MiB through a pipe.
	p.editor.max, p.agent.max = testMaxMessage, testMaxMessage
	ctx, cancel := context.WithCancel(context.Background())
	pp.p, pp.cancel = p, cancel
	go func() { pp.ended <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		edInW.Close()
		agOutW.Close()
		edOutR.Close()
		agInR.Close()
		<-pp.ended
	})
	return pp
}

func send(t *testing.T, w io.Writer, line string) {
	t.Helper()
	if _, err := io.WriteString(w, line); err != nil {
		t.Fatalf("send: %v", err)
	}
}

// recv returns the next line r gets, newline included.
func recv(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	ch := make(chan string, 1)
	go func() {
		line, _ := r.ReadString('\n')
		ch <- line
	}()
	select {
	case line := <-ch:
		return line
	case <-time.After(5 * time.Second):
		t.Fatal("recv: nothing within 5s")
	}
	return ""
}

func TestWrapProxyRelaysOtherMessagesByteForByte(t *testing.T) {
	fromEditor := []string{
		`{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"sessionId":"s","prompt":[{"type":"text","text":"<b>&amp;</b> \u00e9 é \u2028 initialize"}],"_meta":{"x":[1,2.50,"y"]}}}` + "\n",
		`{ "method" : "session/cancel" , "jsonrpc" : "2.0", "params" : { "sessionId" : "s" } }` + "\r\n",
		`{"jsonrpc":"2.0","id":"perm-1","result":{"outcome":{"outcome":"selected","optionId":"allow"}}}` + "\n",
		`{"jsonrpc":"2.0","id":8,"method":"_zed/unknown","params":{"anything":null}}` + "\n",
		`{"jsonrpc":"2.0","id":9,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}}` + "\n",
		`{"jsonrpc":"2.0","id":10,"method":"session/close","params":{"sessionId":"nobody"}}` + "\n",
		`not even JSON, the agent's business` + "\n",
	}
	fromAgent := []string{
		`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"a <terminal> & more"}}}}` + "\n",
		`{"jsonrpc":"2.0","id":1,"method":"session/request_permission","params":{"sessionId":"s","toolCall":{"toolCallId":"c"},"options":[]}}` + "\n",
		`{"jsonrpc":"2.0","id":2,"method":"fs/read_text_file","params":{"sessionId":"s","path":"/w/a.txt","line":3}}` + "\r\n",
		`{"jsonrpc":"2.0","method":"_agent/ext","params":{"_meta":{"terminal_output":true}}}` + "\n",
		`{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"perm-1"}}` + "\n",
		`{"jsonrpc":"2.0","id":9,"error":{"code":-32603,"message":"no sessions today"}}` + "\n",
		`{"jsonrpc":"2.0","id":10,"result":{}}` + "\n",
		`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"content","content":{"type":"text","text":"terminal"}}]}}}` + "\n",
	}
	pp := startProxy(t)
	for _, line := range fromEditor {
		send(t, pp.toProxyFromEditor, line)
		if got := recv(t, pp.agent); got != line {
			t.Errorf("editor to agent:\nsent %q\n got %q", line, got)
		}
	}
	for _, line := range fromAgent {
		send(t, pp.toProxyFromAgent, line)
		if got := recv(t, pp.editor); got != line {
			t.Errorf("agent to editor:\nsent %q\n got %q", line, got)
		}
	}
}

func TestWrapProxyDropsAgentLinesThatAreNotMessages(t *testing.T) {
	pp := startProxy(t)
	for _, line := range []string{
		"Loading model weights...\n",
		"[1,2,3]\n",
		`"a string"` + "\n",
		`{"jsonrpc":"2.0","method":"session/update"` + "\n",               // cut short
		`{"jsonrpc":"2.0","method":"terminal/output","params":{}}` + "\n", // a terminal notification
		"\n",
		// Read one way by encoding/json and another by a parser that
		// matches names exactly or keeps the first of a repeat.
		`{"jsonrpc":"2.0","id":1,"method":"terminal/create","METHOD":"x/y","params":{}}` + "\n",
		`{"jsonrpc":"2.0","id":2,"method":"terminal/create","method":"x/y","params":{}}` + "\n",
		`{"jsonrpc":"2.0","id":3,"Method":"terminal/create","params":{}}` + "\n",
		`{"jsonrpc":"2.0","id":4,"method":"x/y","paramſ":{},"params":{"a":"terminal"}}` + "\n",
		`{"jsonrpc":"2.0","id":5,"method\u0000":"terminal/create","method":"x/y","params":{}}` + "\n",
		// Perhaps a response, to a request of sandboxd's: no answer.
		`{"jsonrpc":"2.0","id":6,"METHOD":"terminal/x","result":{}}` + "\n",
	} {
		send(t, pp.toProxyFromAgent, line)
	}
	last := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}}}` + "\n"
	send(t, pp.toProxyFromAgent, last)
	if got := recv(t, pp.editor); got != last {
		t.Errorf("editor got %q, want only the message %q", got, last)
	}
	if n := strings.Count(pp.logs.String(), "dropped"); n != 11 {
		t.Errorf("logged %d drops, want 11:\n%s", n, pp.logs)
	}
	// The requests among them, whose id can be read, get an answer: the
	// agent would wait for ever otherwise.
	var ids []string
	for range 5 {
		var res struct {
			ID    json.RawMessage    `json:"id"`
			Error struct{ Code int } `json:"error"`
		}
		line := recv(t, pp.agent)
		if err := json.Unmarshal([]byte(line), &res); err != nil || res.Error.Code != jsonrpc.InvalidRequest {
			t.Errorf("reply to a dropped request: %q, want InvalidRequest", line)
		}
		ids = append(ids, string(res.ID))
	}
	// The next answer is to the next request: none went to what may be
	// a response.
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","id":99,"method":"terminal/output","params":{"sessionId":"nope","terminalId":"t"}}`+"\n")
	var next struct{ ID json.RawMessage }
	json.Unmarshal([]byte(recv(t, pp.agent)), &next)
	ids = append(ids, string(next.ID))
	if got := strings.Join(ids, " "); got != "1 2 3 4 5 99" {
		t.Errorf("answered ids %s, want 1 to 5, then 99", got)
	}
	// A CR between tokens is whitespace to JSON, a line break to some
	// editors: it reaches the editor as a space.
	send(t, pp.toProxyFromAgent, "{\"a\":\r{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"terminal/create\",\"params\":{}}\r}\n")
	if got, want := recv(t, pp.editor), "{\"a\": {\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"terminal/create\",\"params\":{}} }\n"; got != want {
		t.Errorf("editor got %q, want %q", got, want)
	}
}

// TestWrapProxyRelaysAmbiguousLinesAlike: a line that cannot be a
// terminal request goes on whether or not a session call of the editor's
// waits for its answer, however its members are spelled.
func TestWrapProxyRelaysAmbiguousLinesAlike(t *testing.T) {
	pp := startProxy(t)
	line := `{"jsonrpc":"2.0","method":"x/y","Method":"x/z","params":{},"Params":[]}` + "\n"
	send(t, pp.toProxyFromAgent, line)
	if got := recv(t, pp.editor); got != line {
		t.Errorf("with no session call waiting: editor got %q, want %q", got, line)
	}
	newSession := `{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/","mcpServers":[]}}` + "\n"
	send(t, pp.toProxyFromEditor, newSession)
	recv(t, pp.agent)
	send(t, pp.toProxyFromAgent, line)
	if got := recv(t, pp.editor); got != line {
		t.Errorf("with session/new waiting: editor got %q, want %q", got, line)
	}
}

// TestWrapProxyAnswersForOverlongMessages: a message too long to relay
// must not leave anyone waiting: a request is answered with an error, a
// response reaches the side that asked as an error.
func TestWrapProxyAnswersForOverlongMessages(t *testing.T) {
	pp := startProxy(t)
	huge := strings.Repeat("a", testMaxMessage)
	go io.WriteString(pp.toProxyFromAgent, `{"jsonrpc":"2.0","id":41,"method":"fs/read_text_file","params":{"path":"`+huge+`"}}`+"\n")
	if got := recv(t, pp.agent); !strings.Contains(got, `"id":41`) || !strings.Contains(got, `-32600`) {
		t.Errorf("agent got %q, want an error for its request 41", got)
	}
	go io.WriteString(pp.toProxyFromAgent, `{"jsonrpc":"2.0","id":"e-7","result":{"content":"`+huge+`"}}`+"\n")
	if got := recv(t, pp.editor); !strings.Contains(got, `"id":"e-7"`) || !strings.Contains(got, `-32603`) {
		t.Errorf("editor got %q, want an error for its request e-7", got)
	}
	go io.WriteString(pp.toProxyFromEditor, `{"jsonrpc":"2.0","id":9,"method":"session/prompt","params":{"prompt":"`+huge+`"}}`+"\n")
	if got := recv(t, pp.editor); !strings.Contains(got, `"id":9`) || !strings.Contains(got, `-32600`) {
		t.Errorf("editor got %q, want an error for its request 9", got)
	}
	// The id after all the rest: found all the same.
	go io.WriteString(pp.toProxyFromEditor, `{"jsonrpc":"2.0","method":"session/prompt","params":{"prompt":"`+huge+`"},"id":10}`+"\n")
	if got := recv(t, pp.editor); !strings.Contains(got, `"id":10`) || !strings.Contains(got, `-32600`) {
		t.Errorf("editor got %q, want an error for its request 10", got)
	}
}

// TestWrapProxyRunEndsWithWorkStuck: once cancelled, Run returns in
// bounded time even when work in flight does not end (here, a container
// removal the engine never answers; alike, a refresh written to an
// editor that stopped reading), so that the wrap can stop the agent.
func TestWrapProxyRunEndsWithWorkStuck(t *testing.T) {
	e := newFakeEngine(t, "remove")
	defer e.Release()
	pp := startProxyWith(t, e.m)
	pp.newSession(t, "s")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := pp.p.terms.scope.Session(ctx, "s"); err != nil {
		t.Fatalf("session s did not start: %v", err)
	}
	send(t, pp.toProxyFromEditor, `{"jsonrpc":"2.0","id":2,"method":"session/close","params":{"sessionId":"s"}}`+"\n")
	recv(t, pp.agent)
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","id":2,"result":{}}`+"\n")
	recv(t, pp.editor)
	pp.cancel()
	select {
	case err := <-pp.ended:
		pp.ended <- err // for the cleanup
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run = %v, want %v", err, context.Canceled)
		}
	case <-time.After(stopTimeout + 3*time.Second):
		t.Fatal("Run did not return after it was cancelled")
	}
}

func TestIDKey(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{`"a"`, `"\u0061"`, true},
		{`"a/b"`, `"a\/b"`, true},
		{`1`, `1.0`, true},
		{`1`, `1e0`, true},
		{`-0`, `0`, true},
		{`12345678901234567890`, `1.2345678901234567e19`, true},
		{`1`, `"1"`, false},
		{`1`, `2`, false},
		{`"a"`, `"b"`, false},
		{`1.5`, `1`, false},
		{`null`, `"null"`, false},
	} {
		if got := idKey(json.RawMessage(tc.a)) == idKey(json.RawMessage(tc.b)); got != tc.same {
			t.Errorf("idKey(%s) == idKey(%s) is %v, want %v", tc.a, tc.b, got, tc.same)
		}
	}
}

// TestWrapProxyRefusesEditorBatches: a batch from the editor (ACP has none)
// is not passed on, where its initialize would go unrewritten and the
// agent's array answer be dropped: each request in it is answered
// InvalidRequest, in an array.
func TestWrapProxyRefusesEditorBatches(t *testing.T) {
	pp := startProxy(t)
	// The response in it (to the agent, under the agent's id) gets no
	// answer: that id may be one of the editor's own.
	send(t, pp.toProxyFromEditor, `[{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}},{"jsonrpc":"2.0","method":"n"},{"jsonrpc":"2.0","id":7,"result":{}},{"jsonrpc":"2.0","id":"two","method":"x"}]`+"\n")
	got := recv(t, pp.editor)
	var answers []struct {
		ID    json.RawMessage `json:"id"`
		Error struct{ Code int }
	}
	if err := json.Unmarshal([]byte(got), &answers); err != nil || len(answers) != 2 || string(answers[0].ID) != "1" || string(answers[1].ID) != `"two"` || answers[0].Error.Code != -32600 || answers[1].Error.Code != -32600 {
		t.Errorf("editor got %q, want -32600 for ids 1 and \"two\" in an array", got)
	}
	// Nothing reached the agent: the next line it gets is the next one.
	send(t, pp.toProxyFromEditor, `{"jsonrpc":"2.0","method":"after"}`+"\n")
	if got := recv(t, pp.agent); !strings.Contains(got, `"after"`) {
		t.Errorf("agent got %q, want only the line after the batch", got)
	}
}
