package ahp

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
	"github.com/sandboxd/sandboxd/sandbox"
)

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
	if rerr == nil || rerr.Code != jsonrpc.InvalidParams {
		t.Errorf("reconnect without clientId: %+v", rerr)
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
		case !tc.ok && (rerr == nil || rerr.Code != jsonrpc.InvalidParams || !strings.Contains(rerr.Message, "clientId longer than")):
			t.Errorf("%s with a clientId of %d bytes: %+v, want InvalidParams", tc.method, tc.n, rerr)
		case !tc.ok && c.clientID != "":
			t.Errorf("%s with a clientId of %d bytes took it", tc.method, tc.n)
		}
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
