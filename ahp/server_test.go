package ahp

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandboxd/sandboxd/sandbox"
)

func testServer(cfg Config) *Server {
	s := NewServer(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	// A terminal with no exec behind it: enough for state and delivery.
	s.terms["ahp-terminal:/t"] = &terminal{uri: "ahp-terminal:/t", s: s, t: &sandbox.Terminal{}, state: TerminalState{Content: []ContentPart{}}}
	return s
}

// dialSubscribed connects to a test server as clientID and subscribes to
// its terminal.
func dialSubscribed(t *testing.T, url, clientID string) *websocket.Conn {
	t.Helper()
	ctx := context.Background()
	ws := dial(t, url)
	for i, req := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersions":["0.4.0"],"clientId":"` + clientID + `"}}`,
		`{"jsonrpc":"2.0","id":2,"method":"subscribe","params":{"channel":"ahp-terminal:/t"}}`,
	} {
		if err := ws.Write(ctx, websocket.MessageText, []byte(req)); err != nil {
			t.Fatal(err)
		}
		_, msg, err := ws.Read(ctx)
		if err != nil || !strings.Contains(string(msg), `"id":`+strconv.Itoa(i+1)) || strings.Contains(string(msg), `"error"`) {
			t.Fatalf("%s: reply %s, %v", req, msg, err)
		}
	}
	return ws
}

// serveTest serves a test server over HTTP for the test's duration, and
// gives its URL and a context that bounds the test.
func serveTest(t *testing.T, cfg Config) (*Server, string, context.Context) {
	s := testServer(cfg)
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return s, hs.URL, ctx
}

// dial connects with the token "tok".
func dial(t *testing.T, url string) *websocket.Conn {
	t.Helper()
	ws, _, err := websocket.Dial(context.Background(), url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer tok"}}})
	if err != nil {
		t.Fatal(err)
	}
	ws.SetReadLimit(1 << 20)
	return ws
}

// listen serves s on a free loopback port until ctx ends, and returns the
// address it got and what Listen returned, once it has.
func listen(ctx context.Context, s *Server) (string, <-chan error) {
	bound := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- s.Listen(ctx, "127.0.0.1:0", func(a net.Addr) error {
			bound <- a.String()
			return nil
		})
	}()
	return <-bound, done
}

// lineWriter hands each log line to a channel.
type lineWriter chan string

func (w lineWriter) Write(p []byte) (int, error) {
	w <- string(p)
	return len(p), nil
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
