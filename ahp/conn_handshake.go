package ahp

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
)

// initializeParams are initialize's params, read before the server lock.
type initializeParams struct {
	ProtocolVersions     []string `json:"protocolVersions"`
	ClientID             string   `json:"clientId"`
	InitialSubscriptions []string `json:"initialSubscriptions"`
}

func parseInitialize(params json.RawMessage) (initializeParams, *rpcError) {
	var p initializeParams
	if err := json.Unmarshal(params, &p); err != nil {
		return p, invalid("initialize: %v", err)
	}
	if p.ClientID == "" {
		return p, invalid("initialize: clientId is required")
	}
	if len(p.ClientID) > maxURI {
		// It is copied into the origin of every action the client sends.
		return p, invalid("initialize: clientId longer than %d bytes", maxURI)
	}
	p.InitialSubscriptions = distinct(p.InitialSubscriptions)
	return p, nil
}

// distinct returns channels without repeats, in their order: a channel
// named many times gets one snapshot, not an answer that multiplies it.
func distinct(channels []string) []string {
	seen := make(map[string]bool, len(channels))
	out := channels[:0]
	for _, ch := range channels {
		if !seen[ch] {
			seen[ch] = true
			out = append(out, ch)
		}
	}
	return out
}

// initializeLocked answers initialize. s.mu must be held.
func (c *conn) initializeLocked(p initializeParams) (any, *rpcError) {
	version := negotiate(p.ProtocolVersions)
	if version == "" {
		return nil, &rpcError{Code: jsonrpc.UnsupportedProtocolVersion, Message: fmt.Sprintf("none of the protocol versions %.200s is spoken here (%s)", fmt.Sprint(p.ProtocolVersions), strings.Join(supportedVersions(), ", ")), Data: map[string]any{"supportedVersions": supportedVersions()}}
	}
	s := c.s
	c.mu.Lock()
	c.clientID = p.ClientID
	c.mu.Unlock()
	snaps := []any{}
	for _, ch := range p.InitialSubscriptions {
		if snap, ok := s.snapshotLocked(ch); ok {
			c.mu.Lock()
			c.subs[ch] = true
			c.mu.Unlock()
			snaps = append(snaps, snap)
		}
	}
	return map[string]any{"protocolVersion": version, "serverSeq": s.seq, "snapshots": snaps, "defaultDirectory": fileURI(s.cfg.Workspace)}, nil
}

// supportedVersions returns the protocol versions spoken, newest first.
func supportedVersions() []string { return []string{"0.4.0", "0.3.0"} }

// negotiate picks the version a connection speaks from those a client
// offers: the highest one compatible with one spoken here, "" when there
// is none. As SemVer's caret ranges read a 0.x version, 0.4.2 speaks with
// 0.4.0 (a patch changes no wire format) but not with 0.5.0.
func negotiate(offered []string) string {
	best, bestKey := "", [3]int{-1}
	for _, v := range offered {
		key, ok := parseVersion(v)
		if !ok {
			continue
		}
		for _, s := range supportedVersions() {
			if have, _ := parseVersion(s); have[0] == key[0] && (key[0] > 0 || have[1] == key[1]) && slices.Compare(key[:], have[:]) >= 0 {
				if slices.Compare(key[:], bestKey[:]) > 0 {
					best, bestKey = v, key
				}
			}
		}
	}
	return best
}

// parseVersion reads a release version, major.minor.patch, each a number
// without a leading zero.
func parseVersion(v string) ([3]int, bool) {
	var key [3]int
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return key, false
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || p != strconv.Itoa(n) || n > 1<<20 {
			return key, false
		}
		key[i] = n
	}
	return key, true
}

// subscribeParams are the params of subscribe and unsubscribe.
type subscribeParams struct {
	Channel string `json:"channel"`
}

func parseSubscribe(method string, params json.RawMessage) (subscribeParams, *rpcError) {
	var p subscribeParams
	if err := json.Unmarshal(params, &p); err != nil || p.Channel == "" {
		return p, invalid("%s: channel is required", method)
	}
	return p, nil
}

// subscribeLocked answers subscribe. s.mu must be held.
func (c *conn) subscribeLocked(p subscribeParams) (any, *rpcError) {
	s := c.s
	snap, ok := s.snapshotLocked(p.Channel)
	if !ok {
		return nil, &rpcError{Code: jsonrpc.NotFound, Message: fmt.Sprintf("subscribe: unknown channel %.200q", p.Channel)}
	}
	c.mu.Lock()
	c.subs[p.Channel] = true
	c.mu.Unlock()
	return map[string]any{"snapshot": snap}, nil
}

// reconnectParams are reconnect's params, read before the server lock.
type reconnectParams struct {
	ClientID          string   `json:"clientId"`
	LastSeenServerSeq int64    `json:"lastSeenServerSeq"`
	Subscriptions     []string `json:"subscriptions"`
}

func parseReconnect(params json.RawMessage) (reconnectParams, *rpcError) {
	var p reconnectParams
	if err := json.Unmarshal(params, &p); err != nil || p.ClientID == "" {
		return p, invalid("reconnect: clientId, lastSeenServerSeq and subscriptions are required")
	}
	if len(p.ClientID) > maxURI {
		return p, invalid("reconnect: clientId longer than %d bytes", maxURI)
	}
	p.Subscriptions = distinct(p.Subscriptions)
	return p, nil
}

// reconnectLocked answers reconnect. s.mu must be held.
func (c *conn) reconnectLocked(p reconnectParams) (any, *rpcError) {
	s := c.s
	c.mu.Lock()
	c.clientID = p.ClientID
	missing := []string{}
	live := map[string]bool{}
	for _, ch := range p.Subscriptions {
		if s.servedLocked(ch) {
			c.subs[ch] = true
			live[ch] = true
		} else {
			missing = append(missing, ch)
		}
	}
	c.mu.Unlock()
	oldest := s.seq + 1
	if len(s.replay) > 0 {
		oldest = s.replay[0].ServerSeq
	}
	// A replay is right only for a subscription that has had every action
	// of its terminal since its snapshot. The client may list instead a
	// subscription to another terminal, disposed, whose URI a new one has
	// taken: dispose ends the subscriptions to it without telling their
	// clients, and nothing in reconnect tells such a subscription from
	// one to the new terminal. So a terminal made after all the client
	// heard (which it cannot have subscribed to), or under a URI that had
	// one disposed before it, gets snapshots.
	fresh := false
	for ch := range live {
		if t, ok := s.terms[ch]; ok && (t.since >= p.LastSeenServerSeq || s.disposedLocked(ch)) {
			fresh = true
		}
	}
	if !fresh && p.LastSeenServerSeq+1 >= oldest && p.LastSeenServerSeq <= s.seq {
		actions := []Envelope{}
		for _, env := range s.replay {
			// A rejection is the business of the client that sent it.
			mine := env.RejectionReason == "" || env.Origin != nil && env.Origin.ClientID == p.ClientID
			if env.ServerSeq > p.LastSeenServerSeq && live[env.Channel] && mine {
				actions = append(actions, env)
			}
		}
		return map[string]any{"type": "replay", "actions": actions, "missing": missing}, nil
	}
	snaps := []any{}
	for ch := range live {
		snap, _ := s.snapshotLocked(ch)
		snaps = append(snaps, snap)
	}
	return map[string]any{"type": "snapshot", "snapshots": snaps}, nil
}
