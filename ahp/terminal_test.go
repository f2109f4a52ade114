package ahp

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
	"github.com/sandboxd/sandboxd/sandbox"
)

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
		if rerr == nil || rerr.Code != jsonrpc.InternalError || !strings.Contains(rerr.Message, "closing") || asked {
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

func TestCreateTerminalRefusesBadParams(t *testing.T) {
	s := testServer(Config{Workspace: "/work"})
	for _, tc := range []struct {
		name   string
		params string
		code   int
	}{
		{"not JSON", `{"channel":`, jsonrpc.InvalidParams},
		{"no channel", `{"claim":{"kind":"client","clientId":"c"}}`, jsonrpc.InvalidParams},
		{"root channel", `{"channel":"ahp-root://","claim":{"kind":"client","clientId":"c"}}`, jsonrpc.InvalidParams},
		{"no scheme", `{"channel":"just-a-name","claim":{"kind":"client","clientId":"c"}}`, jsonrpc.InvalidParams},
		{"another scheme", `{"channel":"ahp-session:/x","claim":{"kind":"client","clientId":"c"}}`, jsonrpc.InvalidParams},
		{"a scheme of its own", `{"channel":"term:x","claim":{"kind":"client","clientId":"c"}}`, jsonrpc.InvalidParams},
		{"the scheme in capitals", `{"channel":"AHP-TERMINAL:/x","claim":{"kind":"client","clientId":"c"}}`, jsonrpc.InvalidParams},
		{"no id", `{"channel":"ahp-terminal:","claim":{"kind":"client","clientId":"c"}}`, jsonrpc.InvalidParams},
		{"huge channel", `{"channel":"ahp-terminal:/` + strings.Repeat("x", 2000) + `","claim":{"kind":"client","clientId":"c"}}`, jsonrpc.InvalidParams},
		{"no claim", `{"channel":"ahp-terminal:/new"}`, jsonrpc.InvalidParams},
		{"unknown claim kind", `{"channel":"ahp-terminal:/new","claim":{"kind":"root"}}`, jsonrpc.InvalidParams},
		{"client claim without client", `{"channel":"ahp-terminal:/new","claim":{"kind":"client"}}`, jsonrpc.InvalidParams},
		{"session claim without session", `{"channel":"ahp-terminal:/new","claim":{"kind":"session","clientId":"c"}}`, jsonrpc.InvalidParams},
		{"huge claim", `{"channel":"ahp-terminal:/new","claim":{"kind":"client","clientId":"` + strings.Repeat("c", 2000) + `"}}`, jsonrpc.InvalidParams},
		{"relative cwd", `{"channel":"ahp-terminal:/new","claim":{"kind":"client","clientId":"c"},"cwd":"file:tmp"}`, jsonrpc.InvalidParams},
		{"cwd of another scheme", `{"channel":"ahp-terminal:/new","claim":{"kind":"client","clientId":"c"},"cwd":"http://x/tmp"}`, jsonrpc.InvalidParams},
		{"too wide", `{"channel":"ahp-terminal:/new","claim":{"kind":"client","clientId":"c"},"cols":100000,"rows":10}`, jsonrpc.InvalidParams},
		{"channel taken", `{"channel":"ahp-terminal:/t","claim":{"kind":"client","clientId":"c"}}`, jsonrpc.AlreadyExists},
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
