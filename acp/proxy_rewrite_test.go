package acp

import (
	"encoding/json"
	"io"
	"log/slog"
	"testing"

	"github.com/sandboxd/sandboxd/sandbox"
)

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
			p := NewProxy(newTerminals(nil, "test", "/", sandbox.SessionSpec{}), pipeConn{}, pipeConn{Writer: io.Discard}, slog.New(slog.NewTextHandler(io.Discard, nil)))
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
	p := NewProxy(newTerminals(nil, "test", "/", sandbox.SessionSpec{}), pipeConn{}, pipeConn{Writer: io.Discard}, slog.New(slog.NewTextHandler(io.Discard, nil)))
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

// TestWrapProxyDoesNotWaitForAColdStart: a tool call that names a
// terminal of a session whose container is still starting goes on to the
// editor at once; the messages after it must not wait for the container.
func TestWrapProxyDoesNotWaitForAColdStart(t *testing.T) {
	e := newFakeEngine(t, "create")
	defer e.Release()
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
