package ahp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandboxd/sandboxd/ahp/osc633"
	"github.com/sandboxd/sandboxd/sandbox"
)

func testServer(cfg Config) *Server {
	s := NewServer(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	// A terminal with no exec behind it: enough for state and delivery.
	s.terms["ahp-terminal:/t"] = &terminal{uri: "ahp-terminal:/t", s: s, t: &sandbox.Terminal{}, state: TerminalState{Content: []ContentPart{}}}
	return s
}

func TestReplayIsBounded(t *testing.T) {
	for _, tc := range []struct {
		name               string
		actions, bytes     int
		typ                string // of the actions emitted
		emit, size         int    // how many, and how long their text
		wantMax, wantBytes int    // most actions kept, most bytes held
	}{
		{name: "by count", actions: 10, bytes: 1 << 20, typ: "terminal/data", emit: 100, size: 1, wantMax: 10, wantBytes: 10 * 65},
		{name: "by bytes", actions: 1000, bytes: 1000, typ: "terminal/data", emit: 100, size: 36, wantMax: 10, wantBytes: 1000},
		{name: "titles count", actions: 1000, bytes: 1000, typ: "terminal/titleChanged", emit: 100, size: 36, wantMax: 10, wantBytes: 1000},
		{name: "one huge action is kept", actions: 10, bytes: 10, typ: "terminal/data", emit: 3, size: 1000, wantMax: 1, wantBytes: 1064},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testServer(Config{ReplayActions: tc.actions, ReplayBytes: tc.bytes})
			for range tc.emit {
				a := Action{Type: tc.typ}
				if tc.typ == "terminal/data" {
					a.Data = strings.Repeat("x", tc.size)
				} else {
					a.Title = strings.Repeat("x", tc.size)
				}
				s.emit("ahp-terminal:/t", a, nil)
			}
			held := 0
			for _, e := range s.replay {
				held += e.Action.size()
			}
			if held != s.replayBytes {
				t.Errorf("replayBytes = %d, replay holds %d", s.replayBytes, held)
			}
			if len(s.replay) == 0 || len(s.replay) > tc.wantMax || held > tc.wantBytes {
				t.Errorf("replay holds %d actions, %d bytes; want 1..%d actions, at most %d bytes", len(s.replay), held, tc.wantMax, tc.wantBytes)
			}
			if last := s.replay[len(s.replay)-1].ServerSeq; last != s.seq {
				t.Errorf("newest replayed action is %d, want %d", last, s.seq)
			}
		})
	}
}

func TestReconnect(t *testing.T) {
	s := testServer(Config{ReplayActions: 10})
	// Numbers are relative to where this run started counting.
	base := s.seq
	for range 30 {
		s.emit("ahp-terminal:/t", Action{Type: "terminal/data", Data: "x"}, nil)
	}
	c := &conn{s: s, subs: make(map[string]bool)}
	for _, tc := range []struct {
		name     string
		lastSeen int64
		want     string
		actions  int
	}{
		{name: "within the buffer", lastSeen: 27, want: "replay", actions: 3},
		{name: "up to date", lastSeen: 30, want: "replay", actions: 0},
		{name: "before the buffer", lastSeen: 5, want: "snapshot"},
		{name: "from the future", lastSeen: 99, want: "snapshot"},
		// A client of an earlier run, whose numbers are far lower.
		{name: "from an earlier run", lastSeen: -base + 25, want: "snapshot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			params, _ := json.Marshal(map[string]any{"clientId": "c", "lastSeenServerSeq": base + tc.lastSeen, "subscriptions": []string{"ahp-terminal:/t", "ahp-terminal:/gone"}})
			s.mu.Lock()
			res, rerr := c.reconnectRaw(params)
			s.mu.Unlock()
			if rerr != nil {
				t.Fatal(rerr)
			}
			b, _ := json.Marshal(res)
			var r struct {
				Type      string            `json:"type"`
				Actions   []Envelope        `json:"actions"`
				Missing   []string          `json:"missing"`
				Snapshots []json.RawMessage `json:"snapshots"`
			}
			json.Unmarshal(b, &r)
			if r.Type != tc.want {
				t.Fatalf("type = %q, want %q: %s", r.Type, tc.want, b)
			}
			if r.Type == "replay" {
				if len(r.Actions) != tc.actions || (tc.actions > 0 && r.Actions[0].ServerSeq != base+tc.lastSeen+1) {
					t.Errorf("replayed %s", b)
				}
				if len(r.Missing) != 1 || r.Missing[0] != "ahp-terminal:/gone" {
					t.Errorf("missing = %v", r.Missing)
				}
			} else if len(r.Snapshots) != 1 {
				t.Errorf("snapshots: %s", b)
			}
		})
	}
	s.mu.Lock()
	_, rerr := c.reconnectRaw(json.RawMessage(`{"lastSeenServerSeq":1}`))
	s.mu.Unlock()
	if rerr == nil || rerr.Code != codeInvalidParams {
		t.Errorf("reconnect without clientId: %+v", rerr)
	}
}

// TestFoldMatchesReducer checks that gathering data and reducing it in one
// go leaves the same state as reducing and trimming action by action.
func TestFoldMatchesReducer(t *testing.T) {
	code := 0
	dur := int64(5)
	for _, tc := range []struct {
		name    string
		max     int
		actions []Action
	}{
		{name: "under the cap", max: 100, actions: []Action{
			{Type: "terminal/data", Data: "$ "},
			{Type: "terminal/data", Data: "ls\r\n"},
		}},
		{name: "over the cap in small pieces", max: 10, actions: []Action{
			{Type: "terminal/data", Data: "abcdef"}, {Type: "terminal/data", Data: "ghijkl"}, {Type: "terminal/data", Data: "mnopqr"},
			{Type: "terminal/data", Data: "stuvwx"},
		}},
		{name: "one piece over the cap", max: 4, actions: []Action{
			{Type: "terminal/data", Data: "0123456789"},
		}},
		{name: "multi-byte characters at the cut", max: 5, actions: []Action{
			{Type: "terminal/data", Data: "ééé"}, {Type: "terminal/data", Data: "€€"}, {Type: "terminal/data", Data: "x€"},
		}},
		{name: "commands", max: 12, actions: []Action{
			{Type: "terminal/data", Data: "$ "},
			{Type: "terminal/commandExecuted", CommandID: "c1", CommandLine: "yes"},
			{Type: "terminal/data", Data: "y\r\ny\r\ny\r\n"}, {Type: "terminal/data", Data: "y\r\ny\r\n"},
			{Type: "terminal/commandFinished", CommandID: "c1", ExitCode: &code, DurationMs: &dur},
			{Type: "terminal/data", Data: "$ "},
			{Type: "terminal/commandExecuted", CommandID: "c2", CommandLine: "cat big"},
			{Type: "terminal/data", Data: strings.Repeat("z", 40)},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := TerminalState{Content: []ContentPart{}}
			for _, a := range tc.actions {
				want = ReduceTerminal(want, a)
				TrimContent(&want, tc.max)
			}
			s := testServer(Config{MaxContent: tc.max})
			for _, a := range tc.actions {
				s.emit("ahp-terminal:/t", a, nil)
			}
			s.mu.Lock()
			snap, _ := s.snapshotLocked("ahp-terminal:/t")
			s.mu.Unlock()
			got, _ := json.Marshal(snap.State)
			wantJSON, _ := json.Marshal(want)
			if string(got) != string(wantJSON) {
				t.Errorf("state\n got %s\nwant %s", got, wantJSON)
			}
		})
	}
}

func TestCreateTerminalRefusesBadParams(t *testing.T) {
	s := testServer(Config{Workspace: "/work"})
	for _, tc := range []struct {
		name   string
		params string
		code   int
	}{
		{"not JSON", `{"channel":`, codeInvalidParams},
		{"no channel", `{"claim":{"kind":"client","clientId":"c"}}`, codeInvalidParams},
		{"root channel", `{"channel":"ahp-root://","claim":{"kind":"client","clientId":"c"}}`, codeInvalidParams},
		{"no scheme", `{"channel":"just-a-name","claim":{"kind":"client","clientId":"c"}}`, codeInvalidParams},
		{"another scheme", `{"channel":"ahp-session:/x","claim":{"kind":"client","clientId":"c"}}`, codeInvalidParams},
		{"a scheme of its own", `{"channel":"term:x","claim":{"kind":"client","clientId":"c"}}`, codeInvalidParams},
		{"the scheme in capitals", `{"channel":"AHP-TERMINAL:/x","claim":{"kind":"client","clientId":"c"}}`, codeInvalidParams},
		{"no id", `{"channel":"ahp-terminal:","claim":{"kind":"client","clientId":"c"}}`, codeInvalidParams},
		{"huge channel", `{"channel":"ahp-terminal:/` + strings.Repeat("x", 2000) + `","claim":{"kind":"client","clientId":"c"}}`, codeInvalidParams},
		{"no claim", `{"channel":"ahp-terminal:/new"}`, codeInvalidParams},
		{"unknown claim kind", `{"channel":"ahp-terminal:/new","claim":{"kind":"root"}}`, codeInvalidParams},
		{"client claim without client", `{"channel":"ahp-terminal:/new","claim":{"kind":"client"}}`, codeInvalidParams},
		{"session claim without session", `{"channel":"ahp-terminal:/new","claim":{"kind":"session","clientId":"c"}}`, codeInvalidParams},
		{"huge claim", `{"channel":"ahp-terminal:/new","claim":{"kind":"client","clientId":"` + strings.Repeat("c", 2000) + `"}}`, codeInvalidParams},
		{"relative cwd", `{"channel":"ahp-terminal:/new","claim":{"kind":"client","clientId":"c"},"cwd":"file:tmp"}`, codeInvalidParams},
		{"cwd of another scheme", `{"channel":"ahp-terminal:/new","claim":{"kind":"client","clientId":"c"},"cwd":"http://x/tmp"}`, codeInvalidParams},
		{"too wide", `{"channel":"ahp-terminal:/new","claim":{"kind":"client","clientId":"c"},"cols":100000,"rows":10}`, codeInvalidParams},
		{"channel taken", `{"channel":"ahp-terminal:/t","claim":{"kind":"client","clientId":"c"}}`, codeAlreadyExists},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rerr := createTerminal(s, json.RawMessage(tc.params))
			if rerr == nil || rerr.Code != tc.code {
				t.Fatalf("error = %+v, want code %d", rerr, tc.code)
			}
			if len(rerr.Message) > 300 {
				t.Errorf("message of %d bytes echoes the input", len(rerr.Message))
			}
			s.mu.Lock()
			n := len(s.terms)
			s.mu.Unlock()
			if n != 1 {
				t.Errorf("%d terminals after a refused create, want the 1 there was", n)
			}
		})
	}
}

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

// TestReconnectToARemadeTerminal: a terminal disposed and made again under
// its URI has actions a client subscribed to the old one cannot apply to
// what it holds, whether it was away when the new one was made or heard of
// it (its subscription ended without a word): it gets snapshots, not a
// replay. A terminal under a URI never used before is replayed.
func TestReconnectToARemadeTerminal(t *testing.T) {
	for _, tc := range []struct {
		name string
		uri  string // of the new terminal
		// heard says the client last heard after the new one was made.
		heard bool
		want  string
	}{
		{name: "away while it was made", uri: "ahp-terminal:/t", want: "snapshot"},
		{name: "heard it made", uri: "ahp-terminal:/t", heard: true, want: "snapshot"},
		{name: "a new URI", uri: "ahp-terminal:/n", heard: true, want: "replay"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testServer(Config{ReplayActions: 100})
			s.emit("ahp-terminal:/t", Action{Type: "terminal/data", Data: "old"}, nil)
			lastSeen := s.seq
			s.mu.Lock()
			s.removeLocked(s.terms["ahp-terminal:/t"])
			s.terms[tc.uri] = &terminal{uri: tc.uri, s: s, t: &sandbox.Terminal{}, since: s.seq, state: TerminalState{Content: []ContentPart{}}}
			s.mu.Unlock()
			s.emit(tc.uri, Action{Type: "terminal/data", Data: "new"}, nil)
			if tc.heard {
				lastSeen = s.seq
			}
			s.emit(tc.uri, Action{Type: "terminal/data", Data: "newer"}, nil)
			c := &conn{s: s, subs: make(map[string]bool)}
			params, _ := json.Marshal(map[string]any{"clientId": "c", "lastSeenServerSeq": lastSeen, "subscriptions": []string{tc.uri}})
			s.mu.Lock()
			res, rerr := c.reconnectRaw(params)
			s.mu.Unlock()
			if rerr != nil {
				t.Fatal(rerr)
			}
			if typ := res.(map[string]any)["type"]; typ != tc.want {
				t.Errorf("reconnect: %v, want %s", typ, tc.want)
			}
		})
	}
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

// TestSubscribeAnswerPrecedesNewerActions subscribes again and again while
// a terminal produces output: no action newer than a snapshot may reach
// the client before the snapshot itself.
func TestSubscribeAnswerPrecedesNewerActions(t *testing.T) {
	s := testServer(Config{Token: "tok"})
	hs := httptest.NewServer(s)
	defer hs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ws := dialSubscribed(t, hs.URL, "c")
	defer ws.CloseNow()
	stop := make(chan struct{})
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		for {
			select {
			case <-stop:
				return
			default:
				s.emit("ahp-terminal:/t", Action{Type: "terminal/data", Data: "x"}, nil)
				// Paced, so that the client keeps up.
				time.Sleep(20 * time.Microsecond)
			}
		}
	}()
	defer func() {
		close(stop)
		<-produced
	}()
	var fromSeq int64 = -1 // of the newest snapshot; -1 while one is awaited
	for i := range 200 {
		unsub := `{"jsonrpc":"2.0","method":"unsubscribe","params":{"channel":"ahp-terminal:/t"}}`
		sub := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"subscribe","params":{"channel":"ahp-terminal:/t"}}`, 100+i)
		for _, m := range []string{unsub, sub} {
			if err := ws.Write(ctx, websocket.MessageText, []byte(m)); err != nil {
				t.Fatal(err)
			}
		}
		var before []int64 // actions that came before the answer
		fromSeq = -1
		for fromSeq < 0 {
			_, msg, err := ws.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var m struct {
				ID     *int `json:"id"`
				Result struct {
					Snapshot struct {
						FromSeq int64 `json:"fromSeq"`
					} `json:"snapshot"`
				} `json:"result"`
				Params Envelope `json:"params"`
			}
			if err := json.Unmarshal(msg, &m); err != nil {
				t.Fatal(err)
			}
			if m.ID != nil {
				fromSeq = m.Result.Snapshot.FromSeq
				continue
			}
			before = append(before, m.Params.ServerSeq)
		}
		// Before the answer, only what the last subscription was owed.
		for _, seq := range before {
			if seq > fromSeq {
				t.Fatalf("subscribe %d: action %d arrived before the snapshot from %d", i, seq, fromSeq)
			}
		}
		// Drain until an action newer than the snapshot shows up; each
		// must be newer.
		for {
			_, msg, err := ws.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var m struct {
				Params Envelope `json:"params"`
			}
			json.Unmarshal(msg, &m)
			if m.Params.ServerSeq <= fromSeq {
				t.Fatalf("subscribe %d: action %d after a snapshot from %d", i, m.Params.ServerSeq, fromSeq)
			}
			break
		}
	}
}

// TestHandshakeComesFirst checks that a connection is served nothing but
// ping before initialize (or reconnect), and initializes once.
func TestHandshakeComesFirst(t *testing.T) {
	s, url, ctx := serveTest(t, Config{Token: "tok"})
	ws := dial(t, url)
	defer ws.CloseNow()
	for _, tc := range []struct{ req, want string }{
		{`{"jsonrpc":"2.0","id":1,"method":"subscribe","params":{"channel":"ahp-terminal:/t"}}`, `"code":-32600`},
		{`{"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":"ahp-terminal:/t","clientSeq":1,"action":{"type":"terminal/claimed","claim":{"kind":"client","clientId":""}}}}`, ""},
		{`{"jsonrpc":"2.0","id":2,"method":"createTerminal","params":{"channel":"ahp-terminal:/n","claim":{"kind":"client","clientId":"c"}}}`, `"code":-32600`},
		{`{"jsonrpc":"2.0","id":3,"method":"ping"}`, `"result":null`},
		{`{"jsonrpc":"2.0","id":4,"method":"initialize","params":{"protocolVersions":["0.4.0"],"clientId":"c"}}`, `"protocolVersion":"0.4.0"`},
		{`{"jsonrpc":"2.0","id":5,"method":"initialize","params":{"protocolVersions":["0.4.0"],"clientId":"other"}}`, `"code":-32600`},
		{`{"jsonrpc":"2.0","id":6,"method":"reconnect","params":{"clientId":"other","lastSeenServerSeq":0,"subscriptions":[]}}`, `"code":-32600`},
		{`{"jsonrpc":"2.0","id":7,"method":"subscribe","params":{"channel":"ahp-terminal:/t"}}`, `"snapshot"`},
		// A malformed claim is rejected, however it is sent.
		{`{"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":"ahp-terminal:/t","clientSeq":2,"action":{"type":"terminal/claimed","claim":{"kind":"client"}}}}`, `"rejectionReason":"a client claim needs a clientId"`},
	} {
		if err := ws.Write(ctx, websocket.MessageText, []byte(tc.req)); err != nil {
			t.Fatal(err)
		}
		if tc.want == "" {
			continue // a notification: nothing comes back
		}
		_, msg, err := ws.Read(ctx)
		if err != nil || !strings.Contains(string(msg), tc.want) {
			t.Errorf("%s:\n got %s, %v\nwant %s", tc.req, msg, err, tc.want)
		}
	}
	s.mu.Lock()
	claim := s.terms["ahp-terminal:/t"].state.Claim
	s.mu.Unlock()
	if claim != (Claim{}) {
		t.Errorf("claim = %+v: changed by actions that were refused", claim)
	}
}

// TestUnsupportedVersionClosesTheConnection: a client offering no version
// spoken here gets UnsupportedProtocolVersion with the versions that are,
// then the connection is closed, as the versioning rules say.
func TestUnsupportedVersionClosesTheConnection(t *testing.T) {
	_, url, ctx := serveTest(t, Config{Token: "tok"})
	ws := dial(t, url)
	defer ws.CloseNow()
	req := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersions":["9.0.0"],"clientId":"c"}}`
	if err := ws.Write(ctx, websocket.MessageText, []byte(req)); err != nil {
		t.Fatal(err)
	}
	_, msg, err := ws.Read(ctx)
	if err != nil || !strings.Contains(string(msg), `"code":-32005`) || !strings.Contains(string(msg), `"supportedVersions":["0.4.0"`) {
		t.Fatalf("answer %s, %v; want UnsupportedProtocolVersion with the versions spoken", msg, err)
	}
	_, msg, err = ws.Read(ctx)
	if websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Errorf("after the refusal: %s, %v; want the connection closed (policy violation)", msg, err)
	}
}

func TestWriteToken(t *testing.T) {
	t.Run("a link at the name is replaced, not followed", func(t *testing.T) {
		dir := t.TempDir()
		target := filepath.Join(dir, "elsewhere")
		if err := os.WriteFile(target, nil, 0o666); err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(dir, "token")
		if err := os.Symlink(target, file); err != nil {
			t.Fatal(err)
		}
		if err := WriteToken(file, "secret"); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(target); len(b) != 0 {
			t.Errorf("the link's target got %q", b)
		}
		fi, err := os.Lstat(file)
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
			t.Fatalf("token file: %v, %v; want a regular file of mode 600", fi.Mode(), err)
		}
		if b, _ := os.ReadFile(file); string(b) != "secret\n" {
			t.Errorf("token file holds %q", b)
		}
	})
	t.Run("a directory others may write to is refused", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "shared")
		if err := os.Mkdir(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		err := WriteToken(filepath.Join(dir, "token"), "secret")
		if err == nil || !strings.Contains(err.Error(), "others may write to") {
			t.Errorf("err = %v", err)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("left %v behind", entries)
		}
	})
	t.Run("a sticky directory such as /tmp is fine", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "sticky")
		if err := os.Mkdir(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
			t.Fatal(err)
		}
		if err := WriteToken(filepath.Join(dir, "token"), "secret"); err != nil {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("removed only while it holds the token", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "token")
		if err := WriteToken(file, "mine"); err != nil {
			t.Fatal(err)
		}
		RemoveToken(file, "theirs")
		if _, err := os.Stat(file); err != nil {
			t.Errorf("another instance's token was removed: %v", err)
		}
		RemoveToken(file, "mine")
		if _, err := os.Stat(file); !os.IsNotExist(err) {
			t.Errorf("token file still there: %v", err)
		}
	})
}

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
		{`{"jsonrpc":"2.0","id":20,"method":"subscribe","params":{"channel":"ahp-terminal:/none"}}`, codeNotFound},
		{`{"jsonrpc":"2.0","id":21,"method":"disposeTerminal","params":{"channel":"ahp-terminal:/none"}}`, codeNotFound},
		{`{"jsonrpc":"2.0","id":22,"method":"createTerminal","params":{"channel":"ahp-terminal:/t","claim":{"kind":"client","clientId":"sender"}}}`, codeAlreadyExists},
		{`{"jsonrpc":"2.0","id":23,"method":"unsubscribe","params":{"channel":7}}`, codeInvalidParams},
		{`{"jsonrpc":"2.0","id":24,"method":"unsubscribe"}`, codeInvalidParams},
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
	if err != nil || json.Unmarshal(msg, &reply) != nil || reply.Error.Code != codeAuthRequired || len(reply.Error.Data.Resources) != 1 {
		t.Fatalf("reply %s, %v; want AuthRequired naming one resource", msg, err)
	}
	res := reply.Error.Data.Resources[0]
	if want := strings.Replace(url, "http://", "ws://", 1); strings.TrimSuffix(res.Resource, "/") != strings.TrimSuffix(want, "/") || !slices.Equal(res.BearerMethods, []string{"header", "query"}) || !res.Required {
		t.Errorf("resource %+v, want %s with the token as a bearer header or query", res, want)
	}
}

// TestOutputCannotForgeCommands: only the shell integration knows the
// nonce, so a program's output can neither start commands (C, D without
// the E that carries it) nor grow the terminal's state past its cap with
// parts that hold no text.
func TestOutputCannotForgeCommands(t *testing.T) {
	const nonce = "n0nce"
	e := func(line string) string { return "\x1b]633;E;" + line + ";" + nonce + "\x07" }
	const c, d = "\x1b]633;C;" + nonce + "\x07", "\x1b]633;D;0;" + nonce + "\x07"
	for _, tc := range []struct {
		name     string
		output   string
		max      int
		commands int // commandExecuted actions wanted
		maxParts int
	}{
		{name: "a real command", output: "$ " + e("ls") + c + "a b\r\n" + d + "$ ", max: 1 << 20, commands: 1, maxParts: 3},
		{name: "C without E", output: strings.Repeat(c, 10000), max: 1 << 20, commands: 0, maxParts: 1},
		{name: "C and D after a used E", output: e("ls") + c + strings.Repeat(c+d, 100), max: 1 << 20, commands: 1, maxParts: 1},
		{name: "E with another nonce", output: strings.Repeat("\x1b]633;E;rm -rf /;guess\x07"+c, 100), max: 1 << 20, commands: 0, maxParts: 1},
		{name: "many real commands stay under the cap", output: strings.Repeat(e("true")+c+d, 5000), max: 4096, commands: 5000, maxParts: 4096 / PartOverhead},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testServer(Config{MaxContent: tc.max, ReplayActions: 100000, ReplayBytes: 1 << 30})
			term := s.terms["ahp-terminal:/t"]
			term.parser = osc633.NewParser(nonce)
			term.process([]byte(tc.output), true)
			s.mu.Lock()
			defer s.mu.Unlock()
			commands := 0
			for _, env := range s.replay {
				if env.Action.Type == "terminal/commandExecuted" {
					commands++
				}
			}
			if commands != tc.commands {
				t.Errorf("%d commandExecuted, want %d", commands, tc.commands)
			}
			term.fold(tc.max)
			size := 0
			for _, p := range term.state.Content {
				size += partSize(p)
			}
			if len(term.state.Content) > tc.maxParts || size > tc.max {
				t.Errorf("state holds %d parts, %d bytes; want at most %d parts, %d bytes", len(term.state.Content), size, tc.maxParts, tc.max)
			}
		})
	}
}

// TestSameTitleIsNotSentAgain: a program that sets its title in a loop
// sends each client the list of terminals once per change, not per set.
func TestSameTitleIsNotSentAgain(t *testing.T) {
	s := testServer(Config{ReplayActions: 1000, ReplayBytes: 1 << 20})
	term := s.terms["ahp-terminal:/t"]
	term.parser = osc633.NewParser("n")
	term.process([]byte(strings.Repeat("\x1b]0;building\x07x", 50)+"\x1b]2;done\x07"), true)
	s.mu.Lock()
	defer s.mu.Unlock()
	var titles []string
	for _, env := range s.replay {
		if env.Action.Type == "terminal/titleChanged" {
			titles = append(titles, env.Action.Title)
		}
	}
	if !slices.Equal(titles, []string{"building", "done"}) {
		t.Errorf("titles sent: %q, want building then done", titles)
	}
}

// TestTitleFloodSendsFewLists: a program that changes its title without
// end sends each title to the terminal's subscribers, but the list of
// terminals to the root's at most once per listInterval, the last with
// the last title.
func TestTitleFloodSendsFewLists(t *testing.T) {
	s := testServer(Config{ReplayActions: 10000, ReplayBytes: 1 << 30})
	term := s.terms["ahp-terminal:/t"]
	term.parser = osc633.NewParser("n")
	start := time.Now()
	term.process([]byte(strings.Repeat("\x1b]0;a\x07\x1b]0;b\x07", 500)+"\x1b]0;last\x07"), true)
	// One at once, one for each listInterval the titles took to come
	// (none, but on a busy machine), and the last.
	most := 2 + int(time.Since(start)/listInterval)
	lists := func() (n int, last string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, env := range s.replay {
			if env.Action.Type == "root/terminalsChanged" {
				n++
				last = env.Action.Terminals[0].Title
			}
		}
		return n, last
	}
	if n, _ := lists(); n > most {
		t.Errorf("%d lists for 1001 titles set at once, want at most %d", n, most)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, last := lists()
		if last == "last" {
			if n > most {
				t.Errorf("%d lists, want at most %d", n, most)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the list never showed the last title: %d lists, the last with %q", n, last)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHandshakesSubscribeOncePerChannel: a channel named many times in
// initialSubscriptions, or in reconnect's subscriptions, gets one snapshot,
// not an answer that multiplies it.
func TestHandshakesSubscribeOncePerChannel(t *testing.T) {
	s := testServer(Config{})
	s.emit("ahp-terminal:/t", Action{Type: "terminal/data", Data: strings.Repeat("x", 1000)}, nil)
	c := &conn{s: s, subs: make(map[string]bool)}
	subs := []string{RootURI}
	for range 1000 {
		subs = append(subs, "ahp-terminal:/t", RootURI)
	}
	params, _ := json.Marshal(map[string]any{"protocolVersions": supportedVersions(), "clientId": "c", "initialSubscriptions": subs})
	s.mu.Lock()
	res, rerr := c.initializeRaw(params)
	s.mu.Unlock()
	if rerr != nil {
		t.Fatal(rerr)
	}
	if snaps := res.(map[string]any)["snapshots"].([]any); len(snaps) != 2 {
		t.Errorf("%d snapshots for 2 channels", len(snaps))
	}
	// So does reconnect, with the missing named once too.
	subs = append(subs, "ahp-terminal:/gone", "ahp-terminal:/gone")
	params, _ = json.Marshal(map[string]any{"clientId": "c", "lastSeenServerSeq": -5, "subscriptions": subs})
	s.mu.Lock()
	res, rerr = (&conn{s: s, subs: make(map[string]bool)}).reconnectRaw(params)
	s.mu.Unlock()
	if rerr != nil {
		t.Fatal(rerr)
	}
	m := res.(map[string]any)
	if snaps := m["snapshots"].([]any); len(snaps) != 2 {
		t.Errorf("reconnect: %d snapshots for 2 channels", len(snaps))
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

// lineWriter hands each log line to a channel.
type lineWriter chan string

func (w lineWriter) Write(p []byte) (int, error) {
	w <- string(p)
	return len(p), nil
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

// TestRejectionsCountTheirChannel: a rejected action kept for replay counts
// the channel it names, which no terminal may have and which may be as
// long as a message.
func TestRejectionsCountTheirChannel(t *testing.T) {
	const replayBytes = 1 << 20
	s := testServer(Config{ReplayBytes: replayBytes, Backlog: 1 << 30})
	c := newConn(context.Background(), s, nil)
	defer c.abort()
	c.clientID = "c"
	long := strings.Repeat("x", 100<<10)
	for range 100 {
		c.handle(context.Background(), []byte(`{"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":"ahp-terminal:/`+long+`","clientSeq":1,"action":{"type":"terminal/input","data":"x"}}}`))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	held := 0
	for _, e := range s.replay {
		held += len(e.Channel)
	}
	if held > replayBytes {
		t.Errorf("replay holds %d bytes of channels, want at most %d", held, replayBytes)
	}
}

// TestReplayCountsOrigins: the client's id an envelope carries counts
// against the replay's bytes, so that a client with a long one does not
// multiply what a reconnect is answered with.
func TestReplayCountsOrigins(t *testing.T) {
	const replayBytes = 64 << 10
	id := strings.Repeat("c", maxURI)
	for _, tc := range []struct {
		name string
		req  string
	}{
		{name: "applied", req: `{"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":"ahp-terminal:/t","clientSeq":1,"action":{"type":"terminal/cleared"}}}`},
		{name: "rejected", req: `{"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":"ahp-terminal:/t","clientSeq":1,"action":{"type":"terminal/data","data":""}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testServer(Config{ReplayBytes: replayBytes, ReplayActions: 1 << 20, Backlog: 1 << 30})
			c := newConn(context.Background(), s, nil)
			defer c.abort()
			c.clientID = id
			for range 1000 {
				c.handle(context.Background(), []byte(tc.req))
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			ids, counted := 0, 0
			for _, e := range s.replay {
				ids += len(e.Origin.ClientID)
				counted += e.size()
			}
			if counted != s.replayBytes {
				t.Errorf("replayBytes = %d, the envelopes count %d", s.replayBytes, counted)
			}
			if ids > replayBytes {
				t.Errorf("replay holds %d bytes of client ids, want at most %d", ids, replayBytes)
			}
		})
	}
}

// TestRejectionReplaysToItsSenderOnly: a reconnect replays a rejection to
// the client that sent the action, and not to any other.
func TestRejectionReplaysToItsSenderOnly(t *testing.T) {
	s := testServer(Config{})
	last := s.seq
	c := &conn{s: s, subs: make(map[string]bool)}
	s.mu.Lock()
	s.rejectLocked(c, "ahp-terminal:/t", json.RawMessage(`{"type":"terminal/data"}`), &Origin{ClientID: "sender", ClientSeq: 1}, "no")
	s.mu.Unlock()
	s.emit("ahp-terminal:/t", Action{Type: "terminal/data", Data: "x"}, nil)
	for _, tc := range []struct {
		client string
		want   int
	}{{"sender", 2}, {"other", 1}} {
		params, _ := json.Marshal(map[string]any{"clientId": tc.client, "lastSeenServerSeq": last, "subscriptions": []string{"ahp-terminal:/t"}})
		s.mu.Lock()
		res, rerr := (&conn{s: s, subs: make(map[string]bool)}).reconnectRaw(params)
		s.mu.Unlock()
		if rerr != nil {
			t.Fatal(rerr)
		}
		r := res.(map[string]any)
		actions, _ := r["actions"].([]Envelope)
		if r["type"] != "replay" || len(actions) != tc.want || actions[len(actions)-1].Action.Data != "x" {
			t.Errorf("%s: replay %+v, want %d actions ending in the data", tc.client, r, tc.want)
		}
	}
}

// TestTerminalsChangedKeepsAnEmptyList: the terminal list the schema
// requires is there when the last terminal goes, however it was made.
func TestTerminalsChangedKeepsAnEmptyList(t *testing.T) {
	for _, list := range [][]TerminalInfo{nil, {}, make([]TerminalInfo, 0, 4)} {
		b, err := json.Marshal(Action{Type: "root/terminalsChanged", Terminals: list})
		if err != nil || !strings.Contains(string(b), `"terminals":[]`) {
			t.Errorf("%#v: %s, %v", list, b, err)
		}
	}
}

// TestDataActionsAreWhatTheStateHolds: output that a sequence cuts inside
// a character reaches clients as the state holds it: the character whole,
// after the action the sequence made, not two halves each replaced.
func TestDataActionsAreWhatTheStateHolds(t *testing.T) {
	const nonce = "n0nce"
	for _, tc := range []struct {
		name, output, want string
	}{
		{"a prompt mark inside a character", "\xe2\x1b]633;A\x07\x82\xac", "€"},
		{"a command start inside a character", "\x1b]633;E;ls;" + nonce + "\x07\xe2\x82\x1b]633;C;" + nonce + "\x07\xac!", "€!"},
		// A title stays in the data, so the program wrote no character.
		{"a title inside a character", "a\xe2\x1b]0;t\x07\x82\xac", "a\ufffd\x1b]0;t\x07\ufffd\ufffd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testServer(Config{MaxContent: 1 << 20, ReplayActions: 1000, ReplayBytes: 1 << 20})
			term := s.terms["ahp-terminal:/t"]
			term.parser = osc633.NewParser(nonce)
			term.process([]byte(tc.output), true)
			term.fold(1 << 20)
			s.mu.Lock()
			defer s.mu.Unlock()
			// What a client following the actions has: each as JSON.
			var sent strings.Builder
			for _, env := range s.replay {
				if env.Action.Type != "terminal/data" {
					continue
				}
				b, _ := json.Marshal(env.Action)
				var a Action
				json.Unmarshal(b, &a)
				sent.WriteString(a.Data)
			}
			// What a snapshot shows, as JSON.
			var raw strings.Builder
			for _, p := range term.state.Content {
				raw.WriteString(p.Value + p.Output)
			}
			b, _ := json.Marshal(raw.String())
			var held string
			json.Unmarshal(b, &held)
			if sent.String() != tc.want || held != tc.want {
				t.Errorf("clients got %q, a snapshot shows %q; want both %q", sent.String(), held, tc.want)
			}
		})
	}
}

// TestSubscribeAnswerIsTheStateWhenAsked: the answer to subscribe is made
// into JSON only when written (not under the server lock), and still shows
// the state as it was when it was queued, not output that came after.
func TestSubscribeAnswerIsTheStateWhenAsked(t *testing.T) {
	s := testServer(Config{Backlog: 64 << 20})
	s.emit("ahp-terminal:/t", Action{Type: "terminal/data", Data: "before "}, nil)
	c := newConn(context.Background(), s, nil)
	defer c.abort()
	c.clientID = "c"
	c.handle(context.Background(), []byte(`{"jsonrpc":"2.0","id":1,"method":"subscribe","params":{"channel":"ahp-terminal:/t"}}`))
	if len(c.queue) != 1 || c.queue[0].build == nil {
		t.Fatalf("queue %+v, want one answer to build when written", c.queue)
	}
	s.emit("ahp-terminal:/t", Action{Type: "terminal/data", Data: "after"}, nil)
	s.mu.Lock()
	s.terms["ahp-terminal:/t"].fold(1 << 20)
	s.mu.Unlock()
	if got := string(c.queue[0].bytes()); !strings.Contains(got, `"before "`) || strings.Contains(got, "after") {
		t.Errorf("answer %s, want the state with before and without after", got)
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
