package ahp

import (
	"encoding/json"
	"hash/maphash"
	"slices"
	"strings"
	"time"
)

// Envelope carries an action on a channel.
type Envelope struct {
	Channel         string  `json:"channel"`
	Action          Action  `json:"action"`
	ServerSeq       int64   `json:"serverSeq"`
	Origin          *Origin `json:"origin,omitempty"`
	RejectionReason string  `json:"rejectionReason,omitempty"`
	// RawAction, when set, is the action as the client sent it, echoed
	// in place of Action: a rejected action may not decode as one.
	RawAction json.RawMessage `json:"-"`
}

// MarshalJSON writes RawAction as the action when it is set.
func (e Envelope) MarshalJSON() ([]byte, error) {
	type plain Envelope // without this method
	if e.RawAction == nil {
		return json.Marshal(plain(e))
	}
	return json.Marshal(struct {
		plain
		Action json.RawMessage `json:"action"`
	}{plain(e), e.RawAction})
}

// size is what the replay counts an envelope as: its action, and the
// client's id and the reason it carries. A rejection counts its channel
// too: it may name none that exists, in as many bytes as a message holds.
func (e Envelope) size() int {
	n := e.Action.size()
	if e.RawAction != nil {
		n = 64 + len(e.RawAction) + len(e.Channel)
	}
	if e.Origin != nil {
		n += len(e.Origin.ClientID)
	}
	return n + len(e.RejectionReason)
}

// Origin names the client that dispatched an action.
type Origin struct {
	ClientID  string `json:"clientId"`
	ClientSeq int64  `json:"clientSeq"`
}

// emit applies an action to its channel's state, numbers it and sends it to
// every subscriber, all under one lock, so every client sees the same
// actions in the same order.
func (s *Server) emit(channel string, a Action, origin *Origin) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.emitLocked(channel, a, origin)
}

func (s *Server) emitLocked(channel string, a Action, origin *Origin) {
	if channel == RootURI {
		s.root = ReduceRoot(s.root, a)
	} else if t, ok := s.terms[channel]; ok {
		switch a.Type {
		case "terminal/data":
			t.appendData(a.Data, s.cfg.MaxContent)
		default:
			// Only what changes the content needs the data before it in
			// place: folding it for every other action (the input of
			// each key) copied the last content part, up to the cap,
			// under the server's lock.
			switch a.Type {
			case "terminal/commandExecuted", "terminal/commandFinished", "terminal/cleared":
				t.fold(s.cfg.MaxContent)
			}
			reduceTerminal(&t.state, a)
			if a.Type == "terminal/commandExecuted" {
				TrimContent(&t.state, s.cfg.MaxContent)
			}
		}
	} else {
		return
	}
	s.seq++
	s.publishLocked(Envelope{Channel: channel, Action: a, ServerSeq: s.seq, Origin: origin})
}

// rejectLocked numbers a client's action that did not take effect and
// echoes it with the reason, as the action it sent, to that client alone,
// which drops its optimistic copy. A reconnect of the same client replays
// it. s.mu must be held.
func (s *Server) rejectLocked(from *conn, channel string, raw json.RawMessage, origin *Origin, reason string) {
	if len(raw) == 0 {
		raw = json.RawMessage("null")
	}
	s.seq++
	env := Envelope{Channel: channel, RawAction: raw, ServerSeq: s.seq, Origin: origin, RejectionReason: reason}
	s.keepLocked(env)
	// Not to the others: they saw nothing applied and have nothing to
	// revert, and sending them what a client made up, which may not even
	// decode as an action, would only let it break them.
	from.hold() // the echo leaves from the client's reader
	from.send(notification("action", env))
}

// publishLocked keeps env for replay and sends it to the channel's
// subscribers. s.mu must be held.
func (s *Server) publishLocked(env Envelope) {
	s.keepLocked(env)
	var msg []byte
	for c := range s.conns {
		if c.subscribed(env.Channel) {
			if msg == nil {
				msg = notification("action", env)
			}
			c.send(msg)
		}
	}
}

// keepLocked keeps env for replay, within the replay's bounds. s.mu must
// be held.
func (s *Server) keepLocked(env Envelope) {
	s.replay = append(s.replay, env)
	s.replayBytes += env.size()
	if len(s.replay) > s.cfg.ReplayActions || s.replayBytes > s.cfg.ReplayBytes {
		// Drop at least a quarter, so the copy is paid rarely; a reconnect
		// from before what is kept gets snapshots.
		drop, quarter := 0, len(s.replay)/4
		for drop < len(s.replay)-1 && (drop < quarter || len(s.replay)-drop > s.cfg.ReplayActions || s.replayBytes > s.cfg.ReplayBytes) {
			s.replayBytes -= s.replay[drop].size()
			drop++
		}
		s.replay = slices.Delete(s.replay, 0, drop)
	}
}

// disposedBit returns where in s.disposed the bit of uri is.
func (s *Server) disposedBit(uri string) (word int, bit uint64) {
	h := maphash.String(s.seed, uri) % uint64(64*len(s.disposed))
	return int(h / 64), 1 << (h % 64)
}

// disposedLocked reports whether a terminal under uri may have been
// disposed. s.mu must be held.
func (s *Server) disposedLocked(uri string) bool {
	w, b := s.disposedBit(uri)
	return s.disposed[w]&b != 0
}

// removeLocked takes a terminal out of the list and ends the subscriptions
// to it. s.mu must be held.
func (s *Server) removeLocked(t *terminal) {
	delete(s.terms, t.uri)
	for c := range s.conns {
		c.mu.Lock()
		delete(c.subs, t.uri)
		c.mu.Unlock()
	}
	w, b := s.disposedBit(t.uri)
	s.disposed[w] |= b
	s.terminalsChangedLocked()
}

// listInterval is the least time between two lists of the terminals that
// title or claim changes publish: a program setting its title in a loop
// would otherwise send every root subscriber the whole list per change.
const listInterval = 200 * time.Millisecond

// listedChangedLocked publishes the terminal catalogue after a title or
// claim changed: at once when none went out for listInterval, else once
// that has passed, with whatever changed meanwhile. s.mu must be held.
func (s *Server) listedChangedLocked() {
	if s.listDue {
		return
	}
	wait := listInterval - time.Since(s.listedAt)
	if wait <= 0 {
		s.terminalsChangedLocked()
		return
	}
	s.listDue = true
	s.listTimer = time.AfterFunc(wait, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.listDue && !s.closing {
			s.terminalsChangedLocked()
		}
	})
}

// terminalsChanged publishes the terminal catalogue. s.mu must be held.
func (s *Server) terminalsChangedLocked() {
	s.listDue, s.listedAt = false, time.Now()
	list := make([]TerminalInfo, 0, len(s.terms))
	for uri, t := range s.terms {
		if t.t == nil {
			continue // still starting
		}
		list = append(list, TerminalInfo{Resource: uri, Title: t.state.Title, Claim: t.state.Claim, ExitCode: t.state.ExitCode})
	}
	slices.SortFunc(list, func(a, b TerminalInfo) int { return strings.Compare(a.Resource, b.Resource) })
	s.emitLocked(RootURI, Action{Type: "root/terminalsChanged", Terminals: list}, nil)
}

// servedLocked reports whether channel is one a client can subscribe to.
// s.mu must be held.
func (s *Server) servedLocked(channel string) bool {
	t, ok := s.terms[channel]
	return channel == RootURI || ok && t.t != nil
}

// snapshot is a channel's state as a subscription starts from it.
type snapshot struct {
	Resource string `json:"resource"`
	State    any    `json:"state"`
	FromSeq  int64  `json:"fromSeq"`
	// size is about what the state holds.
	size int
}

// snapshotLocked returns a channel's state, with its own copy of what the
// server changes in place, so that it can be encoded after the lock is
// let go. s.mu must be held.
func (s *Server) snapshotLocked(channel string) (snapshot, bool) {
	if !s.servedLocked(channel) {
		return snapshot{}, false
	}
	snap := snapshot{Resource: channel, FromSeq: s.seq}
	if channel == RootURI {
		root := s.root
		root.Terminals = slices.Clone(root.Terminals)
		snap.State = root
		for _, t := range root.Terminals {
			snap.size += len(t.Resource) + len(t.Title) + len(t.Claim.ClientID) + len(t.Claim.Session) + PartOverhead
		}
	} else {
		t := s.terms[channel]
		t.fold(s.cfg.MaxContent)
		state := t.state
		state.Content = slices.Clone(state.Content)
		snap.State = state
		for _, p := range state.Content {
			snap.size += partSize(p)
		}
	}
	return snap, true
}

func notification(method string, params any) []byte {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params})
	return b
}
