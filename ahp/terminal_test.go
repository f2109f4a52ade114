package ahp

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/ahp/osc633"
	"github.com/sandboxd/sandboxd/sandbox"
)

// TestProgramTitlesAreBounded: a title a program sets (OSC 0 or 2) is cut
// to maxTitle at a character, as sent, kept and listed; the same long
// title again is not sent again.
func TestProgramTitlesAreBounded(t *testing.T) {
	for _, tc := range []struct {
		name, title string
		times       int
	}{
		{name: "short", title: "make", times: 1},
		{name: "at the bound", title: strings.Repeat("x", maxTitle), times: 1},
		{name: "long", title: strings.Repeat("x", 60<<10), times: 1},
		{name: "long, cut in a character", title: "x" + strings.Repeat("é", 30<<10), times: 1},
		{name: "long, set again", title: strings.Repeat("€", 20<<10), times: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testServer(Config{ReplayBytes: 1 << 30})
			term := s.terms["ahp-terminal:/t"]
			term.parser = osc633.NewParser("n")
			term.process([]byte(strings.Repeat("\x1b]2;"+tc.title+"\x07", tc.times)), true)
			s.mu.Lock()
			defer s.mu.Unlock()
			var sent, listed []string
			for _, env := range s.replay {
				switch env.Action.Type {
				case "terminal/titleChanged":
					sent = append(sent, env.Action.Title)
				case "root/terminalsChanged":
					for _, info := range env.Action.Terminals {
						listed = append(listed, info.Title)
					}
				}
			}
			if len(sent) != 1 || len(listed) != 1 {
				t.Fatalf("%d titles sent, %d listed; want 1 of each", len(sent), len(listed))
			}
			for _, got := range []string{sent[0], listed[0], term.state.Title} {
				if len(got) > maxTitle || !utf8.ValidString(got) || !strings.HasPrefix(tc.title, got) || len(got) < min(len(tc.title), maxTitle-utf8.UTFMax) {
					t.Errorf("title of %d bytes (valid UTF-8: %v), want the title's head, at most %d bytes", len(got), utf8.ValidString(got), maxTitle)
				}
			}
		})
	}
}

// TestOutputOfARemovedTerminal: output of a terminal that is no longer
// served (read while its processes are killed) reaches neither the
// terminal made again under its URI nor its clients.
func TestOutputOfARemovedTerminal(t *testing.T) {
	s := testServer(Config{})
	old := s.terms["ahp-terminal:/t"]
	old.parser = osc633.NewParser("n")
	s.mu.Lock()
	s.removeLocked(old)
	remade := &terminal{uri: old.uri, s: s, t: &sandbox.Terminal{}, since: s.seq, state: TerminalState{Content: []ContentPart{}}}
	s.terms[old.uri] = remade
	seq := s.seq
	s.mu.Unlock()
	old.process([]byte("late output\x1b]633;A\x07"), true)
	s.mu.Lock()
	defer s.mu.Unlock()
	remade.fold(1 << 20)
	if len(remade.state.Content) != 0 || remade.state.SupportsCommandDetection || s.seq != seq {
		t.Errorf("the old terminal's output reached the new one: %+v, %d actions", remade.state, s.seq-seq)
	}
}

// TestCreateTerminalWhileClosing: once Close has begun no terminal is
// made, and one being made is waited for; a terminal that fails to start
// leaves its URI alone when it is no longer the one reserved there.
func TestCreateTerminalWhileClosing(t *testing.T) {
	const params = `{"channel":"ahp-terminal:/n","claim":{"kind":"client","clientId":"c"}}`
	// newServer returns a server with no terminal, whose sessions are
	// sessions.
	newServer := func(sessions SessionFor) *Server {
		s := testServer(Config{Workspace: "/work", Sessions: sessions})
		delete(s.terms, "ahp-terminal:/t") // it has no session to release
		return s
	}
	errEngine := errors.New("no engine")

	t.Run("refused after Close", func(t *testing.T) {
		asked := false
		s := newServer(func(context.Context, string) (*sandbox.Session, error) {
			asked = true
			return nil, errEngine
		})
		s.Close()
		rerr := createTerminal(s, json.RawMessage(params))
		if rerr == nil || rerr.Code != codeInternal || !strings.Contains(rerr.Message, "closing") || asked {
			t.Errorf("createTerminal after Close: %+v (a session asked for: %v), want refused as closing", rerr, asked)
		}
	})

	t.Run("Close waits for one being made", func(t *testing.T) {
		asked, release := make(chan struct{}), make(chan struct{})
		s := newServer(func(context.Context, string) (*sandbox.Session, error) {
			close(asked)
			<-release
			return nil, errEngine
		})
		created := make(chan struct{})
		go func() {
			defer close(created)
			createTerminal(s, json.RawMessage(params))
		}()
		<-asked
		closed := make(chan struct{})
		go func() {
			defer close(closed)
			s.Close()
		}()
		select {
		case <-closed:
			t.Error("Close returned while a terminal was being made")
		case <-time.After(100 * time.Millisecond):
		}
		close(release)
		<-created
		<-closed
		if len(s.terms) != 0 {
			t.Errorf("%d terminals left after Close", len(s.terms))
		}
	})

	t.Run("a failure leaves another terminal's URI alone", func(t *testing.T) {
		var s *Server
		other := &terminal{uri: "ahp-terminal:/n"}
		s = newServer(func(context.Context, string) (*sandbox.Session, error) {
			// The reserved terminal is replaced while its session is
			// asked for.
			s.mu.Lock()
			s.terms[other.uri] = other
			s.mu.Unlock()
			return nil, errEngine
		})
		if rerr := createTerminal(s, json.RawMessage(params)); rerr == nil {
			t.Fatal("createTerminal without a session succeeded")
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.terms[other.uri] != other {
			t.Error("a failed createTerminal removed the terminal that took its URI")
		}
	})
}

func TestTermSize(t *testing.T) {
	for _, tc := range []struct{ cols, rows, wantCols, wantRows uint }{
		{0, 0, 80, 24}, {120, 0, 120, 24}, {0, 50, 80, 50}, {132, 43, 132, 43},
	} {
		if c, r := termSize(tc.cols, tc.rows); c != tc.wantCols || r != tc.wantRows {
			t.Errorf("termSize(%d, %d) = %d, %d; want %d, %d", tc.cols, tc.rows, c, r, tc.wantCols, tc.wantRows)
		}
	}
}

// createTerminal serves a createTerminal as a connection does: reserved,
// then started.
func createTerminal(s *Server, params json.RawMessage) *rpcError {
	start, rerr := s.reserveTerminal(params)
	if rerr != nil {
		return rerr
	}
	return start(context.Background())
}
