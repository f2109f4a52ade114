package ahp

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
)

// TestWrongTokenGetsAuthRequiredWithData: -32007 carries the
// AuthRequiredErrorData the schema requires.
func TestWrongTokenGetsAuthRequiredWithData(t *testing.T) {
	_, url, ctx := serveTest(t, Config{Token: "tok"})
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer wrong"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`)); err != nil {
		t.Fatal(err)
	}
	_, msg, err := ws.Read(ctx)
	var reply struct {
		Error struct {
			Code int `json:"code"`
			Data struct {
				Resources []struct {
					Resource      string   `json:"resource"`
					BearerMethods []string `json:"bearer_methods_supported"`
					Required      bool     `json:"required"`
				} `json:"resources"`
			} `json:"data"`
		} `json:"error"`
	}
	if err != nil || json.Unmarshal(msg, &reply) != nil || reply.Error.Code != jsonrpc.AuthRequired || len(reply.Error.Data.Resources) != 1 {
		t.Fatalf("reply %s, %v; want AuthRequired naming one resource", msg, err)
	}
	res := reply.Error.Data.Resources[0]
	if want := strings.Replace(url, "http://", "ws://", 1); strings.TrimSuffix(res.Resource, "/") != strings.TrimSuffix(want, "/") || !slices.Equal(res.BearerMethods, []string{"header", "query"}) || !res.Required {
		t.Errorf("resource %+v, want %s with the token as a bearer header or query", res, want)
	}
}

func TestAuthorized(t *testing.T) {
	s := testServer(Config{Token: "tok"})
	for _, tc := range []struct {
		header, query string
		want          bool
	}{
		{"Bearer tok", "", true},
		{"bearer tok", "", true},
		{"BEARER  tok", "", true},
		{"Bearer wrong", "", false},
		{"Bearer wrong", "tok", false},
		{"Basic dXNlcjpwYXNz", "tok", true},
		{"", "tok", true},
		{"", "", false},
		{"tok", "", false},
		{"Bearer", "", false},
	} {
		r := httptest.NewRequest("GET", "/?token="+tc.query, nil)
		if tc.header != "" {
			r.Header.Set("Authorization", tc.header)
		}
		if got := s.authorized(r); got != tc.want {
			t.Errorf("authorized(Authorization %q, token %q) = %v, want %v", tc.header, tc.query, got, tc.want)
		}
	}
	if (&Server{}).authorized(httptest.NewRequest("GET", "/?token=", nil)) {
		t.Error("a server without a token let an empty one in")
	}
}

// TestStrangersAreBounded: a connection without a valid token may send
// one small request; a large one, or one more than maxStrangers at once,
// is closed without it.
func TestStrangersAreBounded(t *testing.T) {
	s, url, ctx := serveTest(t, Config{Token: "tok"})
	wrong := &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer wrong"}}}
	ws, _, err := websocket.Dial(ctx, url, wrong)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	ws.Write(ctx, websocket.MessageText, []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"x":"`+strings.Repeat("x", 1<<20)+`"}}`))
	if _, msg, err := ws.Read(ctx); err == nil {
		t.Errorf("a stranger's 1 MiB request was read and answered: %.100s", msg)
	}
	ws.CloseNow()
	for s.strangers.Load() != 0 {
		if ctx.Err() != nil {
			t.Fatalf("%d strangers still counted after the first left", s.strangers.Load())
		}
		time.Sleep(time.Millisecond)
	}
	var held []*websocket.Conn
	defer func() {
		for _, c := range held {
			c.CloseNow()
		}
	}()
	for range maxStrangers {
		c, _, err := websocket.Dial(ctx, url, wrong)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for s.strangers.Load() < maxStrangers {
		if ctx.Err() != nil {
			t.Fatalf("%d strangers waiting, want %d", s.strangers.Load(), maxStrangers)
		}
		time.Sleep(time.Millisecond)
	}
	extra, resp, err := websocket.Dial(ctx, url, wrong)
	if err == nil {
		extra.CloseNow()
		t.Fatal("one stranger too many was let in")
	}
	if resp == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("one stranger too many: %v, %+v, want 503 with Retry-After", err, resp)
	}
	// A connection with the token still gets in.
	ws2 := dial(t, url)
	ws2.CloseNow()
}

// TestRefusedConnectionsAreClosed: a request that is not upgraded (no
// upgrade headers, a foreign Origin) gets its answer and its connection
// closed, not kept alive for the peer to hold.
func TestRefusedConnectionsAreClosed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := NewServer(ctx, Config{Token: "tok"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	addr, done := listen(ctx, s)
	for _, tc := range []struct{ name, req, status string }{
		{"no upgrade", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", "426"},
		{"a foreign Origin", "GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nOrigin: http://evil.example\r\nAuthorization: Bearer tok\r\n\r\n", "403"},
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, tc.req); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil {
			t.Errorf("%s: the connection stayed open after the answer: %v (read %q)", tc.name, err, got)
			continue
		}
		if !strings.HasPrefix(string(got), "HTTP/1.1 "+tc.status) {
			t.Errorf("%s: answered %.40q, want %s", tc.name, got, tc.status)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Listen: %v", err)
	}
}

// TestLogsNameTheBoundAddress: asked to listen on port 0, the server's
// log lines name the port it got, not the 0 asked for.
func TestLogsNameTheBoundAddress(t *testing.T) {
	lines := make(lineWriter, 16)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := NewServer(ctx, Config{Token: "tok"}, slog.New(slog.NewTextHandler(lines, nil)))
	addr, done := listen(ctx, s)
	ws, _, err := websocket.Dial(ctx, "ws://"+addr+"/", &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer wrong"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	select {
	case line := <-lines:
		if !strings.Contains(line, "ahp="+addr) {
			t.Errorf("log line %q does not name %s", line, addr)
		}
	case <-ctx.Done():
		t.Fatal("nothing logged for a connection without a valid token")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Listen: %v", err)
	}
}

func TestURL(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7681}, "ws://127.0.0.1:7681/"},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 7681}, "ws://[::1]:7681/"},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 7681}, "ws://127.0.0.1:7681/"},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 7681}, "ws://127.0.0.1:7681/"},
		{&net.TCPAddr{IP: net.IPv4(192, 168, 1, 2), Port: 80}, "ws://192.168.1.2:80/"},
	} {
		if got := URL(tc.addr); got != tc.want {
			t.Errorf("URL(%v) = %q, want %q", tc.addr, got, tc.want)
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
