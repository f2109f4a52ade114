package ahp

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/ahp/osc633"
)

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
