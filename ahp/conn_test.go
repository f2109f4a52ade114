package ahp

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestClientIDIsBounded: a client's id, which every action it sends
// carries, is at most maxURI bytes.
func TestClientIDIsBounded(t *testing.T) {
	for _, tc := range []struct {
		method string
		n      int // bytes of the id
		ok     bool
	}{
		{"initialize", maxURI, true},
		{"initialize", maxURI + 1, false},
		{"initialize", 1 << 20, false},
		{"reconnect", maxURI, true},
		{"reconnect", maxURI + 1, false},
	} {
		s := testServer(Config{})
		c := &conn{s: s, subs: make(map[string]bool)}
		id := strings.Repeat("c", tc.n)
		params, _ := json.Marshal(map[string]any{"protocolVersions": supportedVersions(), "clientId": id, "lastSeenServerSeq": 0, "subscriptions": []string{}})
		s.mu.Lock()
		var rerr *rpcError
		if tc.method == "initialize" {
			_, rerr = c.initializeRaw(params)
		} else {
			_, rerr = c.reconnectRaw(params)
		}
		s.mu.Unlock()
		switch {
		case tc.ok && rerr != nil:
			t.Errorf("%s with a clientId of %d bytes: %+v", tc.method, tc.n, rerr)
		case !tc.ok && (rerr == nil || rerr.Code != codeInvalidParams || !strings.Contains(rerr.Message, "clientId longer than")):
			t.Errorf("%s with a clientId of %d bytes: %+v, want InvalidParams", tc.method, tc.n, rerr)
		case !tc.ok && c.clientID != "":
			t.Errorf("%s with a clientId of %d bytes took it", tc.method, tc.n)
		}
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
		{"not JSON", `{"jsonrpc":"2.0","id":1,`, codeParse, "null"},
		{"an array", `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, codeInvalidRequest, "null"},
		{"a string", `"ping"`, codeInvalidRequest, "null"},
		{"null", `null`, codeInvalidRequest, "null"},
		{"a method that is a number", `{"jsonrpc":"2.0","id":7,"method":5}`, codeInvalidRequest, "7"},
		{"a method that is a number, the id after it", `{"jsonrpc":"2.0","method":5,"id":"x"}`, codeInvalidRequest, `"x"`},
		{"an object id", `{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}`, codeInvalidRequest, "null"},
		{"an array id", `{"jsonrpc":"2.0","id":[1],"method":"ping"}`, codeInvalidRequest, "null"},
		{"a boolean id", `{"jsonrpc":"2.0","id":true,"method":"ping"}`, codeInvalidRequest, "null"},
		{"a string id", `{"jsonrpc":"2.0","id":"a","method":"ping"}`, 0, `"a"`},
		{"a negative id", ` {"jsonrpc":"2.0","id":-1.5,"method":"ping"}`, 0, "-1.5"},
		{"a null id", `{"jsonrpc":"2.0","id":null,"method":"ping"}`, 0, "null"},
		{"an empty object", `{}`, codeInvalidRequest, "null"},
		{"no method", `{"jsonrpc":"2.0"}`, codeInvalidRequest, "null"},
		{"no method, an id", `{"jsonrpc":"2.0","id":3}`, codeInvalidRequest, "3"},
		{"another version", `{"jsonrpc":"1.0","id":4,"method":"ping"}`, codeInvalidRequest, "4"},
		{"a version that is a number", `{"jsonrpc":2,"id":5,"method":"ping"}`, codeInvalidRequest, "5"},
		{"no version", `{"id":6,"method":"ping"}`, codeInvalidRequest, "6"},
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

// TestUnreadingClientIsDisconnected: a client that stays connected but
// stops reading, with less than the backlog waiting for it, is cut off
// once a write has taken the write timeout, and that is logged.
func TestUnreadingClientIsDisconnected(t *testing.T) {
	s, lines, url := loggedServer(t, Config{Token: "tok", Backlog: 64 << 20, WriteTimeout: 200 * time.Millisecond})
	ws := dialSubscribed(t, url, "idle")
	defer ws.CloseNow()
	// More than the sockets' buffers hold, less than the backlog, in
	// messages small enough to get the write timeout itself.
	for range 64 {
		s.emit("ahp-terminal:/t", Action{Type: "terminal/data", Data: strings.Repeat("x", minWriteRate-1024)}, nil)
	}
	if n := waitConns(s, 0); n != 0 {
		t.Fatal("a client that reads nothing is still connected")
	}
	for {
		select {
		case line := <-lines:
			if strings.Contains(line, "not reading") && strings.Contains(line, "client=idle") {
				return
			}
		default:
			t.Fatal("the disconnection was not logged")
		}
	}
}

// TestWrongTokenIDIsEchoedOnlyWhenValid: AuthRequired goes back with the
// request's id when it is one, and with null in place of an object.
func TestWrongTokenIDIsEchoedOnlyWhenValid(t *testing.T) {
	for _, tc := range []struct{ id, want string }{
		{`1`, `"id":1`},
		{`{"a":1}`, `"id":null`},
	} {
		_, url, ctx := serveTest(t, Config{Token: "tok"})
		ws, _, err := websocket.Dial(ctx, url+"?token=wrong", nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := ws.Write(ctx, websocket.MessageText, []byte(`{"jsonrpc":"2.0","id":`+tc.id+`,"method":"initialize"}`)); err != nil {
			t.Fatal(err)
		}
		_, msg, err := ws.Read(ctx)
		if err != nil || !strings.Contains(string(msg), tc.want) {
			t.Errorf("id %s: reply %s, %v; want %s", tc.id, msg, err, tc.want)
		}
		ws.CloseNow()
	}
}

func TestWriteTimeout(t *testing.T) {
	tests := []struct {
		n    int
		want time.Duration
	}{
		{0, 30 * time.Second},
		{minWriteRate - 1, 30 * time.Second},
		{16 << 20, 94 * time.Second},
	}
	for _, tc := range tests {
		if got := writeTimeout(30*time.Second, tc.n); got != tc.want {
			t.Errorf("writeTimeout(30s, %d) = %v, want %v", tc.n, got, tc.want)
		}
	}
}

// TestStalledMessageIsDisconnected: a client that stops part-way through
// a message is cut off once the read timeout has passed, and that is
// logged; a quiet connection between messages is not.
func TestStalledMessageIsDisconnected(t *testing.T) {
	s, lines, url := loggedServer(t, Config{Token: "tok", ReadTimeout: 200 * time.Millisecond})
	quiet := dialSubscribed(t, url, "quiet")
	defer quiet.CloseNow()
	stalled := dialSubscribed(t, url, "stalled")
	defer stalled.CloseNow()
	ctx := context.Background()
	w, err := stalled.Writer(ctx, websocket.MessageText)
	if err != nil {
		t.Fatal(err)
	}
	// A first fragment, without the rest of the message.
	if _, err := w.Write([]byte(`{"jsonrpc":"2.0","id":3,"method":"nope","params":{"pad":"` + strings.Repeat("x", 8<<10))); err != nil {
		t.Fatal(err)
	}
	if n := waitConns(s, 1); n != 1 {
		t.Fatalf("%d clients connected, want the quiet one only", n)
	}
	for logged := false; !logged; {
		select {
		case line := <-lines:
			logged = strings.Contains(line, "middle of a message") && strings.Contains(line, "client=stalled")
		default:
			t.Fatal("the disconnection was not logged")
		}
	}
	// The quiet client, idle for longer than the read timeout, is still
	// served.
	if err := quiet.Write(ctx, websocket.MessageText, []byte(`{"jsonrpc":"2.0","id":3,"method":"nope"}`)); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := quiet.Read(ctx); err != nil || !strings.Contains(string(msg), `"id":3`) {
		t.Fatalf("quiet client: reply %s, %v", msg, err)
	}
}

// TestLongMessagesAreRead: a message is read whole whatever its length
// against the chunks readMessage takes it in.
func TestLongMessagesAreRead(t *testing.T) {
	_, url, ctx := serveTest(t, Config{Token: "tok"})
	ws := dialSubscribed(t, url, "long")
	defer ws.CloseNow()
	for _, n := range []int{0, 1, minWriteRate - 1, minWriteRate, minWriteRate + 1, 2 * minWriteRate, 3*minWriteRate + 7} {
		head := `{"jsonrpc":"2.0","id":` + strconv.Itoa(n) + `,"method":"nope","params":{"pad":"`
		tail := `"}}`
		pad := max(n-len(head)-len(tail), 0)
		msg := head + strings.Repeat("x", pad) + tail
		if err := ws.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		_, reply, err := ws.Read(ctx)
		if err != nil || !strings.Contains(string(reply), `"id":`+strconv.Itoa(n)+`,`) || !strings.Contains(string(reply), "-32601") {
			t.Fatalf("message of %d bytes: reply %s, %v", len(msg), reply, err)
		}
	}
}

// waitConns waits up to 10 s for the server to have want connections, and
// gives how many it has.
func waitConns(s *Server, want int) int {
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s.mu.Lock()
		n := len(s.conns)
		s.mu.Unlock()
		if n == want || time.Now().After(deadline) {
			return n
		}
	}
}

// loggedServer serves a test server that logs to the lines it gives, for
// the test's duration.
func loggedServer(t *testing.T, cfg Config) (*Server, lineWriter, string) {
	s := testServer(cfg)
	lines := make(lineWriter, 64)
	s.log = slog.New(slog.NewTextHandler(lines, nil))
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	return s, lines, hs.URL
}

func TestCheckMaxContent(t *testing.T) {
	for _, tc := range []struct {
		n  int64
		ok bool
	}{{0, false}, {1<<10 - 1, false}, {1 << 10, true}, {1 << 20, true}, {1 << 30, true}, {1<<30 + 1, false}, {-1, false}} {
		if err := CheckMaxContent(tc.n); (err == nil) != tc.ok {
			t.Errorf("CheckMaxContent(%d) = %v, want ok %v", tc.n, err, tc.ok)
		}
	}
}

// TestTokenFile: the default token file is in the user's cache directory,
// named by the port, and there is none without a cache directory (no
// shared fallback).
func TestTokenFile(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", "/cache")
	got, err := TokenFile(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7681})
	if err != nil || got != "/cache/sandboxd/ahp-token-7681" {
		t.Errorf("TokenFile = %q, %v", got, err)
	}
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("HOME", "")
	if got, err := TokenFile(&net.TCPAddr{Port: 1}); err == nil {
		t.Errorf("TokenFile without a cache directory = %q", got)
	}
}

func TestNegotiate(t *testing.T) {
	for _, tc := range []struct {
		offered []string
		want    string
	}{
		{[]string{"0.4.0"}, "0.4.0"},
		{[]string{"0.3.0", "0.4.0"}, "0.4.0"},
		{[]string{"0.4.2", "0.4.1"}, "0.4.2"},
		{[]string{"0.3.9"}, "0.3.9"},
		{[]string{"0.5.0"}, ""},
		{[]string{"1.4.0"}, ""},
		{[]string{"0.2.0"}, ""},
		{[]string{"0.4"}, ""},
		{[]string{"0.4.0-beta"}, ""},
		{[]string{"0.04.0"}, ""},
		{[]string{"v0.4.0", "0.3.0"}, "0.3.0"},
		{nil, ""},
	} {
		if got := negotiate(tc.offered); got != tc.want {
			t.Errorf("negotiate(%q) = %q, want %q", tc.offered, got, tc.want)
		}
	}
}

// initializeRaw and reconnectRaw answer a handshake from its raw params, as
// handle does. s.mu must be held.
func (c *conn) initializeRaw(params json.RawMessage) (any, *rpcError) {
	p, rerr := parseInitialize(params)
	if rerr != nil {
		return nil, rerr
	}
	return c.initializeLocked(p)
}

func (c *conn) reconnectRaw(params json.RawMessage) (any, *rpcError) {
	p, rerr := parseReconnect(params)
	if rerr != nil {
		return nil, rerr
	}
	return c.reconnectLocked(p)
}
