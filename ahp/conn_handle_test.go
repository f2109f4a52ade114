package ahp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
	"github.com/sandboxd/sandboxd/sandbox"
)

// TestRejectionsAndErrorsAsSpecified: a rejected action gets a serverSeq
// of its own, is kept for replay, reaches its sender and no other
// subscriber, and carries the action as sent; a malformed dispatch is
// rejected too; a session claim can be narrowed within its session; and
// the error codes are AHP's.
func TestRejectionsAndErrorsAsSpecified(t *testing.T) {
	s, url, ctx := serveTest(t, Config{Token: "tok"})
	s.terms["ahp-terminal:/t"].state.Claim = Claim{Kind: "session", Session: "copilot:/s1", TurnID: "turn1", ToolCallID: "call1"}
	sender := dialSubscribed(t, url, "sender")
	defer sender.CloseNow()
	watcher := dialSubscribed(t, url, "watcher")
	defer watcher.CloseNow()
	type envelope struct {
		Params struct {
			Action          json.RawMessage `json:"action"`
			ServerSeq       int64           `json:"serverSeq"`
			RejectionReason string          `json:"rejectionReason"`
			Origin          struct {
				ClientSeq int64 `json:"clientSeq"`
			} `json:"origin"`
		} `json:"params"`
		Error *rpcError `json:"error"`
	}
	read := func(ws *websocket.Conn) envelope {
		t.Helper()
		_, msg, err := ws.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var e envelope
		json.Unmarshal(msg, &e)
		return e
	}
	send := func(req string) {
		t.Helper()
		if err := sender.Write(ctx, websocket.MessageText, []byte(req)); err != nil {
			t.Fatal(err)
		}
	}
	seq := s.seq
	for i, tc := range []struct {
		action, reason string
	}{
		{`{"type":"terminal/data","data":"forged"}`, "cannot be dispatched by a client"},
		{`{"type":"terminal/resized","cols":80.5,"rows":24}`, "malformed action"},
		{`{"type":"terminal/claimed","claim":{"kind":"client","clientId":"sender"}}`, "only the holder of the claim"},
		{`{"type":"terminal/claimed","claim":{"kind":"session","session":"copilot:/s1","turnId":"turn1","toolCallId":"call2"}}`, "may only be narrowed"},
		{`{"type":"terminal/claimed","claim":{"kind":"session","session":"copilot:/s2"}}`, "may only be narrowed"},
	} {
		send(fmt.Sprintf(`{"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":"ahp-terminal:/t","clientSeq":%d,"action":%s}}`, i+1, tc.action))
		seq++
		e := read(sender)
		if e.Params.ServerSeq != seq || !strings.Contains(e.Params.RejectionReason, tc.reason) || string(e.Params.Action) != tc.action || e.Params.Origin.ClientSeq != int64(i+1) {
			t.Errorf("%s: got %+v (action %s), want serverSeq %d, a rejection for %q, the action as sent", tc.action, e.Params, e.Params.Action, seq, tc.reason)
		}
	}
	if n := len(s.replay); n == 0 || s.replay[n-1].ServerSeq != seq || s.replay[n-1].RejectionReason == "" {
		t.Errorf("the last rejection is not kept for replay: %+v", s.replay)
	}
	// The watcher got none of the rejections: the next it hears is what
	// the server does next.
	s.emit("ahp-terminal:/t", Action{Type: "terminal/data", Data: "next"}, nil)
	seq++
	if e := read(watcher); e.Params.ServerSeq != seq || e.Params.RejectionReason != "" {
		t.Errorf("watcher: got %+v (action %s), want serverSeq %d, no rejection", e.Params, e.Params.Action, seq)
	}
	if e := read(sender); e.Params.ServerSeq != seq {
		t.Errorf("sender: got %+v, want serverSeq %d", e.Params, seq)
	}
	// Detaching the tool call's terminal: narrowed within its session.
	send(`{"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":"ahp-terminal:/t","clientSeq":9,"action":{"type":"terminal/claimed","claim":{"kind":"session","session":"copilot:/s1"}}}}`)
	if e := read(sender); e.Params.RejectionReason != "" || e.Params.ServerSeq != seq+1 {
		t.Errorf("narrowing a session claim: %+v", e.Params)
	}
	for _, tc := range []struct {
		req  string
		code int
	}{
		{`{"jsonrpc":"2.0","id":20,"method":"subscribe","params":{"channel":"ahp-terminal:/none"}}`, jsonrpc.NotFound},
		{`{"jsonrpc":"2.0","id":21,"method":"disposeTerminal","params":{"channel":"ahp-terminal:/none"}}`, jsonrpc.NotFound},
		{`{"jsonrpc":"2.0","id":22,"method":"createTerminal","params":{"channel":"ahp-terminal:/t","claim":{"kind":"client","clientId":"sender"}}}`, jsonrpc.AlreadyExists},
		{`{"jsonrpc":"2.0","id":23,"method":"unsubscribe","params":{"channel":7}}`, jsonrpc.InvalidParams},
		{`{"jsonrpc":"2.0","id":24,"method":"unsubscribe"}`, jsonrpc.InvalidParams},
	} {
		send(tc.req)
		for {
			e := read(sender)
			if e.Error != nil {
				if e.Error.Code != tc.code {
					t.Errorf("%s: code %d, want %d", tc.req, e.Error.Code, tc.code)
				}
				break
			}
		}
	}
}

// TestErrorsCutWhatThePeerSent: an error message or a rejection reason
// quotes at most 200 characters of a string the client sent, not the up
// to 8 MiB a message may hold.
func TestErrorsCutWhatThePeerSent(t *testing.T) {
	long := strings.Repeat("x", 100<<10)
	mid := strings.Repeat("x", 900) // under maxURI
	for _, tc := range []struct {
		name      string
		req       string
		handshake bool   // req is the connection's first
		claimedBy string // the client holding the terminal's claim
		want      string
	}{
		{name: "initialize", handshake: true, req: `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersions":["LONG","LONG"],"clientId":"c"}}`, want: "none of the protocol versions"},
		{name: "method", req: `{"jsonrpc":"2.0","id":1,"method":"LONG"}`, want: "method not found"},
		{name: "method before initialize", handshake: true, req: `{"jsonrpc":"2.0","id":1,"method":"LONG"}`, want: "initialize (or reconnect) first"},
		{name: "subscribe", req: `{"jsonrpc":"2.0","id":1,"method":"subscribe","params":{"channel":"ahp-terminal:/LONG"}}`, want: "unknown channel"},
		{name: "disposeTerminal", req: `{"jsonrpc":"2.0","id":1,"method":"disposeTerminal","params":{"channel":"ahp-terminal:/LONG"}}`, want: "unknown terminal"},
		{name: "createTerminal channel", req: `{"jsonrpc":"2.0","id":1,"method":"createTerminal","params":{"channel":"LONG","claim":{"kind":"client","clientId":"c"}}}`, want: "is not a terminal URI"},
		{name: "createTerminal claim", req: `{"jsonrpc":"2.0","id":1,"method":"createTerminal","params":{"channel":"ahp-terminal:/n","claim":{"kind":"LONG"}}}`, want: "is neither client nor session"},
		{name: "createTerminal cwd", req: `{"jsonrpc":"2.0","id":1,"method":"createTerminal","params":{"channel":"ahp-terminal:/n","claim":{"kind":"client","clientId":"c"},"cwd":"http://h/MID"}}`, want: "is not a file URI"},
		{name: "createTerminal long cwd", req: `{"jsonrpc":"2.0","id":1,"method":"createTerminal","params":{"channel":"ahp-terminal:/n","claim":{"kind":"client","clientId":"c"},"cwd":"file:///LONG"}}`, want: "cwd longer than"},
		{name: "createTerminal long name", req: `{"jsonrpc":"2.0","id":1,"method":"createTerminal","params":{"channel":"ahp-terminal:/n","claim":{"kind":"client","clientId":"c"},"name":"LONG"}}`, want: "name longer than"},
		{name: "action on an unknown terminal", req: `{"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":"ahp-terminal:/LONG","clientSeq":1,"action":{"type":"terminal/input","data":"x"}}}`, want: "unknown terminal"},
		{name: "action of an unknown type", req: `{"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":"ahp-terminal:/t","clientSeq":1,"action":{"type":"LONG"}}}`, want: "cannot be dispatched by a client"},
		{name: "action on the root channel", req: `{"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":"ahp-root://","clientSeq":1,"action":{"type":"LONG"}}}`, want: "on the root channel"},
		{name: "claim held by another", claimedBy: long, req: `{"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":"ahp-terminal:/t","clientSeq":1,"action":{"type":"terminal/claimed","claim":{"kind":"client","clientId":"c"}}}}`, want: "only the holder of the claim"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testServer(Config{Backlog: 64 << 20})
			if tc.claimedBy != "" {
				s.terms["ahp-terminal:/t"].state.Claim = Claim{Kind: "client", ClientID: tc.claimedBy}
			}
			c := newConn(context.Background(), s, nil)
			defer c.abort()
			if !tc.handshake {
				c.clientID = "c"
			}
			req := strings.NewReplacer("LONG", long, "MID", mid).Replace(tc.req)
			c.handle(context.Background(), []byte(req))
			if len(c.queue) == 0 {
				t.Fatal("no answer")
			}
			var m struct {
				Error  *rpcError `json:"error"`
				Params struct {
					RejectionReason string `json:"rejectionReason"`
				} `json:"params"`
			}
			if err := json.Unmarshal(c.queue[len(c.queue)-1].bytes(), &m); err != nil {
				t.Fatal(err)
			}
			why := m.Params.RejectionReason
			if m.Error != nil {
				why = m.Error.Message
			}
			if !strings.Contains(why, tc.want) {
				t.Errorf("%.300q does not say %q", why, tc.want)
			}
			if n := strings.Count(why, "x"); n > 200 {
				t.Errorf("%d characters of what was sent quoted in %d bytes: %.300q", n, len(why), why)
			}
		})
	}
}

// TestCreateTerminalDoesNotHoldUpTheConnection: while a terminal starts
// (here: its session never comes until released), the connection's other
// requests are answered, but one that names the terminal being started
// waits for it, and is answered after it.
func TestCreateTerminalDoesNotHoldUpTheConnection(t *testing.T) {
	release := make(chan struct{})
	_, url, ctx := serveTest(t, Config{Token: "tok", Workspace: "/work", Sessions: func(ctx context.Context, dir string) (*sandbox.Session, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, errors.New("no engine here")
	}})
	ws := dialSubscribed(t, url, "c")
	defer ws.CloseNow()
	for _, req := range []string{
		`{"jsonrpc":"2.0","id":10,"method":"createTerminal","params":{"channel":"ahp-terminal:/new","claim":{"kind":"client","clientId":"c"}}}`,
		`{"jsonrpc":"2.0","id":12,"method":"ping"}`,
		`{"jsonrpc":"2.0","id":11,"method":"subscribe","params":{"channel":"ahp-terminal:/new"}}`,
	} {
		if err := ws.Write(ctx, websocket.MessageText, []byte(req)); err != nil {
			t.Fatal(err)
		}
	}
	readID := func() string {
		t.Helper()
		for {
			_, msg, err := ws.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var m struct {
				ID json.RawMessage `json:"id"`
			}
			json.Unmarshal(msg, &m)
			if len(m.ID) > 0 {
				return string(m.ID) + " " + string(msg)
			}
		}
	}
	if got := readID(); !strings.HasPrefix(got, "12 ") {
		t.Fatalf("first answer %q, want the ping's while the terminal starts", got)
	}
	close(release)
	if got := readID(); !strings.HasPrefix(got, "10 ") || !strings.Contains(got, "no engine here") {
		t.Errorf("second answer %q, want createTerminal's failure", got)
	}
	if got := readID(); !strings.HasPrefix(got, "11 ") || !strings.Contains(got, "unknown channel") {
		t.Errorf("third answer %q, want the subscribe's, after the start failed", got)
	}
}

// TestInvalidRequests: JSON that is not a request object gets
// InvalidRequest, with its id when that is a string or a number, and null
// in place of any other; only what is not JSON gets ParseError.
func TestInvalidRequests(t *testing.T) {
	for _, tc := range []struct {
		name, msg string
		code      int // 0 for a result
		id        string
	}{
		{"not JSON", `{"jsonrpc":"2.0","id":1,`, jsonrpc.ParseError, "null"},
		{"an array", `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, jsonrpc.InvalidRequest, "null"},
		{"a string", `"ping"`, jsonrpc.InvalidRequest, "null"},
		{"null", `null`, jsonrpc.InvalidRequest, "null"},
		{"a method that is a number", `{"jsonrpc":"2.0","id":7,"method":5}`, jsonrpc.InvalidRequest, "7"},
		{"a method that is a number, the id after it", `{"jsonrpc":"2.0","method":5,"id":"x"}`, jsonrpc.InvalidRequest, `"x"`},
		{"an object id", `{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}`, jsonrpc.InvalidRequest, "null"},
		{"an array id", `{"jsonrpc":"2.0","id":[1],"method":"ping"}`, jsonrpc.InvalidRequest, "null"},
		{"a boolean id", `{"jsonrpc":"2.0","id":true,"method":"ping"}`, jsonrpc.InvalidRequest, "null"},
		{"a string id", `{"jsonrpc":"2.0","id":"a","method":"ping"}`, 0, `"a"`},
		{"a negative id", ` {"jsonrpc":"2.0","id":-1.5,"method":"ping"}`, 0, "-1.5"},
		{"a null id", `{"jsonrpc":"2.0","id":null,"method":"ping"}`, 0, "null"},
		{"an empty object", `{}`, jsonrpc.InvalidRequest, "null"},
		{"no method", `{"jsonrpc":"2.0"}`, jsonrpc.InvalidRequest, "null"},
		{"no method, an id", `{"jsonrpc":"2.0","id":3}`, jsonrpc.InvalidRequest, "3"},
		{"another version", `{"jsonrpc":"1.0","id":4,"method":"ping"}`, jsonrpc.InvalidRequest, "4"},
		{"a version that is a number", `{"jsonrpc":2,"id":5,"method":"ping"}`, jsonrpc.InvalidRequest, "5"},
		{"no version", `{"id":6,"method":"ping"}`, jsonrpc.InvalidRequest, "6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testServer(Config{})
			c := newConn(context.Background(), s, nil)
			defer c.abort()
			c.handle(context.Background(), []byte(tc.msg))
			if len(c.queue) != 1 {
				t.Fatalf("%d answers, want 1", len(c.queue))
			}
			var m struct {
				ID    json.RawMessage `json:"id"`
				Error *rpcError       `json:"error"`
			}
			if err := json.Unmarshal(c.queue[0].bytes(), &m); err != nil {
				t.Fatal(err)
			}
			code := 0
			if m.Error != nil {
				code = m.Error.Code
			}
			if code != tc.code || string(m.ID) != tc.id {
				t.Errorf("answer %s, want code %d and id %s", c.queue[0].bytes(), tc.code, tc.id)
			}
		})
	}
}
