package ahp

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestSlowClientIsDisconnected checks that a client that stops reading is
// cut off once its backlog is full, without holding up the terminal or a
// client that keeps up.
func TestSlowClientIsDisconnected(t *testing.T) {
	const chunk = 64 << 10
	s := testServer(Config{Token: "tok", Backlog: 1 << 20})
	hs := httptest.NewServer(s)
	defer hs.Close()
	ctx := context.Background()
	dial := func(id string) *websocket.Conn { return dialSubscribed(t, hs.URL, id) }
	before := runtime.NumGoroutine()
	fast, stalled := dial("fast"), dial("stalled")
	defer fast.CloseNow()
	defer stalled.CloseNow()
	conns := func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.conns)
	}
	// Far more than the backlog and the sockets' buffers hold; the fast
	// client reads each chunk before the next is emitted.
	for i := range 512 {
		s.emit("ahp-terminal:/t", Action{Type: "terminal/data", Data: strings.Repeat("x", chunk)}, nil)
		_, msg, err := fast.Read(ctx)
		if err != nil {
			t.Fatalf("fast client, chunk %d: %v", i, err)
		}
		var n struct {
			Params Envelope `json:"params"`
		}
		if err := json.Unmarshal(msg, &n); err != nil || len(n.Params.Action.Data) != chunk {
			t.Fatalf("fast client, chunk %d: %.100s", i, msg)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); conns() != 1; {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections, want the stalled one dropped", conns())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Once both clients are gone, so is every goroutine they had.
	fast.Close(websocket.StatusNormalClosure, "")
	stalled.CloseNow()
	for deadline := time.Now().Add(10 * time.Second); conns() != 0 || runtime.NumGoroutine() > before; {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections and %d goroutines after both clients left, want 0 and at most %d", conns(), runtime.NumGoroutine(), before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSnapshotBiggerThanTheBacklog: a reply bigger than the backlog is
// taken whole, and actions that follow while it is written do not count it
// against the client (which would cut it off, and again at every
// reconnect).
func TestSnapshotBiggerThanTheBacklog(t *testing.T) {
	const size = 8 << 20
	s, url, ctx := serveTest(t, Config{Token: "tok", Backlog: 1 << 20, MaxContent: size})
	s.emit("ahp-terminal:/t", Action{Type: "terminal/data", Data: strings.Repeat("x", size)}, nil)
	ws := dial(t, url)
	defer ws.CloseNow()
	ws.SetReadLimit(2 * size)
	for _, req := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersions":["0.4.0"],"clientId":"c"}}`,
		`{"jsonrpc":"2.0","id":2,"method":"subscribe","params":{"channel":"ahp-terminal:/t"}}`,
	} {
		if err := ws.Write(ctx, websocket.MessageText, []byte(req)); err != nil {
			t.Fatal(err)
		}
	}
	if _, msg, err := ws.Read(ctx); err != nil || !strings.Contains(string(msg), `"id":1`) {
		t.Fatalf("initialize: %.200s, %v", msg, err)
	}
	// Once subscribed, the snapshot is queued (under the same lock); the
	// client reads nothing while the actions come.
	for {
		s.mu.Lock()
		subscribed := false
		for c := range s.conns {
			subscribed = subscribed || c.subscribed("ahp-terminal:/t")
		}
		s.mu.Unlock()
		if subscribed {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("never subscribed")
		}
		time.Sleep(time.Millisecond)
	}
	for range 10 {
		s.emit("ahp-terminal:/t", Action{Type: "terminal/data", Data: "y"}, nil)
	}
	if _, msg, err := ws.Read(ctx); err != nil || !strings.Contains(string(msg), `"id":2`) || len(msg) < size {
		t.Fatalf("subscribe: %.200s (%d bytes), %v", msg, len(msg), err)
	}
	for i := range 10 {
		if _, msg, err := ws.Read(ctx); err != nil || !strings.Contains(string(msg), `"data":"y"`) {
			t.Fatalf("action %d after the snapshot: %.200s, %v", i, msg, err)
		}
	}
}

// TestRepliesDoNotCountAgainstTheBacklog: an answer the reader has queued
// but not yet flushed (a snapshot bigger than the backlog) must not make
// the next action look like a client falling behind.
func TestRepliesDoNotCountAgainstTheBacklog(t *testing.T) {
	s := testServer(Config{Backlog: 1 << 20})
	c := newConn(context.Background(), s, nil)
	defer c.abort()
	c.hold()
	c.sendReply(make([]byte, 8<<20))
	c.send([]byte("action"))
	select {
	case <-c.done:
		t.Fatal("the client was cut off behind its own answer")
	default:
	}
	if c.queued != len("action") || len(c.queue) != 2 {
		t.Errorf("queued %d bytes in %d messages, want the action's %d in 2", c.queued, len(c.queue), len("action"))
	}
	// Actions alone still cut off a client that falls behind.
	for range 2 {
		c.send(make([]byte, 600<<10))
	}
	select {
	case <-c.done:
	default:
		t.Error("a client 1.2 MiB of actions behind, backlog 1 MiB, was not cut off")
	}
}

// TestUnreadAnswersAreBounded: a client that keeps sending requests but
// reads none of the answers, while the writer is stuck on its socket, has
// at most the backlog of answers and one more queued; its requests wait
// meanwhile. Once it reads, every request is answered, in order; if it
// leaves instead, the reader that waited goes, with every other goroutine
// of the connection.
func TestUnreadAnswersAreBounded(t *testing.T) {
	const (
		backlog = 256 << 10
		content = 16 << 10 // each answer is a snapshot of about this
		// Answers far beyond what the backlog and the sockets' buffers
		// hold.
		requests = 400
	)
	for _, tc := range []struct {
		name  string
		reads bool // the client reads its answers at last, or leaves
	}{
		{name: "the client reads at last", reads: true},
		{name: "the client leaves", reads: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, url, _ := serveTest(t, Config{Token: "tok", Backlog: backlog, MaxContent: content})
			// Tens of MiB go through: slow under the race detector.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			s.emit("ahp-terminal:/t", Action{Type: "terminal/data", Data: strings.Repeat("x", content)}, nil)
			before := runtime.NumGoroutine()
			ws := dial(t, url)
			defer ws.CloseNow()
			write := func(req string) {
				t.Helper()
				if err := ws.Write(ctx, websocket.MessageText, []byte(req)); err != nil {
					t.Fatal(err)
				}
			}
			write(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersions":["0.4.0"],"clientId":"c","initialSubscriptions":["ahp-terminal:/t"]}}`)
			if _, msg, err := ws.Read(ctx); err != nil || !strings.Contains(string(msg), `"id":1`) {
				t.Fatalf("initialize: %.200s, %v", msg, err)
			}
			var c *conn
			s.mu.Lock()
			for c = range s.conns {
			}
			s.mu.Unlock()
			// An action more than the sockets' buffers hold, which the
			// client does not read, holds the writer: the reader's flush
			// then leaves the answers to it.
			const stuck = 16 << 20
			ws.SetReadLimit(2 * stuck)
			s.emit("ahp-terminal:/t", Action{Type: "terminal/data", Data: strings.Repeat("y", stuck)}, nil)
			for {
				c.qmu.Lock()
				writing := c.writing
				c.qmu.Unlock()
				if writing {
					break
				}
				if ctx.Err() != nil {
					t.Fatal("the writer never took the action")
				}
				time.Sleep(time.Millisecond)
			}
			for i := range requests {
				write(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"subscribe","params":{"channel":"ahp-terminal:/t"}}`, i+2))
			}
			// The answers queued, not what the writer holds: until the
			// reader waits, and the queue stays as it is.
			queued := func() (answers, waiting int) {
				c.qmu.Lock()
				defer c.qmu.Unlock()
				for _, o := range c.queue {
					if !o.counted {
						answers += o.size
					}
				}
				return answers, c.replies
			}
			peak, last, since := 0, -1, time.Now()
			for {
				n, waiting := queued()
				peak = max(peak, n)
				if n != last {
					last, since = n, time.Now()
				}
				if waiting > backlog && time.Since(since) > 200*time.Millisecond {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("answers never backed up: %d bytes queued, %d waiting", n, waiting)
				}
				time.Sleep(time.Millisecond)
			}
			if limit := backlog + content + 1<<10; peak > limit {
				t.Errorf("%d bytes of answers queued, want at most %d", peak, limit)
			}
			if tc.reads {
				if _, msg, err := ws.Read(ctx); err != nil || len(msg) < stuck {
					t.Fatalf("the action: %.200s (%d bytes), %v", msg, len(msg), err)
				}
				for i := range requests {
					_, msg, err := ws.Read(ctx)
					if err != nil || !strings.Contains(string(msg), fmt.Sprintf(`"id":%d,`, i+2)) || !strings.Contains(string(msg), `"snapshot"`) {
						t.Fatalf("answer %d: %.200s, %v", i, msg, err)
					}
				}
				ws.Close(websocket.StatusNormalClosure, "")
			} else {
				ws.CloseNow()
			}
			for {
				s.mu.Lock()
				conns := len(s.conns)
				s.mu.Unlock()
				if conns == 0 && runtime.NumGoroutine() <= before {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("%d connections and %d goroutines after the client left, want 0 and at most %d", conns, runtime.NumGoroutine(), before)
				}
				time.Sleep(10 * time.Millisecond)
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
