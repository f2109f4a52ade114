package acp

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
)

// TestContainedProxyRefusesSessionsOutside: a contained agent's proxy
// answers a session/new, load or resume the container cannot show itself,
// naming the path and the workspace; one inside goes to the agent.
func TestContainedProxyRefusesSessionsOutside(t *testing.T) {
	ws := t.TempDir()
	pp := startProxyIn(t, nil, ws)
	pp.p.contained = true
	for _, params := range []string{
		`{"cwd":"/etc","mcpServers":[]}`,
		`{"cwd":"` + ws + `","additionalDirectories":["` + ws + `/sub","/srv"],"mcpServers":[]}`,
	} {
		send(t, pp.toProxyFromEditor, `{"jsonrpc":"2.0","id":7,"method":"session/new","params":`+params+`}`+"\n")
		var reply struct {
			Error struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		line := recv(t, pp.editor)
		if err := json.Unmarshal([]byte(line), &reply); err != nil || reply.Error.Code != jsonrpc.InvalidParams || !strings.Contains(reply.Error.Message, ws) {
			t.Errorf("session/new %s answered %q", params, line)
		}
		if !strings.Contains(reply.Error.Message, "/etc") && !strings.Contains(reply.Error.Message, "additionalDirectories[1]") {
			t.Errorf("the answer names neither the path nor the field: %q", reply.Error.Message)
		}
	}
	inside := `{"jsonrpc":"2.0","id":8,"method":"session/load","params":{"sessionId":"s","cwd":"` + ws + `","mcpServers":[]}}` + "\n"
	send(t, pp.toProxyFromEditor, inside)
	if got := recv(t, pp.agent); got != inside {
		t.Errorf("the agent got %q, want the session/load inside the workspace as sent", got)
	}
}

// TestProxyWarnsOfAnAgentThatRunsCommandsItself: an execute tool call that
// ends without a terminal of sandboxd's is warned of, once; a contained
// agent's is not.
func TestProxyWarnsOfAnAgentThatRunsCommandsItself(t *testing.T) {
	const warning = "this agent runs commands itself"
	update := func(u string) string {
		return `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":` + u + `}}` + "\n"
	}
	for _, contained := range []bool{false, true} {
		pp := startProxy(t)
		pp.p.contained = contained
		for _, u := range []string{
			`{"sessionUpdate":"tool_call","toolCallId":"a","title":"ls","kind":"execute","status":"pending"}`,
			`{"sessionUpdate":"tool_call","toolCallId":"r","title":"read","kind":"read","status":"completed"}`,
			`{"sessionUpdate":"tool_call_update","toolCallId":"a","status":"completed","content":[{"type":"content","content":{"type":"text","text":"x"}}]}`,
			`{"sessionUpdate":"tool_call","toolCallId":"b","title":"ls","kind":"execute","status":"completed"}`,
		} {
			send(t, pp.toProxyFromAgent, update(u))
			recv(t, pp.editor)
			if strings.Contains(u, `"r"`) && strings.Contains(pp.logs.String(), warning) {
				t.Error("warned before an execute tool call ended")
			}
		}
		want := 1
		if contained {
			want = 0
		}
		if n := strings.Count(pp.logs.String(), warning); n != want {
			t.Errorf("contained=%v: warned %d times, want %d:\n%s", contained, n, want, pp.logs.String())
		}
	}
}

// TestContainedAgentHasNoEditorFiles: a contained agent is told of no fs
// capability, and its fs/* requests are refused, not passed to the editor
// (which would read and write on the host); an agent on the host is told
// of the editor's fs as it is.
func TestContainedAgentHasNoEditorFiles(t *testing.T) {
	init := `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"FS":{"readTextFile":true},"fs":{"writeTextFile":true},"terminal":false}}}` + "\n"
	for _, contained := range []bool{false, true} {
		pp := startProxy(t)
		pp.p.contained = contained
		send(t, pp.toProxyFromEditor, init)
		got := recv(t, pp.agent)
		if hasFS := strings.Contains(strings.ToLower(got), `"fs"`); hasFS == contained {
			t.Errorf("contained=%v: the agent got %s", contained, got)
		}
		if !strings.Contains(got, `"terminal":true`) {
			t.Errorf("contained=%v: no terminal capability in %s", contained, got)
		}
		if !contained {
			continue
		}
		for _, req := range []string{
			`{"jsonrpc":"2.0","id":3,"method":"fs/write_text_file","params":{"sessionId":"s","path":"/home/u/.bashrc","content":"x"}}`,
			`{"jsonrpc":"2.0","id":4,"method":"f\u0073/read_text_file","params":{"sessionId":"s","path":"/etc/passwd"}}`,
		} {
			send(t, pp.toProxyFromAgent, req+"\n")
			var reply struct {
				Error struct {
					Code int `json:"code"`
				} `json:"error"`
			}
			if line := recv(t, pp.agent); json.Unmarshal([]byte(line), &reply) != nil || reply.Error.Code != jsonrpc.MethodNotFound {
				t.Errorf("%s answered %q, want method not found", req, line)
			}
		}
		// The editor got nothing of them: the next line it reads is the
		// agent's next message.
		next := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}}}` + "\n"
		send(t, pp.toProxyFromAgent, next)
		if got := recv(t, pp.editor); got != next {
			t.Errorf("the editor got %q, want %q", got, next)
		}
	}
}
