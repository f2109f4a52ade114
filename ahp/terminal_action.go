package ahp

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// check returns why the claim is not well formed, or "".
func (c *Claim) check() string {
	switch {
	case c == nil:
		return "claim is required"
	case c.Kind == "client" && c.ClientID == "":
		return "a client claim needs a clientId"
	case c.Kind == "session" && c.Session == "":
		return "a session claim needs a session"
	case c.Kind != "client" && c.Kind != "session":
		return fmt.Sprintf("claim kind %.50q is neither client nor session", c.Kind)
	case len(c.ClientID)+len(c.Session)+len(c.TurnID)+len(c.ToolCallID) > maxURI:
		return fmt.Sprintf("claim longer than %d bytes", maxURI)
	}
	return ""
}

// apply carries out a client's action on a channel: it takes effect and is
// echoed to every subscriber, or it is echoed to the client alone with the
// reason it was rejected. Either echo is queued under the lock, so that it
// keeps its place among the actions the client receives.
func (s *Server) apply(from *conn, channel string, a Action, raw json.RawMessage, origin *Origin) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if reason := s.applyLocked(from, channel, a, origin); reason != "" {
		s.rejectLocked(from, channel, raw, origin, reason)
	}
}

// applyLocked carries out an action and returns why it was rejected, or ""
// when it took effect. s.mu must be held; resize leaves it meanwhile.
func (s *Server) applyLocked(from *conn, channel string, a Action, origin *Origin) string {
	if channel == RootURI {
		return fmt.Sprintf("%.200s on the root channel is not supported by this server", a.Type)
	}
	t, ok := s.terms[channel]
	if !ok || t.t == nil {
		return fmt.Sprintf("unknown terminal %.200q", channel)
	}
	switch a.Type {
	case "terminal/input":
		if t.t.Exited() {
			return fmt.Sprintf("terminal %.200q has exited", channel)
		}
		data := []byte(a.Data)
		if t.inputBytes == 0 && t.opened {
			// Nothing waits: straight to the PTY, without a hop to the
			// input goroutine, unless the PTY does not take it at once.
			n, err := t.t.TryInput(data)
			if err != nil {
				return err.Error()
			}
			data = data[n:]
		}
		if len(data) > 0 {
			if t.inputBytes > 0 && t.inputBytes+len(data) > maxInput {
				return fmt.Sprintf("terminal %.200q is not reading its input: %d bytes wait", channel, t.inputBytes)
			}
			select {
			case t.input <- data:
				t.inputBytes += len(data)
			default:
				return fmt.Sprintf("terminal %.200q is not reading its input: %d actions wait", channel, len(t.input))
			}
		}
	case "terminal/resized":
		if a.Cols <= 0 || a.Rows <= 0 || a.Cols > maxSize || a.Rows > maxSize {
			return fmt.Sprintf("cols and rows must be between 1 and %d", maxSize)
		}
		// An engine round trip: not under the lock, and not for ever.
		// resizing keeps two clients' resizes in one order for the
		// engine and for the actions: it is let go only once the lock,
		// under which the action is emitted, is held again.
		s.mu.Unlock()
		t.resizing.Lock()
		ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
		err := t.t.Resize(ctx, uint(a.Cols), uint(a.Rows))
		cancel()
		s.mu.Lock()
		t.resizing.Unlock()
		if err != nil {
			return err.Error()
		}
		if s.terms[channel] != t {
			return fmt.Sprintf("terminal %.200q was disposed", channel)
		}
	case "terminal/claimed":
		if why := a.Claim.check(); why != "" {
			return why
		}
		// The holder of a client claim may change it. A session's
		// claim is held by no client; a client may only narrow it within
		// the session (detach a tool call's terminal to the background,
		// as the protocol's flow shows), never tie it to a turn or tool
		// call it was not tied to: that is the agent host's to say.
		cur, want := t.state.Claim, a.Claim
		holder := cur.Kind == "client" && cur.ClientID == origin.ClientID
		narrows := cur.Kind == "session" && want.Kind == "session" && want.Session == cur.Session &&
			(want.TurnID == "" || want.TurnID == cur.TurnID) && (want.ToolCallID == "" || want.ToolCallID == cur.ToolCallID)
		if !holder && !narrows {
			return fmt.Sprintf("only the holder of the claim may change it, and a session's claim may only be narrowed (held by %.200s %.200s%.200s)", cur.Kind, cur.ClientID, cur.Session)
		}
	case "terminal/titleChanged":
		if len(a.Title) > maxTitle {
			return fmt.Sprintf("title longer than %d bytes", maxTitle)
		}
	case "terminal/cleared":
	default:
		return fmt.Sprintf("%.200s cannot be dispatched by a client", a.Type)
	}
	// The echo to the client that sent it leaves from its reader.
	from.hold()
	s.emitLocked(channel, a, origin)
	if a.Type == "terminal/claimed" || a.Type == "terminal/titleChanged" {
		s.listedChangedLocked()
	}
	return ""
}
