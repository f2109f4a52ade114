package acp

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
)

func TestWrapProxyAnswersTerminalRequestsItself(t *testing.T) {
	tests := []struct {
		name     string
		request  string
		wantCode int
		wantText string
	}{
		{"unknown session", `{"jsonrpc":"2.0","id":5,"method":"terminal/output","params":{"sessionId":"nope","terminalId":"t"}}`, jsonrpc.ResourceNotFound, `unknown session \"nope\"`},
		{"string id", `{"jsonrpc":"2.0","id":"w-1","method":"terminal/wait_for_exit","params":{"sessionId":"nope","terminalId":"t"}}`, jsonrpc.ResourceNotFound, "unknown session"},
		{"missing field", `{"jsonrpc":"2.0","id":6,"method":"terminal/create","params":{"command":"ls"}}`, jsonrpc.InvalidParams, "sessionId: required"},
		{"params not an object", `{"jsonrpc":"2.0","id":7,"method":"terminal/kill","params":[1]}`, jsonrpc.InvalidParams, "must be an object"},
		// However the method is spelled, the editor never sees it.
		{"escaped method", `{"jsonrpc":"2.0","id":8,"method":"\u0074erminal/output","params":{"sessionId":"nope","terminalId":"t"}}`, jsonrpc.ResourceNotFound, "unknown session"},
		{"escaped slash", `{"jsonrpc":"2.0","id":9,"method":"terminal\/output","params":{"sessionId":"nope","terminalId":"t"}}`, jsonrpc.ResourceNotFound, "unknown session"},
		{"unknown terminal method", `{"jsonrpc":"2.0","id":10,"method":"terminal/run","params":{}}`, jsonrpc.MethodNotFound, "terminal/run"},
		{"null id", `{"jsonrpc":"2.0","id":null,"method":"terminal/output","params":{"sessionId":"nope","terminalId":"t"}}`, jsonrpc.InvalidRequest, "id of null"},
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
	close(e.Output)
	if got := recv(t, pp.agent); !strings.Contains(got, `"id":9`) || !strings.Contains(got, `"exitCode":0`) {
		t.Errorf("the wait got %q, want its exit status", got)
	}
}
