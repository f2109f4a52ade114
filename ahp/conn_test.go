package ahp

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

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

// TestBinaryFrameIsAnswered checks that a binary frame gets InvalidRequest
// and that the connection goes on serving.
func TestBinaryFrameIsAnswered(t *testing.T) {
	s, url, ctx := serveTest(t, Config{Token: "tok"})
	ws := dialSubscribed(t, url, "c")
	defer ws.CloseNow()
	if err := ws.Write(ctx, websocket.MessageBinary, []byte(`{"jsonrpc":"2.0","id":3,"method":"ping"}`)); err != nil {
		t.Fatal(err)
	}
	_, msg, err := ws.Read(ctx)
	if err != nil || !strings.Contains(string(msg), `"code":-32600`) {
		t.Fatalf("binary frame: %s, %v; want InvalidRequest", msg, err)
	}
	s.emit("ahp-terminal:/t", Action{Type: "terminal/data", Data: "after"}, nil)
	_, msg, err = ws.Read(ctx)
	if err != nil || !strings.Contains(string(msg), `"data":"after"`) {
		t.Fatalf("action after a binary frame: %s, %v", msg, err)
	}
}
