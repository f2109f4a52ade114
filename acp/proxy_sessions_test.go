package acp

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

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
	s, err := pp.p.terms.scope.Session(ctx, "s")
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
