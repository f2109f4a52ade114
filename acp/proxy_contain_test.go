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
