package acp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
)

// proxyPeers is a proxy between two in-memory peers. Its Terminals have no
// manager: every path these tests take must answer without a container.
type proxyPeers struct {
	toProxyFromEditor, toProxyFromAgent io.WriteCloser
	editor, agent                       *bufio.Reader // what each peer receives
	logs                                *syncBuffer
	ended                               chan error
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
	p := NewProxy(NewTerminals(nil, "test", "/", sandbox.SessionSpec{}), pipeConn{edInR, edOutW}, pipeConn{agOutR, agInW}, log)
	// Over-long messages without pushing 64 MiB through a pipe.
	p.editor.max, p.agent.max = testMaxMessage, testMaxMessage
	ctx, cancel := context.WithCancel(context.Background())
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
	} {
		send(t, pp.toProxyFromAgent, line)
	}
	last := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}}}` + "\n"
	send(t, pp.toProxyFromAgent, last)
	if got := recv(t, pp.editor); got != last {
		t.Errorf("editor got %q, want only the message %q", got, last)
	}
	if n := strings.Count(pp.logs.String(), "dropped"); n != 10 {
		t.Errorf("logged %d drops, want 10:\n%s", n, pp.logs)
	}
	// A CR between tokens is whitespace to JSON, a line break to some
	// editors: it reaches the editor as a space.
	send(t, pp.toProxyFromAgent, "{\"a\":\r{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"terminal/create\",\"params\":{}}\r}\n")
	if got, want := recv(t, pp.editor), "{\"a\": {\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"terminal/create\",\"params\":{}} }\n"; got != want {
		t.Errorf("editor got %q, want %q", got, want)
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

func TestWrapRewriteInitialize(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		wantCaps string
		wantMeta bool
	}{
		{"no capabilities", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}`, `{"terminal":true}`, false},
		{"null capabilities", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":null}}`, `{"terminal":true}`, false},
		{"terminal false", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"terminal":false,"fs":{"readTextFile":true}}}}`, `{"fs":{"readTextFile":true},"terminal":true}`, false},
		{"zed meta", `{"jsonrpc":"2.0","id":"a","method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"_meta":{"terminal_output":true,"x":[1]}},"_meta":{"k":"<v&>"}}}`, `{"_meta":{"terminal_output":true,"x":[1]},"terminal":true}`, true},
		{"meta without terminal_output", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"_meta":{"terminal-auth":true}}}}`, `{"_meta":{"terminal-auth":true},"terminal":true}`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := NewProxy(nil, pipeConn{}, pipeConn{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			out := p.rewriteInitialize([]byte(tc.in))
			var got, in map[string]any
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("%s: %v", out, err)
			}
			json.Unmarshal([]byte(tc.in), &in)
			var caps any
			json.Unmarshal([]byte(tc.wantCaps), &caps)
			gp, ip := got["params"].(map[string]any), in["params"].(map[string]any)
			if !reflect.DeepEqual(gp["clientCapabilities"], caps) {
				t.Errorf("capabilities = %v, want %v", gp["clientCapabilities"], caps)
			}
			// Everything else is as the editor wrote it.
			delete(gp, "clientCapabilities")
			delete(ip, "clientCapabilities")
			delete(got, "params")
			delete(in, "params")
			if !reflect.DeepEqual(gp, ip) || !reflect.DeepEqual(got, in) {
				t.Errorf("other fields changed: %s", out)
			}
			if bytes.Contains(out, []byte(`\u003c`)) {
				t.Errorf("rewrite escaped HTML: %s", out)
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
			`{"jsonrpc":"2.0","method":"session/update","params":{"_meta":{"keep":1},"sessionId":"s","update":{"content":[{"type":"content","content":{"type":"text","text":"(the output of terminal term_x is not available)"}},{"type":"diff","path":"/a","newText":"b"}],"sessionUpdate":"tool_call","title":"<ls>","toolCallId":"c"}}}`, false},
		{"unknown terminal, for Zed", `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"terminal","terminalId":"term_x"}]}}}`,
			`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"content":[{"type":"content","content":{"type":"text","text":"(the output of terminal term_x is not available)"}}],"sessionUpdate":"tool_call","toolCallId":"c"}}}`, true},
		// One the agent runs itself and names in its own _meta goes on
		// as it is, for the editor to render from that _meta.
		{"the agent's own terminal, for Zed", `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"toolu_1","kind":"execute","content":[{"type":"terminal","terminalId":"toolu_1"}],"_meta":{"terminal_info":{"terminal_id":"toolu_1","cwd":"/w"}}}}}`, "", true},
		{"the agent's own terminal exits", `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"toolu_1","status":"completed","content":[{"type":"terminal","terminalId":"toolu_1"}],"_meta":{"terminal_exit":{"terminal_id":"toolu_1","exit_code":0,"signal":null}}}}}`, "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := NewProxy(NewTerminals(nil, "test", "/", sandbox.SessionSpec{}), pipeConn{}, pipeConn{Writer: io.Discard}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			p.editorMeta = tc.editorMeta
			var m message
			json.Unmarshal([]byte(tc.line), &m)
			p.updates.Lock() // as fromAgent holds it
			got := p.rewriteUpdate([]byte(tc.line), m.Params)
			p.updates.Unlock()
			if string(got) != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestWrapReadRaw(t *testing.T) {
	long := `{"x":"` + strings.Repeat("é", 70<<10) + `"}`
	in := "one\n\n  \r\ntwo\r\n" + long + "\nlast"
	s := NewLineStream(pipeConn{Reader: strings.NewReader(in)}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, want := range []string{"one\n", "two\r\n", long + "\n", "last\n"} {
		got, err := s.readRaw()
		if err != nil || string(got) != want {
			t.Fatalf("readRaw = %.40q, %v; want %.40q", got, err, want)
		}
	}
	if _, err := s.readRaw(); err != io.EOF {
		t.Errorf("at the end: %v, want EOF", err)
	}
}

func TestPeekHead(t *testing.T) {
	for _, tc := range []struct {
		head              string
		id                string
		request, response bool
	}{
		{`{"jsonrpc":"2.0","id":7,"method":"x","params":{"a":"aaa`, "7", true, false},
		{`{"jsonrpc":"2.0","method":"x","id":"s","params":[1,2`, `"s"`, true, false},
		{`{"id":3,"result":{"output":"aaaa`, "3", false, true},
		{`{"jsonrpc":"2.0","result":{"a":"b"},"id":4}`, "4", false, true},
		{`{"jsonrpc":"2.0","params":{"a":"aaaa`, "", false, false},
		{`not json`, "", false, false},
	} {
		id, req, res := peekHead([]byte(tc.head))
		if string(id) != tc.id || req != tc.request || res != tc.response {
			t.Errorf("peekHead(%q) = %s %v %v, want %s %v %v", tc.head, id, req, res, tc.id, tc.request, tc.response)
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
}
