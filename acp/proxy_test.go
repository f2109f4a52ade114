package acp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd"
	"github.com/sandboxd/sandboxd/limits"
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
	p := NewProxy(NewTerminals(m, "test", workspace, sandbox.SessionSpec{}), pipeConn{edInR, edOutW}, pipeConn{agOutR, agInW}, log)
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
		if err := json.Unmarshal([]byte(line), &res); err != nil || res.Error.Code != CodeInvalidRequest {
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

func TestWrapProxyAnswersTerminalRequestsItself(t *testing.T) {
	tests := []struct {
		name     string
		request  string
		wantCode int
		wantText string
	}{
		{"unknown session", `{"jsonrpc":"2.0","id":5,"method":"terminal/output","params":{"sessionId":"nope","terminalId":"t"}}`, CodeResourceMissing, `unknown session \"nope\"`},
		{"string id", `{"jsonrpc":"2.0","id":"w-1","method":"terminal/wait_for_exit","params":{"sessionId":"nope","terminalId":"t"}}`, CodeResourceMissing, "unknown session"},
		{"missing field", `{"jsonrpc":"2.0","id":6,"method":"terminal/create","params":{"command":"ls"}}`, CodeInvalidParams, "sessionId: required"},
		{"params not an object", `{"jsonrpc":"2.0","id":7,"method":"terminal/kill","params":[1]}`, CodeInvalidParams, "must be an object"},
		// However the method is spelled, the editor never sees it.
		{"escaped method", `{"jsonrpc":"2.0","id":8,"method":"\u0074erminal/output","params":{"sessionId":"nope","terminalId":"t"}}`, CodeResourceMissing, "unknown session"},
		{"escaped slash", `{"jsonrpc":"2.0","id":9,"method":"terminal\/output","params":{"sessionId":"nope","terminalId":"t"}}`, CodeResourceMissing, "unknown session"},
		{"unknown terminal method", `{"jsonrpc":"2.0","id":10,"method":"terminal/run","params":{}}`, CodeMethodNotFound, "terminal/run"},
		{"null id", `{"jsonrpc":"2.0","id":null,"method":"terminal/output","params":{"sessionId":"nope","terminalId":"t"}}`, CodeInvalidRequest, "id of null"},
	}
	pp := startProxy(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			send(t, pp.toProxyFromAgent, tc.request+"\n")
			var req, res struct {
				ID    json.RawMessage `json:"id"`
				Error struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			json.Unmarshal([]byte(tc.request), &req)
			line := recv(t, pp.agent)
			if err := json.Unmarshal([]byte(line), &res); err != nil {
				t.Fatalf("reply %q: %v", line, err)
			}
			if string(res.ID) != string(req.ID) || res.Error.Code != tc.wantCode || !strings.Contains(line, tc.wantText) {
				t.Errorf("reply %s: want id %s, code %d, message with %q", line, req.ID, tc.wantCode, tc.wantText)
			}
		})
	}
	// None of it reached the editor: the next thing it gets is this.
	marker := `{"jsonrpc":"2.0","method":"_marker","params":{}}` + "\n"
	send(t, pp.toProxyFromAgent, marker)
	if got := recv(t, pp.editor); got != marker {
		t.Errorf("editor got %q before the marker", got)
	}
}

// TestWrapRewriteInitialize: the agent is told of terminals, and every
// other byte of the editor's initialize reaches it as written.
func TestWrapRewriteInitialize(t *testing.T) {
	tests := []struct {
		name, in, want string
		wantMeta       bool
	}{
		{"no capabilities", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}`,
			`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"clientCapabilities":{"terminal":true},"protocolVersion":1}}`, false},
		{"null capabilities", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":null}}`,
			`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"terminal":true}}}`, false},
		{"capabilities an array", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":[]}}`,
			`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"terminal":true}}}`, false},
		{"capabilities a number", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":5}}`,
			`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"terminal":true}}}`, false},
		{"terminal false", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"terminal":false,"fs":{"readTextFile":true}}}}`,
			`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"terminal":true,"fs":{"readTextFile":true}}}}`, false},
		// A parser that matches names regardless of case reads true too.
		{"spaced, another case", `{ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": { "clientCapabilities": { "fs": { "readTextFile": true }, "Terminal": false }, "protocolVersion": 1 } }`,
			`{ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": { "clientCapabilities": { "fs": { "readTextFile": true }, "Terminal": true }, "protocolVersion": 1 } }`, false},
		{"zed meta", `{"jsonrpc":"2.0","id":"a","method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"_meta":{"terminal_output":true,"x":[1]}},"_meta":{"k":"<v&>"}}}`,
			`{"jsonrpc":"2.0","id":"a","method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"terminal":true,"_meta":{"terminal_output":true,"x":[1]}},"_meta":{"k":"<v&>"}}}`, true},
		{"meta without terminal_output", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"_meta":{"terminal-auth":true}}}}`,
			`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"terminal":true,"_meta":{"terminal-auth":true}}}}`, false},
		// Go's encoding/json reads the last of "params" and "Params".
		{"params in another case too", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1},"Params":{"clientCapabilities":{"terminal":false}}}`,
			`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"clientCapabilities":{"terminal":true},"protocolVersion":1},"Params":{"clientCapabilities":{"terminal":true},"protocolVersion":1}}`, false},
		{"params not an object", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":null}`, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := NewProxy(nil, pipeConn{}, pipeConn{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if out := p.rewriteInitialize([]byte(tc.in)); string(out) != tc.want {
				t.Errorf("got  %s\nwant %s", out, tc.want)
			}
			if p.editorMeta != tc.wantMeta {
				t.Errorf("editorMeta = %v", p.editorMeta)
			}
		})
	}
}

func TestWrapRewriteUpdate(t *testing.T) {
	tests := []struct {
		name, line string
		want       string // "" for left alone
		editorMeta bool
	}{
		{"message chunk", `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"a terminal"}}}}`, "", false},
		{"text content", `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"content","content":{"type":"text","text":"terminal"}}]}}}`, "", false},
		{"status only", `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","status":"completed"}}}`, "", false},
		// A terminal the editor cannot know of becomes a note.
		{"unknown terminal", `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","title":"<ls>","content":[{"type":"terminal","terminalId":"term_x"},{"type":"diff","path":"/a","newText":"b"}]},"_meta":{"keep":1}}}`,
			`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","title":"<ls>","content":[{"type":"content","content":{"type":"text","text":"(the output of terminal term_x is not available)"}},{"type":"diff","path":"/a","newText":"b"}]},"_meta":{"keep":1}}}`, false},
		{"unknown terminal, for Zed", `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"terminal","terminalId":"term_x"}]}}}`,
			`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"content","content":{"type":"text","text":"(the output of terminal term_x is not available)"}}]}}}`, true},
		// An editor that matches names regardless of case reads no bare
		// terminal id either.
		{"content in two spellings", `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"terminal","terminalId":"term_x"}],"Content":[{"type":"terminal","terminalId":"term_x"}]}}}`,
			`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"content","content":{"type":"text","text":"(the output of terminal term_x is not available)"}}],"Content":[{"type":"content","content":{"type":"text","text":"(the output of terminal term_x is not available)"}}]}}}`, false},
		// The tool call a permission request asks about is shown as the
		// editor would show it in an update; the request keeps its id.
		{"permission for an unknown terminal", `{"jsonrpc":"2.0","id":9,"method":"session/request_permission","params":{"sessionId":"s","toolCall":{"toolCallId":"c","content":[{"type":"terminal","terminalId":"term_x"}]},"options":[{"optionId":"a","name":"Allow","kind":"allow_once"}]}}`,
			`{"jsonrpc":"2.0","id":9,"method":"session/request_permission","params":{"sessionId":"s","toolCall":{"toolCallId":"c","content":[{"type":"content","content":{"type":"text","text":"(the output of terminal term_x is not available)"}}]},"options":[{"optionId":"a","name":"Allow","kind":"allow_once"}]}}`, false},
		{"permission without a terminal", `{"jsonrpc":"2.0","id":9,"method":"session/request_permission","params":{"sessionId":"s","toolCall":{"toolCallId":"c","title":"run terminal"},"options":[]}}`, "", false},
		// One the agent runs itself and names in its own _meta goes on
		// as it is, for the editor to render from that _meta.
		{"the agent's own terminal, for Zed", `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"toolu_1","kind":"execute","content":[{"type":"terminal","terminalId":"toolu_1"}],"_meta":{"terminal_info":{"terminal_id":"toolu_1","cwd":"/w"}}}}}`, "", true},
		{"the agent's own terminal beside other _meta", `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"toolu_2","content":[{"type":"terminal","terminalId":"toolu_2"}],"_meta":{"isBackground":false,"n":[1],"terminal_info":{"terminal_id":"toolu_2"}}}}}`, "", true},
		// An item without an id names no terminal: editors skip it.
		{"a terminal item without an id", `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"terminal"}]}}}`, "", false},
		{"the agent's own terminal exits", `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"toolu_1","status":"completed","content":[{"type":"terminal","terminalId":"toolu_1"}],"_meta":{"terminal_exit":{"terminal_id":"toolu_1","exit_code":0,"signal":null}}}}}`, "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := NewProxy(NewTerminals(nil, "test", "/", sandbox.SessionSpec{}), pipeConn{}, pipeConn{Writer: io.Discard}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			p.editorMeta = tc.editorMeta
			var m message
			json.Unmarshal([]byte(tc.line), &m)
			p.updates.Lock() // as fromAgent holds it
			got := p.rewriteTerminals(m, []byte(tc.line))
			p.updates.Unlock()
			if string(got) != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

// TestWrapAgentTerminalNamedBeforeItIsShown: an agent that names its own
// terminal in a tool call without content and shows it in a later update
// has that update forwarded as it wrote it, not turned into a note.
func TestWrapAgentTerminalNamedBeforeItIsShown(t *testing.T) {
	p := NewProxy(NewTerminals(nil, "test", "/", sandbox.SessionSpec{}), pipeConn{}, pipeConn{Writer: io.Discard}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, line := range []string{
		`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c1","title":"ls","_meta":{"terminal_info":{"terminal_id":"own1"}}}}}`,
		`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c1","content":[{"type":"terminal","terminalId":"own1"}]}}}`,
	} {
		var m message
		json.Unmarshal([]byte(line), &m)
		p.updates.Lock()
		got := p.rewriteUpdate([]byte(line), m.Params)
		p.updates.Unlock()
		if got != nil {
			t.Errorf("%s\nrewritten to %s", line, got)
		}
	}
}

func TestWrapReadRaw(t *testing.T) {
	long := `{"x":"` + strings.Repeat("é", 70<<10) + `"}`
	tests := []struct {
		name, in string
		want     []string
	}{
		{"lines", "one\n\n  \r\ntwo\r\n" + long + "\n", []string{"one\n", "two\r\n", long + "\n"}},
		{"last line without newline", "one\n{\"id\":1}", []string{"one\n", "{\"id\":1}\n"}},
		// The peer ended in the middle of a message: half of it must
		// not reach the other side.
		{"cut last line", "one\n{\"id\":1,\"method\":\"x", []string{"one\n"}},
		{"cut long last line", long[:len(long)-2], nil},
	}
	for _, tc := range tests {
		s := NewLineStream(pipeConn{Reader: strings.NewReader(tc.in)}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		for _, want := range tc.want {
			got, err := s.readRaw()
			if err != nil || string(got) != want {
				t.Fatalf("%s: readRaw = %.40q, %v; want %.40q", tc.name, got, err, want)
			}
		}
		if got, err := s.readRaw(); err != io.EOF {
			t.Errorf("%s: at the end: %.40q, %v, want EOF", tc.name, got, err)
		}
	}
}

// TestMemberScan: what a line says of itself is found at the object's own
// level, wherever its members are and however the line is cut into
// pieces; a line cut off keeps what was whole.
func TestMemberScan(t *testing.T) {
	long := strings.Repeat("x", 2*maxScannedID)
	for _, tc := range []struct {
		line              string
		id                string
		request, response bool
	}{
		{`{"jsonrpc":"2.0","id":7,"method":"x","params":{"a":"aaa`, "7", true, false},
		{`{"jsonrpc":"2.0","method":"x","id":"s","params":[1,2`, `"s"`, true, false},
		{`{"id":3,"result":{"output":"aaaa`, "3", false, true},
		{`{"jsonrpc":"2.0","result":{"a":"b"},"id":4}`, "4", false, true},
		{`{"jsonrpc":"2.0","params":{"a":"aaaa`, "", false, false},
		{`not json`, "", false, false},
		{`[{"id":1,"method":"x"}]`, "", false, false},
		// The id after what is too long to keep.
		{`{"jsonrpc":"2.0","method":"x","params":{"env":["` + long + `"],"id":99},"id":12}` + "\n", "12", true, false},
		{` {"method" : "x" , "id" : "a,b}" }`, `"a,b}"`, true, false},
		{`{"\u0069d":5,"\"method":1}`, "5", false, false},
		{`{"id":{"a":[1,2]},"method":"x"}`, `{"a":[1,2]}`, true, false},
		{`{"id":1,"id":2,"error":{}}`, "2", false, true},
		{`{"id":"` + long + `","method":"x"}`, "", true, false},
		{`{"id":"a\"b","method":"x"}`, `"a\"b"`, true, false},
		{`{"id":5`, "", false, false},
	} {
		for _, cut := range []int{1, 3, 4096} {
			m := &memberScan{}
			for rest := []byte(tc.line); len(rest) > 0; {
				n := min(cut, len(rest))
				m.Write(rest[:n])
				rest = rest[n:]
			}
			if string(m.id) != tc.id || m.request != tc.request || m.response != tc.response {
				t.Errorf("%.60q in pieces of %d: %s %v %v, want %s %v %v", tc.line, cut, m.id, m.request, m.response, tc.id, tc.request, tc.response)
			}
		}
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

// fakeEngine answers the Docker Engine API in memory, for tests that need
// sessions but no containers: containers are created and started at once,
// a terminal's exec streams what the test sends to output and exits 0
// once it is closed, the exec that verifies mounts fails as in an image
// without stat (so they go unverified), and the calls named in hold ("create", "remove") wait until
// release is called or the test ends.
type fakeEngine struct {
	m       *sandbox.Manager
	output  chan []byte
	release func()

	hold     []string
	released chan struct{}
	conns    chan net.Conn
	done     chan struct{}
	execs    atomic.Int64
	// failRemoves is how many container removals still fail; removes
	// counts those asked for. failCreates is how many creates still make
	// their container but answer with an error (a timeout); made names
	// the last container a create made, removedNames those removed.
	failRemoves, removes, failCreates atomic.Int32
	mu                                sync.Mutex
	made                              string
	removedNames                      []string
}

func newFakeEngine(t *testing.T, hold ...string) *fakeEngine {
	t.Helper()
	e := &fakeEngine{output: make(chan []byte), hold: hold, released: make(chan struct{}),
		conns: make(chan net.Conn), done: make(chan struct{})}
	var once sync.Once
	e.release = func() { once.Do(func() { close(e.released) }) }
	srv := &http.Server{Handler: e}
	go srv.Serve(e)
	cli, err := client.New(client.WithHTTPClient(&http.Client{Transport: &http.Transport{DialContext: e.dial}}),
		client.WithAPIVersion(client.MaxAPIVersion))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := sandbox.LoadConfig(sandboxd.DefaultConfig, "", 2)
	if err != nil {
		t.Fatal(err)
	}
	e.m, err = sandbox.NewManager(context.Background(), cli, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.release()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		e.m.Close(ctx)
		close(e.done)
		srv.Close()
	})
	return e
}

// Accept, Close, Addr and dial make the engine a listener of in-memory
// connections.
func (e *fakeEngine) Accept() (net.Conn, error) {
	select {
	case c := <-e.conns:
		return c, nil
	case <-e.done:
		return nil, net.ErrClosed
	}
}

func (e *fakeEngine) Close() error { return nil }

func (e *fakeEngine) Addr() net.Addr { return &net.UnixAddr{Name: "fake-engine", Net: "unix"} }

func (e *fakeEngine) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	c, s := net.Pipe()
	select {
	case e.conns <- s:
		return c, nil
	case <-e.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (e *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	answer := func(code int, body string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		io.WriteString(w, body)
	}
	path := r.URL.Path
	op := ""
	switch {
	case strings.HasSuffix(path, "/info"):
		answer(200, `{"NCPU":2}`)
	case strings.HasSuffix(path, "/containers/json"):
		answer(200, `[]`)
	case strings.HasSuffix(path, "/containers/create"):
		op = "create"
	case strings.Contains(path, "/containers/") && strings.HasSuffix(path, "/start"):
		w.WriteHeader(204)
	case strings.Contains(path, "/containers/") && r.Method == http.MethodDelete:
		op = "remove"
	case strings.HasSuffix(path, "/exec"):
		var req struct{ Cmd []string }
		json.NewDecoder(r.Body).Decode(&req)
		if len(req.Cmd) > 0 && req.Cmd[0] == "stat" {
			// As the engine runs an image without stat: 126, and why.
			answer(201, fmt.Sprintf(`{"Id":"nostat%d"}`, e.execs.Add(1)))
			return
		}
		if len(req.Cmd) > 0 && req.Cmd[0] == "cat" {
			// sandboxd's own read of the mount table: no terminal's.
			answer(201, fmt.Sprintf(`{"Id":"cat%d"}`, e.execs.Add(1)))
			return
		}
		answer(201, fmt.Sprintf(`{"Id":"exec%d"}`, e.execs.Add(1)))
	case strings.Contains(path, "/exec/nostat") && strings.HasSuffix(path, "/start"):
		io.Copy(io.Discard, r.Body)
		e.streamOnce(w, []byte(`OCI runtime exec failed: exec failed: unable to start container process: exec: "stat": executable file not found in $PATH: unknown`+"\r\n"))
	case strings.Contains(path, "/exec/nostat") && strings.HasSuffix(path, "/json"):
		answer(200, `{"Running":false,"ExitCode":126}`)
	case strings.Contains(path, "/exec/cat") && strings.HasSuffix(path, "/start"):
		io.Copy(io.Discard, r.Body)
		e.streamOnce(w, []byte("1 0 0:1 / / rw - overlay overlay rw\n"))
	case strings.Contains(path, "/exec/") && strings.HasSuffix(path, "/start"):
		// Read before the hijack: a pipe has no buffer to leave it in.
		io.Copy(io.Discard, r.Body)
		e.stream(w)
	case strings.Contains(path, "/exec/") && strings.HasSuffix(path, "/json"):
		answer(200, `{"Running":false,"ExitCode":0}`)
	default:
		answer(500, `{"message":"not in the fake engine"}`)
	}
	if op == "" {
		return
	}
	if slices.Contains(e.hold, op) {
		select {
		case <-e.released:
			answer(500, `{"message":"released"}`)
		case <-r.Context().Done():
		}
		return
	}
	if op == "remove" {
		e.removes.Add(1)
		e.mu.Lock()
		e.removedNames = append(e.removedNames, path[strings.LastIndex(path, "/")+1:])
		e.mu.Unlock()
		if n := e.failRemoves.Load(); n > 0 && e.failRemoves.CompareAndSwap(n, n-1) {
			answer(500, `{"message":"could not kill container: tried to kill container, but did not receive an exit event"}`)
			return
		}
	}
	if op == "create" {
		e.mu.Lock()
		e.made = r.URL.Query().Get("name")
		e.mu.Unlock()
		if n := e.failCreates.Load(); n > 0 && e.failCreates.CompareAndSwap(n, n-1) {
			answer(500, `{"message":"context deadline exceeded"}`)
			return
		}
		answer(201, `{"Id":"0123456789abcdef0123456789abcdef","Warnings":[]}`)
	} else {
		w.WriteHeader(204)
	}
}

// hijack answers an exec start with the raw stream, for frames to follow.
func hijack(w http.ResponseWriter) net.Conn {
	conn, buf, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return nil
	}
	buf.WriteString("HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.multiplexed-stream\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n")
	buf.Flush()
	return conn
}

// frame writes b as one stdout frame of the multiplexed stream.
func frame(conn net.Conn, b []byte) error {
	head := []byte{1, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(head[4:], uint32(len(b)))
	_, err := conn.Write(append(head, b...))
	return err
}

// streamOnce is an exec that writes b and ends.
func (e *fakeEngine) streamOnce(w http.ResponseWriter, b []byte) {
	if conn := hijack(w); conn != nil {
		frame(conn, b)
		conn.Close()
	}
}

// stream is a terminal's exec: what the test sends to output, as stdout.
func (e *fakeEngine) stream(w http.ResponseWriter) {
	conn := hijack(w)
	if conn == nil {
		return
	}
	defer conn.Close()
	for {
		select {
		case b, ok := <-e.output:
			if !ok {
				return
			}
			if err := frame(conn, b); err != nil {
				return
			}
		case <-e.done:
			return
		}
	}
}

// TestWrapProxyTracksSessions: the proxy prepares a container for a
// session the agent opens, and forgets one it closes, however the editor
// spells the request, its id and its params.
func TestWrapProxyTracksSessions(t *testing.T) {
	e := newFakeEngine(t)
	ws := t.TempDir()
	tests := []struct {
		name          string
		request       string // WS stands for a workspace
		answer        string
		wantOpen      string // the session prepared
		wantExtraDirs []string
		wantClosed    string // the session forgotten
	}{
		{name: "plain", request: `{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"WS","mcpServers":[]}}`,
			answer: `{"jsonrpc":"2.0","id":1,"result":{"sessionId":"n1"}}`, wantOpen: "n1"},
		// PHP's json_encode and lua-cjson escape every slash.
		{name: "escaped slash in new", request: `{"jsonrpc":"2.0","id":2,"method":"session\/new","params":{"cwd":"WS","mcpServers":[]}}`,
			answer: `{"jsonrpc":"2.0","id":2,"result":{"sessionId":"n2"}}`, wantOpen: "n2"},
		{name: "escaped slash in load", request: `{"jsonrpc":"2.0","id":3,"method":"session\/load","params":{"sessionId":"n3","cwd":"WS","mcpServers":[]}}`,
			answer: `{"jsonrpc":"2.0","id":3,"result":{}}`, wantOpen: "n3"},
		{name: "escaped slash in close", request: `{"jsonrpc":"2.0","id":4,"method":"session\/close","params":{"sessionId":"n1"}}`,
			answer: `{"jsonrpc":"2.0","id":4,"result":{}}`, wantClosed: "n1"},
		{name: "escaped slash in delete", request: `{"jsonrpc":"2.0","id":5,"method":"session\/delete","params":{"sessionId":"n2"}}`,
			answer: `{"jsonrpc":"2.0","id":5,"result":{}}`, wantClosed: "n2"},
		// The agent answers the id it decoded, in its own spelling.
		{name: "escaped string id", request: `{"jsonrpc":"2.0","id":"\u0061","method":"session/new","params":{"cwd":"WS","mcpServers":[]}}`,
			answer: `{"jsonrpc":"2.0","id":"a","result":{"sessionId":"n4"}}`, wantOpen: "n4"},
		{name: "number id written otherwise", request: `{"jsonrpc":"2.0","id":6.0,"method":"session/close","params":{"sessionId":"n4"}}`,
			answer: `{"jsonrpc":"2.0","id":6,"result":{}}`, wantClosed: "n4"},
		// x-deserialize-skip-invalid-items: what is not a string is left
		// out, the rest mounted.
		{name: "invalid additional directories", request: `{"jsonrpc":"2.0","id":7,"method":"session/new","params":{"cwd":"WS","additionalDirectories":[7,"WS/x",null,{"a":1}],"mcpServers":[]}}`,
			answer: `{"jsonrpc":"2.0","id":7,"result":{"sessionId":"n5"}}`, wantOpen: "n5", wantExtraDirs: []string{ws + "/x"}},
	}
	pp := startProxyWith(t, e.m)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			request := strings.ReplaceAll(tc.request, "WS", ws) + "\n"
			send(t, pp.toProxyFromEditor, request)
			if got := recv(t, pp.agent); got != request {
				t.Fatalf("agent got %q, want %q", got, request)
			}
			send(t, pp.toProxyFromAgent, tc.answer+"\n")
			if got := recv(t, pp.editor); got != tc.answer+"\n" {
				t.Fatalf("editor got %q, want %q", got, tc.answer)
			}
			// The answer is acted on before it is relayed.
			pp.p.mu.Lock()
			defer pp.p.mu.Unlock()
			if n := len(pp.p.sessionCalls); n != 0 {
				t.Errorf("%d session calls still wait for an answer", n)
			}
			if tc.wantOpen != "" {
				spec, ok := pp.p.specs[tc.wantOpen]
				if !ok || spec.Workspace != ws || !slices.Equal(spec.ExtraDirs, tc.wantExtraDirs) {
					t.Errorf("session %s prepared: %v with %+v, want workspace %s, extra dirs %q", tc.wantOpen, ok, spec, ws, tc.wantExtraDirs)
				}
			}
			if _, ok := pp.p.specs[tc.wantClosed]; tc.wantClosed != "" && ok {
				t.Errorf("session %s is still there after it closed", tc.wantClosed)
			}
		})
	}
}

// TestWrapProxyDoesNotWaitForAColdStart: a tool call that names a
// terminal of a session whose container is still starting goes on to the
// editor at once; the messages after it must not wait for the container.
func TestWrapProxyDoesNotWaitForAColdStart(t *testing.T) {
	e := newFakeEngine(t, "create")
	defer e.release()
	pp := startProxyWith(t, e.m)
	pp.newSession(t, "s")
	tests := []struct {
		name, line string
		want       string // "" for as it was sent
	}{
		{"unknown terminal", `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c1","content":[{"type":"terminal","terminalId":"term_x"}]}}}`,
			`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c1","content":[{"type":"content","content":{"type":"text","text":"(the output of terminal term_x is not available)"}}]}}}`},
		{"the agent's own terminal", `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"toolu_1","content":[{"type":"terminal","terminalId":"toolu_1"}],"_meta":{"terminal_info":{"terminal_id":"toolu_1","cwd":"/w"}}}}}`, ""},
	}
	for _, tc := range tests {
		ok := t.Run(tc.name, func(t *testing.T) {
			send(t, pp.toProxyFromAgent, tc.line+"\n")
			want := tc.want
			if want == "" {
				want = tc.line
			}
			if got := recv(t, pp.editor); got != want+"\n" {
				t.Errorf("editor got %q, want %q", got, want)
			}
		})
		if !ok {
			break // the proxy may not read the next one
		}
	}
}

// TestWrapProxyRunEndsWithWorkStuck: once cancelled, Run returns in
// bounded time even when work in flight does not end (here, a container
// removal the engine never answers; alike, a refresh written to an
// editor that stopped reading), so that the wrap can stop the agent.
func TestWrapProxyRunEndsWithWorkStuck(t *testing.T) {
	e := newFakeEngine(t, "remove")
	defer e.release()
	pp := startProxyWith(t, e.m)
	pp.newSession(t, "s")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := pp.p.terms.Session(ctx, "s"); err != nil {
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

// TestWrapProxyRepliesDoNotWaitForTheAgent: the replies the relay's
// reader makes itself are queued, so an agent that writes all it has
// before it reads its stdin is not waited for as it waits for sandboxd.
func TestWrapProxyRepliesDoNotWaitForTheAgent(t *testing.T) {
	pp := startProxy(t)
	lines := []string{
		`{"jsonrpc":"2.0","id":null,"method":"terminal/output","params":{"sessionId":"s","terminalId":"t"}}`,
		`{"jsonrpc":"2.0","id":41,"method":"fs/read_text_file","params":{"path":"` + strings.Repeat("a", testMaxMessage) + `"}}`,
		`{"jsonrpc":"2.0","id":null,"method":"terminal/kill","params":{"sessionId":"s","terminalId":"t"}}`,
	}
	marker := `{"jsonrpc":"2.0","method":"_marker","params":{}}` + "\n"
	go func() {
		// The agent does not read until it has written everything.
		for _, line := range lines {
			if _, err := io.WriteString(pp.toProxyFromAgent, line+"\n"); err != nil {
				return
			}
		}
		io.WriteString(pp.toProxyFromAgent, marker)
	}()
	if got := recv(t, pp.editor); got != marker {
		t.Fatalf("editor got %q, want %q", got, marker)
	}
	for _, want := range []string{`"id":null`, `"id":41`, `"id":null`} {
		if got := recv(t, pp.agent); !strings.Contains(got, want) || !strings.Contains(got, `"error"`) {
			t.Errorf("agent got %q, want an error with %s", got, want)
		}
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

// TestWrapProxyFirstRefreshWaits: the rewritten tool call that starts a
// text watch carries the output already, so the first refresh comes no
// sooner than refreshInterval after it.
func TestWrapProxyFirstRefreshWaits(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.newSession(t, "s")
	id := pp.createTerminal(t, ``)
	// Taken before the tool call is sent, so the proxy's own moment of
	// showing it is later: a slow test run cannot make the wait look short.
	shown := time.Now()
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"terminal","terminalId":"`+id+`"}]}}}`+"\n")
	if got := recv(t, pp.editor); !strings.Contains(got, `"sessionUpdate":"tool_call"`) || strings.Contains(got, id+`"}`) {
		t.Fatalf("editor got %q, want the tool call with the terminal as text", got)
	}
	e.output <- []byte("building\n")
	got := recv(t, pp.editor)
	if since := time.Since(shown); since < refreshInterval*8/10 {
		t.Errorf("first refresh %v after the tool call, want %v or more", since, refreshInterval)
	}
	if !strings.Contains(got, `"sessionUpdate":"tool_call_update"`) || !strings.Contains(got, `building\n`) {
		t.Errorf("editor got %q, want a refresh with the output", got)
	}
	close(e.output)
	if got := recv(t, pp.editor); !strings.Contains(got, `[exit code 0]`) {
		t.Errorf("editor got %q, want the output with the exit code", got)
	}
}

// TestWrapProxyMarksOutputItCouldNotShow: an editor that renders terminal
// _meta is told how much output went by between two refreshes that the
// terminal's outputByteLimit did not keep, instead of losing it silently.
func TestWrapProxyMarksOutputItCouldNotShow(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.rendersTerminalMeta()
	pp.newSession(t, "s")
	id := pp.createTerminal(t, `,"outputByteLimit":4`)
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"terminal","terminalId":"`+id+`"}],"_meta":{"z":1, "a":[2]}}}}`+"\n")
	// terminal_info joins the agent's own _meta; nothing else changes.
	head := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"terminal","terminalId":"` + id + `"}],"_meta":{"terminal_info":{"terminal_id":"` + id + `","cwd":"/`
	tail := `"},"z":1, "a":[2]}}}}` + "\n"
	if got := recv(t, pp.editor); !strings.HasPrefix(got, head) || !strings.HasSuffix(got, tail) {
		t.Fatalf("editor got %q, want %q...%q", got, head, tail)
	}
	e.output <- []byte("0123456789")
	want := `"data":"\r\n[sandboxd: 6 bytes of output not shown]\r\n6789"`
	if got := recv(t, pp.editor); !strings.Contains(got, want) {
		t.Errorf("editor got %q, want terminal_output with %s", got, want)
	}
	close(e.output)
	if got := recv(t, pp.editor); !strings.Contains(got, `"terminal_exit"`) {
		t.Errorf("editor got %q, want terminal_exit", got)
	}
}

// TestWrapProxyRunsTerminalNotifications: a terminal/release the agent
// sends as a notification is done, and nothing answers it.
func TestWrapProxyRunsTerminalNotifications(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.newSession(t, "s")
	ids := `{"sessionId":"s","terminalId":"` + pp.createTerminal(t, ``) + `"}`
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"terminal/release","params":`+ids+`}`+"\n")
	deadline := time.Now().Add(10 * time.Second)
	for id := 3; ; id++ {
		send(t, pp.toProxyFromAgent, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"terminal/output","params":%s}`, id, ids)+"\n")
		line := recv(t, pp.agent)
		if !strings.Contains(line, fmt.Sprintf(`"id":%d`, id)) {
			t.Fatalf("got %q, want the answer to %d: something answered the notification", line, id)
		}
		if strings.Contains(line, `"code":-32002`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("terminal still there after its release notification: %q", line)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWrapProxyShowsALateTerminalAsTextToZed: Zed makes its terminal view
// only from a tool_call; a terminal first shown in a tool_call_update
// reaches it as text, refreshed, like any editor's.
func TestWrapProxyShowsALateTerminalAsTextToZed(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.rendersTerminalMeta()
	pp.newSession(t, "s")
	id := pp.createTerminal(t, ``)
	call := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","title":"make"}}}` + "\n"
	send(t, pp.toProxyFromAgent, call)
	if got := recv(t, pp.editor); got != call {
		t.Fatalf("editor got %q, want the tool call as it was", got)
	}
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","content":[{"type":"terminal","terminalId":"`+id+`"}]}}}`+"\n")
	if got := recv(t, pp.editor); strings.Contains(got, "terminal_info") || strings.Contains(got, `"terminalId"`) || !strings.Contains(got, `"type":"text"`) {
		t.Errorf("editor got %q, want the terminal as text", got)
	}
	e.output <- []byte("building\n")
	if got := recv(t, pp.editor); !strings.Contains(got, `building\n`) {
		t.Errorf("editor got %q, want a refresh with the output", got)
	}
	close(e.output)
	if got := recv(t, pp.editor); !strings.Contains(got, `[exit code 0]`) {
		t.Errorf("editor got %q, want the output with the exit code", got)
	}
}

// TestWrapProxyUpdateRepeatingItsTerminalsKeepsTheContent: a status
// change that names the same terminals again does not send their whole
// output once more; the editor keeps what the refreshes gave it.
func TestWrapProxyUpdateRepeatingItsTerminalsKeepsTheContent(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.newSession(t, "s")
	id := pp.createTerminal(t, ``)
	content := `[{"type":"terminal","terminalId":"` + id + `"}]`
	update := func(kind, more string) string {
		line := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"` + kind + `","toolCallId":"c"` + more + `}}}` + "\n"
		send(t, pp.toProxyFromAgent, line)
		return recv(t, pp.editor)
	}
	if got := update("tool_call", `,"title":"make","content":`+content); !strings.Contains(got, `"content":[{`) {
		t.Fatalf("tool call reached the editor as %q, want its content as text", got)
	}
	tests := []struct {
		name, kind, more string
		wantContent      bool
	}{
		{"same terminals", "tool_call_update", `,"status":"in_progress","content":` + content, false},
		{"other content", "tool_call_update", `,"content":[{"type":"content","content":{"type":"text","text":"note"}},` + content[1:], true},
		{"a tool call replaces all", "tool_call", `,"title":"make","content":[{"type":"content","content":{"type":"text","text":"note"}},` + content[1:], true},
	}
	for _, tc := range tests {
		got := update(tc.kind, tc.more)
		if has := strings.Contains(got, `"content":[`); has != tc.wantContent {
			t.Errorf("%s: editor got %q, want content: %v", tc.name, got, tc.wantContent)
		}
		// The rest of the agent's message reaches the editor as written.
		want := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","status":"in_progress"}}}` + "\n"
		if tc.kind == "tool_call_update" && !tc.wantContent && got != want {
			t.Errorf("%s: editor got %q, want %q", tc.name, got, want)
		}
	}
}

// TestWrapProxyCompletionKeepsTheFinalOutput: the agent's update that
// completes a tool call names its ended terminal again; the editor, which
// got the final output already, gets the update without the output once
// more. Other content afterwards still replaces it.
func TestWrapProxyCompletionKeepsTheFinalOutput(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.newSession(t, "s")
	id := pp.createTerminal(t, ``)
	content := `[{"type":"terminal","terminalId":"` + id + `"}]`
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","title":"make","content":`+content+`}}}`+"\n")
	if got := recv(t, pp.editor); !strings.Contains(got, `"type":"text"`) {
		t.Fatalf("editor got %q, want the terminal as text", got)
	}
	e.output <- []byte("built\n")
	close(e.output)
	waitExited(t, e, id)
	completed := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","status":"completed","content":` + content + `}}}` + "\n"
	send(t, pp.toProxyFromAgent, completed)
	if got := recv(t, pp.editor); !strings.Contains(got, `built\n\n[exit code 0]`) {
		t.Fatalf("editor got %q, want the final output", got)
	}
	want := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","status":"completed"}}}` + "\n"
	if got := recv(t, pp.editor); got != want {
		t.Errorf("editor got %q, want %q", got, want)
	}
	// Once more: still nothing to send again.
	send(t, pp.toProxyFromAgent, completed)
	if got := recv(t, pp.editor); got != want {
		t.Errorf("editor got %q, want %q", got, want)
	}
	note := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","content":[{"type":"content","content":{"type":"text","text":"note"}}]}}}` + "\n"
	send(t, pp.toProxyFromAgent, note)
	if got := recv(t, pp.editor); got != note {
		t.Errorf("editor got %q, want the note as sent", got)
	}
	// The terminal shown again after other content: its output again.
	send(t, pp.toProxyFromAgent, completed)
	if got := recv(t, pp.editor); !strings.Contains(got, `built\n\n[exit code 0]`) || !strings.Contains(got, `"status":"completed"`) {
		t.Errorf("editor got %q, want the output with the update", got)
	}
}

// TestWrapProxyEndedContentIsWhatTheEditorHas: the shortcut of
// TestWrapProxyCompletionKeepsTheFinalOutput holds only while the editor
// shows those terminals: not after the agent replaced them (and then sent
// empty content), nor after a permission request showed other content.
func TestWrapProxyEndedContentIsWhatTheEditorHas(t *testing.T) {
	for _, tc := range []struct {
		name, between string
		running       bool // between comes while the terminal runs
	}{
		{"replaced while running, then empty", `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","content":[{"type":"content","content":{"type":"text","text":"done"}}]}}}`, true},
		{"replaced after the end, then empty", `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","content":[{"type":"content","content":{"type":"text","text":"done"}}]}}}`, false},
		{"a permission request with other content", `{"jsonrpc":"2.0","id":7,"method":"session/request_permission","params":{"sessionId":"s","toolCall":{"toolCallId":"c","content":[{"type":"content","content":{"type":"text","text":"allow?"}}]},"options":[]}}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEngine(t)
			pp := startProxyWith(t, e.m)
			pp.newSession(t, "s")
			id := pp.createTerminal(t, ``)
			content := `[{"type":"terminal","terminalId":"` + id + `"}]`
			send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":`+content+`}}}`+"\n")
			recv(t, pp.editor)
			if !tc.running {
				close(e.output)
				waitExited(t, e, id)
			}
			send(t, pp.toProxyFromAgent, tc.between+"\n")
			for got := recv(t, pp.editor); !strings.Contains(got, `"done"`) && !strings.Contains(got, `"allow?"`); got = recv(t, pp.editor) {
				// the final refresh comes first
			}
			if tc.running {
				close(e.output)
				waitExited(t, e, id)
			}
			next := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","content":[]}}}` + "\n"
			if !strings.HasPrefix(tc.name, "replaced") {
				next = `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","content":` + content + `}}}` + "\n"
			}
			send(t, pp.toProxyFromAgent, next)
			if got := recv(t, pp.editor); !strings.Contains(got, `"content":[`) {
				t.Errorf("editor got %q, want the update with its content", got)
			}
		})
	}
}

// TestWrapProxySessionUsedBeforeItsAnswer: a session the agent runs a
// command in before it answers session/new was opened on the wrap's
// workspace; the answer gives it the directories the editor named.
func TestWrapProxySessionUsedBeforeItsAnswer(t *testing.T) {
	e := newFakeEngine(t)
	ws := t.TempDir()
	pp := startProxyIn(t, e.m, ws)
	dir := t.TempDir()
	send(t, pp.toProxyFromEditor, `{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"`+dir+`","mcpServers":[]}}`+"\n")
	recv(t, pp.agent)
	pp.createTerminal(t, ``)
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s"}}`+"\n")
	recv(t, pp.editor)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := pp.p.terms.Session(ctx, "s")
	if err != nil || s.Workspace() != dir {
		t.Fatalf("session s after the answer: %v, %v; want workspace %s", s, err, dir)
	}
}

// TestWrapProxyClosedSessionStaysClosed: a command naming a session the
// editor closed opens no container again, until the editor loads it.
func TestWrapProxyClosedSessionStaysClosed(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.newSession(t, "s")
	send(t, pp.toProxyFromEditor, `{"jsonrpc":"2.0","id":3,"method":"session/close","params":{"sessionId":"s"}}`+"\n")
	recv(t, pp.agent)
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","id":3,"result":{}}`+"\n")
	recv(t, pp.editor)
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","id":4,"method":"terminal/create","params":{"sessionId":"s","command":"make"}}`+"\n")
	if got := recv(t, pp.agent); !strings.Contains(got, `"code":-32002`) || !strings.Contains(got, "closed") {
		t.Errorf("terminal/create in a closed session answered %q, want -32002 saying it was closed", got)
	}
	send(t, pp.toProxyFromEditor, `{"jsonrpc":"2.0","id":5,"method":"session/load","params":{"sessionId":"s","cwd":"`+t.TempDir()+`","mcpServers":[]}}`+"\n")
	recv(t, pp.agent)
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","id":5,"result":{}}`+"\n")
	recv(t, pp.editor)
	pp.createTerminal(t, ``)
}

// TestWrapProxyCancelUnderAnIDInFlight: a $/cancel_request sent under the
// id of the request it cancels gets an error, and that request goes on
// to its one answer.
func TestWrapProxyCancelUnderAnIDInFlight(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.newSession(t, "s")
	id := pp.createTerminal(t, ``)
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","id":9,"method":"terminal/wait_for_exit","params":{"sessionId":"s","terminalId":"`+id+`"}}`+"\n")
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","id":9,"method":"$/cancel_request","params":{"requestId":9}}`+"\n")
	if got := recv(t, pp.agent); !strings.Contains(got, `"id":9`) || !strings.Contains(got, "already in use") {
		t.Errorf("the cancellation got %q, want an error for its id", got)
	}
	close(e.output)
	if got := recv(t, pp.agent); !strings.Contains(got, `"id":9`) || !strings.Contains(got, `"exitCode":0`) {
		t.Errorf("the wait got %q, want its exit status", got)
	}
}

// TestFailedRemovalIsTriedAgain: a container the engine failed to remove
// when its session closed is removed on a later try, and counts as a
// session until then.
func TestFailedRemovalIsTriedAgain(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.newSession(t, "s")
	pp.createTerminal(t, ``)
	e.failRemoves.Store(1)
	before := e.removes.Load()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pp.p.terms.CloseSession(ctx, "s"); err == nil || !strings.Contains(err.Error(), "did not receive an exit event") {
		t.Fatalf("close with a failing removal: %v, want the engine's error", err)
	}
	if n := e.m.Sessions(); n != 1 {
		t.Errorf("%d sessions while the container is still there, want 1", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.removes.Load() < before+2 || e.m.Sessions() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the removal was not tried again within 10s (%d tries, %d sessions)", e.removes.Load()-before, e.m.Sessions())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCloseLeavesAFailedRemovalToLeftovers: sandboxd stopping while a
// container's removal waits for its next try does not report that old
// failure: the removal of what is left at exit takes the container.
func TestCloseLeavesAFailedRemovalToLeftovers(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.newSession(t, "s")
	pp.createTerminal(t, ``)
	e.failRemoves.Store(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pp.p.terms.CloseSession(ctx, "s"); err == nil {
		t.Fatal("close with a failing removal succeeded")
	}
	if err := e.m.Close(ctx); err != nil {
		t.Errorf("Close while the removal waits for its next try: %v, want nil", err)
	}
}

// TestFailedCreateRemovesWhatItMade: a create whose answer is an error
// may have made its container all the same; it is removed by name, not
// left until sandboxd exits.
func TestFailedCreateRemovesWhatItMade(t *testing.T) {
	e := newFakeEngine(t)
	e.failCreates.Store(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.m.Open(ctx, "k", sandbox.SessionSpec{ID: "s", Workspace: t.TempDir()}); err == nil {
		t.Fatal("open with a failing create succeeded")
	}
	e.mu.Lock()
	made := e.made
	e.mu.Unlock()
	if made == "" {
		t.Fatal("no create reached the engine")
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		e.mu.Lock()
		removed := slices.Contains(e.removedNames, made)
		e.mu.Unlock()
		if removed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s of the failed create was not removed", made)
		}
	}
}

// TestCancelledCreateLeavesTheSessionToAnother: a terminal/create asked
// off while another request opens the same session does not take the
// session from the connection, which would close it under the other.
func TestCancelledCreateLeavesTheSessionToAnother(t *testing.T) {
	e := newFakeEngine(t, "create")
	terms := NewTerminals(e.m, "test", t.TempDir(), sandbox.SessionSpec{})
	params := json.RawMessage(`{"sessionId":"s","command":"true"}`)
	first := make(chan error, 1)
	go func() {
		_, err := terms.create(context.Background(), params)
		first <- err
	}()
	// The first is opening the session: its container is being made.
	for deadline := time.Now().Add(5 * time.Second); e.m.Sessions() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first create did not open the session")
		}
	}
	// The second came as the first did, when the connection had no such
	// session yet, and is asked off while it waits for the first's.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	spec := terms.defaults
	spec.ID, spec.Workspace = "s", terms.workspace
	if _, err := terms.open(ctx, "s", spec, nil, false); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled open: %v, want it cancelled", err)
	}
	terms.mu.Lock()
	_, kept := terms.sessions["s"]
	terms.mu.Unlock()
	if !kept {
		t.Error("the cancelled create took the session from the connection")
	}
	e.release() // the first one's start fails now, as the engine says
	if err := <-first; err == nil || strings.Contains(err.Error(), "was closed while this request opened it") {
		t.Errorf("first create: %v, want the engine's error", err)
	}
}

// TestFailedOpensAreForgotten: a new session whose open failed is
// forgotten also when its request was asked off, so that a peer cannot
// fill the connection's memory with sessions that never opened.
func TestFailedOpensAreForgotten(t *testing.T) {
	e := newFakeEngine(t)
	ws := t.TempDir()
	terms := NewTerminals(e.m, "test", ws, sandbox.SessionSpec{})
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for i, ctx := range []context.Context{context.Background(), cancelled} {
		spec := terms.defaults
		spec.ID, spec.Workspace, spec.Dir = fmt.Sprint("s", i), ws, filepath.Join(ws, "missing")
		if _, err := terms.open(ctx, spec.ID, spec, nil, false); err == nil {
			t.Fatalf("open %s with a missing cwd: no error", spec.ID)
		}
	}
	terms.mu.Lock()
	left, opening := len(terms.sessions), len(terms.opening)
	terms.mu.Unlock()
	if left != 0 || opening != 0 {
		t.Errorf("%d sessions and %d opens left after failed opens, want none", left, opening)
	}
}

// TestCancelledReleaseStillReleases: a terminal/release asked off while
// its kill waits has released the terminal all the same (its id is gone,
// the sweep ends what is left), and says so rather than -32800.
func TestCancelledReleaseStillReleases(t *testing.T) {
	e := newFakeEngine(t)
	terms := NewTerminals(e.m, "test", t.TempDir(), sandbox.SessionSpec{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := terms.create(ctx, json.RawMessage(`{"sessionId":"s","command":"sleep","args":["60"]}`))
	if err != nil {
		t.Fatal(err)
	}
	id := res.(CreateTerminalResponse).TerminalID
	params := json.RawMessage(`{"sessionId":"s","terminalId":"` + id + `"}`)
	// A terminal/kill under way, whose signal's exec the engine holds:
	// the release waits on it.
	before := e.execs.Load()
	killed := make(chan error, 1)
	go func() {
		_, err := terms.kill(ctx, params)
		killed <- err
	}()
	for e.execs.Load() == before {
		if ctx.Err() != nil {
			t.Fatal("the kill sent no signal")
		}
		time.Sleep(time.Millisecond)
	}
	asked, off := context.WithCancel(ctx)
	off()
	if _, err := terms.release(asked, params); err != nil {
		t.Errorf("release asked off: %v, want it released", err)
	}
	if _, err := terms.output(ctx, params); err == nil || !strings.Contains(err.Error(), "unknown terminal") {
		t.Errorf("output after the release: %v, want the terminal unknown", err)
	}
	close(e.output) // every exec ends: the kill's and the sweep's too
	if err := <-killed; err != nil {
		t.Errorf("kill: %v", err)
	}
}

// TestWrapProxyFinalOutputBeforeTheAnswer: the final output of a terminal
// the agent waited for reaches the editor before the agent's next update
// and its answer to the prompt, not after them, in either form.
func TestWrapProxyFinalOutputBeforeTheAnswer(t *testing.T) {
	for _, meta := range []bool{false, true} {
		e := newFakeEngine(t)
		pp := startProxyWith(t, e.m)
		final := `[exit code 0]`
		if meta {
			pp.rendersTerminalMeta()
			final = `"terminal_exit"`
		}
		pp.newSession(t, "s")
		id := pp.createTerminal(t, ``)
		send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"terminal","terminalId":"`+id+`"}]}}}`+"\n")
		if got := recv(t, pp.editor); !strings.Contains(got, `"sessionUpdate":"tool_call"`) {
			t.Fatalf("editor got %q, want the tool call", got)
		}
		// The editor reads all along, as an editor does.
		lines := make(chan string, 64)
		go func() {
			for {
				line, err := pp.editor.ReadString('\n')
				if err != nil {
					close(lines)
					return
				}
				lines <- line
			}
		}()
		e.output <- []byte("hello\n")
		close(e.output)
		send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","id":5,"method":"terminal/wait_for_exit","params":{"sessionId":"s","terminalId":"`+id+`"}}`+"\n")
		if got := recv(t, pp.agent); !strings.Contains(got, `"exitCode":0`) {
			t.Fatalf("agent got %q, want the exit", got)
		}
		send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","status":"completed"}}}`+"\n"+
			`{"jsonrpc":"2.0","id":77,"result":{"stopReason":"end_turn"}}`+"\n")
		var seen []string
	read:
		for {
			select {
			case got := <-lines:
				if strings.Contains(got, `"status":"completed"`) || strings.Contains(got, `"id":77`) {
					break read
				}
				seen = append(seen, got)
			case <-time.After(5 * time.Second):
				t.Fatalf("meta %v: the agent's update did not come", meta)
			}
		}
		if !slices.ContainsFunc(seen, func(l string) bool {
			return strings.Contains(l, final) && strings.Contains(l, "hello") || meta && strings.Contains(l, final)
		}) {
			t.Errorf("meta %v: before the agent's next messages the editor got %q, want the final output", meta, seen)
		}
	}
}

// TestPeersCannotNameTheSharedSession: the session the AHP channel opens
// for itself is no peer's: a peer's "ahp" is a session of its own, and
// closing it leaves the shared one running.
func TestPeersCannotNameTheSharedSession(t *testing.T) {
	e := newFakeEngine(t)
	ws := t.TempDir()
	terms := NewTerminals(e.m, "test", ws, sandbox.SessionSpec{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	shared, err := terms.SessionFor(ctx, ws)
	if err != nil {
		t.Fatal(err)
	}
	res, err := terms.Handle(ctx, MethodCreate, json.RawMessage(`{"sessionId":"ahp","command":"true"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := shared.Terminal(res.(CreateTerminalResponse).TerminalID); err == nil {
		t.Error("a peer's terminal of session \"ahp\" runs in the shared session")
	}
	if _, err := terms.Handle(ctx, MethodSessionClose, json.RawMessage(`{"sessionId":"ahp"}`)); err != nil {
		t.Fatal(err)
	}
	if again, err := terms.SessionFor(ctx, ws); err != nil || again != shared {
		t.Errorf("shared session after a peer closed its \"ahp\": %v, %v; want the same one", again, err)
	}
	if err := terms.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.m.Sessions(); n != 0 {
		t.Errorf("%d sessions after the connection closed, want 0", n)
	}
	if _, err := terms.SessionFor(ctx, ws); err == nil {
		t.Error("the shared session opened again after the connection closed")
	}
}

// TestWrapProxyShowsARepeatedTerminalOnce: a tool call that names one
// terminal many times shows its output once, so the line to the editor
// grows with the message, not with the square of the repeats.
func TestWrapProxyShowsARepeatedTerminalOnce(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.newSession(t, "s")
	id := pp.createTerminal(t, ``)
	e.output <- bytes.Repeat([]byte("x"), 70<<10)
	const repeats = 200
	item := `{"type":"terminal","terminalId":"` + id + `"}`
	content := "[" + strings.TrimSuffix(strings.Repeat(item+",", repeats), ",") + "]"
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":`+content+`}}}`+"\n")
	got := recv(t, pp.editor)
	if n := strings.Count(got, "is shown above"); n != repeats-1 {
		t.Errorf("%d items point to the output above, want %d", n, repeats-1)
	}
	if max := displayLimit + repeats*200; len(got) > max {
		t.Errorf("line to the editor is %d bytes, want at most %d", len(got), max)
	}
}

// TestWrapProxyStopsRefreshingReplacedContent: an update that replaces a
// tool call's terminal with other content, naming no terminal, reaches the
// editor, and no refresh of the terminal's output follows it, shown as
// text or streamed to Zed: a tool_call_update with other content, or the
// tool call sent again without content (which is none), or with content
// null.
func TestWrapProxyStopsRefreshingReplacedContent(t *testing.T) {
	for _, zed := range []bool{false, true} {
		for _, replacement := range []string{
			`"sessionUpdate":"tool_call_update","toolCallId":"c","content":[{"type":"content","content":{"type":"text","text":"done"}}]`,
			`"sessionUpdate":"tool_call","toolCallId":"c","title":"make"`,
			`"sessionUpdate":"tool_call","toolCallId":"c","title":"make","content":null`,
		} {
			e := newFakeEngine(t)
			pp := startProxyWith(t, e.m)
			if zed {
				pp.rendersTerminalMeta()
			}
			pp.newSession(t, "s")
			id := pp.createTerminal(t, ``)
			send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"terminal","terminalId":"`+id+`"}]}}}`+"\n")
			if got := recv(t, pp.editor); !strings.Contains(got, `"type":"text"`) && !strings.Contains(got, "terminal_info") {
				t.Fatalf("zed %v: editor got %q, want the terminal shown", zed, got)
			}
			replaced := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{` + replacement + `}}}` + "\n"
			send(t, pp.toProxyFromAgent, replaced)
			if got := recv(t, pp.editor); got != replaced {
				t.Fatalf("zed %v, %s: editor got %q, want the replacement as sent", zed, replacement, got)
			}
			// The terminal prints and ends: a watch still running would
			// show it before the agent's next line.
			e.output <- []byte("late output\n")
			close(e.output)
			waitExited(t, e, id)
			marker := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"next"}}}}` + "\n"
			send(t, pp.toProxyFromAgent, marker)
			if got := recv(t, pp.editor); got != marker {
				t.Errorf("zed %v, %s: editor got %q after the replacement, want the agent's next line", zed, replacement, got)
			}
		}
	}
}

// TestWrapProxyStreamsToZedWhatAReshownTerminalWrote: a terminal whose
// tool call showed other content for a while, and then shows it again,
// gets to Zed what it wrote meanwhile.
func TestWrapProxyStreamsToZedWhatAReshownTerminalWrote(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.rendersTerminalMeta()
	pp.newSession(t, "s")
	id := pp.createTerminal(t, ``)
	shows := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","content":[{"type":"terminal","terminalId":"` + id + `"}]}}}` + "\n"
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"terminal","terminalId":"`+id+`"}]}}}`+"\n")
	if got := recv(t, pp.editor); !strings.Contains(got, "terminal_info") {
		t.Fatalf("editor got %q, want terminal_info", got)
	}
	hides := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","content":[]}}}` + "\n"
	send(t, pp.toProxyFromAgent, hides)
	if got := recv(t, pp.editor); got != hides {
		t.Fatalf("editor got %q, want the update as sent", got)
	}
	e.output <- []byte("meanwhile\n")
	send(t, pp.toProxyFromAgent, shows)
	if got := recv(t, pp.editor); got != shows {
		t.Fatalf("editor got %q, want the update as sent", got)
	}
	if got := recv(t, pp.editor); !strings.Contains(got, "terminal_output") || !strings.Contains(got, `meanwhile\n`) {
		t.Errorf("editor got %q, want the output written while hidden", got)
	}
}

// TestWrapProxyTellsZedOfAnEndWhileHidden: a terminal that ended while its
// tool call showed other content gets its last output and its exit to Zed
// once the tool call shows it again, also after other messages passed.
func TestWrapProxyTellsZedOfAnEndWhileHidden(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.rendersTerminalMeta()
	pp.newSession(t, "s")
	id := pp.createTerminal(t, ``)
	update := func(content string) string {
		return `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","content":` + content + `}}}` + "\n"
	}
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"terminal","terminalId":"`+id+`"}]}}}`+"\n")
	if got := recv(t, pp.editor); !strings.Contains(got, "terminal_info") {
		t.Fatalf("editor got %q, want terminal_info", got)
	}
	hides := update(`[]`)
	send(t, pp.toProxyFromAgent, hides)
	if got := recv(t, pp.editor); got != hides {
		t.Fatalf("editor got %q, want the update as sent", got)
	}
	e.output <- []byte("last words\n")
	close(e.output)
	waitExited(t, e, id)
	marker := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"next"}}}}` + "\n"
	send(t, pp.toProxyFromAgent, marker)
	if got := recv(t, pp.editor); got != marker {
		t.Fatalf("editor got %q while the terminal is hidden, want the agent's line", got)
	}
	shows := update(`[{"type":"terminal","terminalId":"` + id + `"}]`)
	send(t, pp.toProxyFromAgent, shows)
	if got := recv(t, pp.editor); got != shows {
		t.Fatalf("editor got %q, want the update as sent", got)
	}
	if got := recv(t, pp.editor); !strings.Contains(got, `last words\n`) || !strings.Contains(got, "terminal_exit") {
		t.Errorf("editor got %q, want the last output and the exit", got)
	}
}

// waitExited waits until the fake engine's terminal id of session s has
// ended.
func waitExited(t *testing.T, e *fakeEngine, id string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		s, err := e.m.Get(context.Background(), "test\x00s")
		if err != nil {
			t.Fatal(err)
		}
		if term, err := s.Terminal(id); err != nil || term.Exited() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the terminal did not end")
		}
	}
}

// TestWrapRelaysTheAgentsLastLines: the agent wrote its last lines and
// exited while the relay still waited for the editor to read the first.
// Neither a line of the editor's, whose write to the gone agent fails, nor
// an editor slower to read than the agent's drain time may end the relay
// before the rest reached the editor.
func TestWrapRelaysTheAgentsLastLines(t *testing.T) {
	for _, slow := range []bool{false, true} {
		t.Run(fmt.Sprintf("slow editor %v", slow), func(t *testing.T) {
			dir := t.TempDir()
			exited := filepath.Join(dir, "exited")
			// a is longer than the pipe holds, so b is written only once
			// the relay has taken all of a, and stays in the pipe while
			// the relay waits for the editor to read a.
			script := `read l; printf '{"jsonrpc":"2.0","method":"a","params":{"pad":"%0200000d"}}\n' 0; echo '{"jsonrpc":"2.0","method":"b"}'; : > "$1"; exit 3`
			edInR, edInW := io.Pipe()
			edOutR, edOutW := io.Pipe()
			done := make(chan int, 1)
			go func() {
				// Limits of their own: no spare container, so no manager
				// needed.
				terms := NewTerminals(nil, "t", "/", sandbox.SessionSpec{Limits: limits.Limits{Pids: 10}})
				code, _ := Wrap(context.Background(), terms, pipeConn{edInR, edOutW}, Agent{Argv: []string{"sh", "-c", script, "sh", exited}, Stderr: io.Discard, Grace: time.Second}, slog.New(slog.NewTextHandler(io.Discard, nil)))
				done <- code
			}()
			io.WriteString(edInW, `{"jsonrpc":"2.0","method":"x"}`+"\n")
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				if _, err := os.Stat(exited); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the agent did not get to its end")
				}
			}
			if slow {
				// The editor's slowness is what is tested, not a wait for
				// an event: it reads after the agent's drain time.
				time.Sleep(drainTimeout + 500*time.Millisecond)
			} else {
				// Written to an agent that is gone (or about to be).
				go io.WriteString(edInW, `{"jsonrpc":"2.0","method":"y"}`+"\n")
			}
			editor := bufio.NewReader(edOutR)
			for _, want := range []string{`"method":"a"`, `"method":"b"`} {
				if got := recv(t, editor); !strings.Contains(got, want) {
					t.Fatalf("editor got %.100q, want the agent's line with %s", got, want)
				}
			}
			edInW.Close()
			select {
			case code := <-done:
				if code != 3 {
					t.Errorf("wrap exited %d, want the agent's 3", code)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("wrap did not end")
			}
		})
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
