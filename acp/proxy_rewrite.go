package acp

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"slices"

	"github.com/sandboxd/sandboxd/sandbox"
)

const (
	// embeddedBytes bounds the output the proxy keeps of finished
	// terminals shown in tool calls: once released, their buffers are
	// outside server.max_output_memory.
	embeddedBytes = 64 << 20
	// maxEmbedded bounds how many terminals shown in tool calls the proxy
	// keeps readable after the agent released them.
	maxEmbedded = 256
)

// maxAgentTerminals bounds how many of the agent's own terminals the proxy
// remembers.
const maxAgentTerminals = 4096

// toolCallKey names a tool call of a session.
type toolCallKey struct{ session, toolCall string }

// termKey names a terminal of a session.
type termKey struct{ session, terminal string }

// embeddedTerminal is a terminal shown in a tool call.
type embeddedTerminal struct {
	t *sandbox.Terminal
	// announced is true once the editor got the terminal's terminal_info
	// and so knows its id.
	announced bool
}

// rewriteInitialize tells the agent the client supports terminals, and
// remembers whether the editor renders terminal _meta; a contained agent
// is told of no fs capability, so that it reads and writes files in its
// container, not through the editor on the host. Every other field stays
// as the editor wrote it. It returns nil when it cannot rewrite.
func (p *Proxy) rewriteInitialize(line []byte) []byte {
	params, ok := memberValue(line, "params")
	if !ok || !isObject(params) {
		return nil
	}
	// Capabilities that are no object are what the agent reads as none
	// (x-deserialize-default-on-error): they become an object saying
	// terminals, so that the agent never falls back to running commands
	// itself, on the host.
	caps := []byte(`{"terminal":true}`)
	if given, ok := memberValue(params, "clientCapabilities"); ok && isObject(given) {
		var meta struct {
			TerminalOutput bool `json:"terminal_output"`
		}
		if raw, ok := memberValue(given, "_meta"); ok && json.Unmarshal(raw, &meta) == nil {
			p.mu.Lock()
			p.editorMeta = meta.TerminalOutput
			p.mu.Unlock()
		}
		var err error
		if caps, err = setMember(given, "terminal", []byte("true"), true); err != nil {
			return nil
		}
		if p.contained {
			if caps, err = deleteMember(caps, "fs", true); err != nil {
				return nil
			}
		}
	}
	// In every spelling an agent's parser may take for these members.
	params, err := setMember(params, "clientCapabilities", caps, true)
	if err != nil {
		return nil
	}
	out, err := setMember(line, "params", params, true)
	if err != nil {
		return nil
	}
	return out
}

// rewriteTerminals rewrites the terminals a session/update or a
// session/request_permission shows, as rewriteUpdate says. p.updates is
// held.
func (p *Proxy) rewriteTerminals(m message, body []byte) []byte {
	if m.Method == "session/request_permission" {
		return p.rewritePermission(body, m.Params)
	}
	return p.rewriteUpdate(body, m.Params)
}

// rewriteUpdate shows the editor the terminals embedded in a tool call of a
// session/update. The editor never created them, so their bare ids mean
// nothing to it. An editor that renders terminal _meta gets terminal_info
// on the tool call that first shows a terminal, then terminal_output and
// terminal_exit; any other gets text items holding the output, refreshed
// as it grows. It returns the new message, or nil to forward the agent's
// as it is. p.updates is held.
func (p *Proxy) rewriteUpdate(line []byte, params json.RawMessage) []byte {
	var n struct {
		SessionID string                     `json:"sessionId"`
		Update    map[string]json.RawMessage `json:"update"`
	}
	if json.Unmarshal(params, &n) != nil || n.Update == nil {
		return nil
	}
	var kind string
	if json.Unmarshal(n.Update["sessionUpdate"], &kind) != nil || (kind != "tool_call" && kind != "tool_call_update") {
		return nil
	}
	return p.rewriteToolCall(n.SessionID, kind, n.Update).rewrite(line, "update")
}

// rewritePermission shows the editor the terminals in the tool call a
// session/request_permission asks about, as a tool_call_update would:
// the editor shows that tool call while it asks. p.updates is held.
func (p *Proxy) rewritePermission(line []byte, params json.RawMessage) []byte {
	var r struct {
		SessionID string                     `json:"sessionId"`
		ToolCall  map[string]json.RawMessage `json:"toolCall"`
	}
	if json.Unmarshal(params, &r) != nil || r.ToolCall == nil {
		return nil
	}
	return p.rewriteToolCall(r.SessionID, "tool_call_update", r.ToolCall).rewrite(line, "toolCall")
}

// rewriteToolCall returns a tool call (update) of kind with its terminals
// shown as rewriteUpdate says, or nil to keep it as it is. p.updates is
// held.
func (p *Proxy) rewriteToolCall(sessionID, kind string, update map[string]json.RawMessage) toolCallRewrite {
	var callID string
	if json.Unmarshal(update["toolCallId"], &callID) != nil || callID == "" {
		return nil
	}
	// Also from an update without content: an agent may name its own
	// terminal in a tool call first and show it in a later update.
	p.noteAgentTerminals(sessionID, update["_meta"])
	key := toolCallKey{sessionID, callID}
	p.mu.Lock()
	w := p.textWatches[key]
	metaMode := p.editorMeta
	p.mu.Unlock()
	var content []json.RawMessage
	if raw, ok := update["content"]; !ok || string(raw) == "null" || json.Unmarshal(raw, &content) != nil {
		if kind == "tool_call_update" {
			return nil // a status change: the content, and its refreshes, stay
		}
		// A tool call sent again says all of itself: content it lacks
		// (or that is no array, which editors read as the default) is
		// none, and what showed the terminals is gone.
		content = nil
	}
	if w == nil && p.showsEnded(key, kind, content) {
		// The same ended terminals again: the editor has their final
		// output.
		delete(update, "content")
		return update
	}
	// Only sandboxd's terminals are rewritten, and any other the editor
	// cannot know of. Those the agent runs itself (claude-agent-acp's
	// Bash) and names in its own _meta, which the editor renders, go on
	// as the agent wrote them.
	var ids, unknown []string
	var terms []*sandbox.Terminal
	for _, item := range content {
		id, ok := terminalItem(item)
		if !ok {
			continue
		}
		if p.agentTerminal(sessionID, id) {
			continue
		}
		t := p.lookup(sessionID, id)
		if t == nil {
			p.log.Warn("tool call shows an unknown terminal", "session", sessionID, "terminal", id)
			unknown = append(unknown, id)
			continue
		}
		ids = append(ids, id)
		if !slices.Contains(terms, t) {
			p.remember(sessionID, t)
			terms = append(terms, t)
		}
	}
	p.showAnnounced(sessionID, callID, ids)
	if len(ids) == 0 && len(unknown) == 0 {
		if w != nil {
			w.setContent(nil, nil) // the agent replaced the terminals
		}
		return nil
	}
	if metaMode && w == nil && len(unknown) == 0 {
		// Zed creates its display terminal from the terminal_info of a
		// tool_call, one per tool call; later updates may name it freely.
		// A terminal the editor cannot know of takes the text path, which
		// makes it a note.
		if kind == "tool_call" && len(ids) == 1 && len(terms) == 1 {
			if out := p.announce(sessionID, callID, update, terms[0]); out != nil {
				return out
			}
		}
		if p.allAnnounced(sessionID, ids) {
			return nil
		}
	}
	if w == nil {
		w = &watch{p: p, sessionID: sessionID, toolCallID: callID, wake: make(chan struct{}, 1)}
		startWatch(p, p.textWatches, key, w)
	} else if kind == "tool_call_update" && sameItems(content, w.content) {
		// The same terminals again (a status change that repeats the
		// content): the editor keeps what it shows, which the watch
		// refreshes, rather than get all their output once more with
		// every update.
		if shown, ok := w.due(); ok {
			update["content"] = w.show(shown)
		} else {
			delete(update, "content")
		}
		return update
	}
	update["content"] = w.setContent(content, terms)
	return update
}

// toolCallRewrite is the new tool call object of a message.
type toolCallRewrite map[string]json.RawMessage

// rewrite returns line with params.member made u: the members u changes,
// adds or drops are edited in place, and every other byte of the message
// stays as the agent wrote it. It returns nil when u is nil or line has
// no such object.
func (u toolCallRewrite) rewrite(line []byte, member string) []byte {
	if u == nil {
		return nil
	}
	params, ok := memberValue(line, "params")
	if !ok {
		return nil
	}
	orig, ok := memberValue(params, member)
	if !ok {
		return nil
	}
	spans, err := objectMembers(orig)
	if err != nil {
		return nil
	}
	// A member changed or dropped is, in every spelling an editor's
	// parser may take for it: none reads the agent's old value.
	obj := orig
	for _, s := range spans {
		if _, keep := u[s.name]; !keep {
			if obj, err = deleteMember(obj, s.name, true); err != nil {
				return nil
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(u)) {
		if was, ok := memberValue(orig, name); ok && bytes.Equal(was, u[name]) {
			continue
		}
		if obj, err = setMember(obj, name, u[name], true); err != nil {
			return nil
		}
	}
	if params, err = setMember(params, member, obj, false); err != nil {
		return nil
	}
	out, err := setMember(line, "params", params, false)
	if err != nil {
		return nil
	}
	return out
}

// lookup finds a terminal of a session, also one the agent released after
// showing it in a tool call. It never waits for a container still
// starting, which has no terminals yet: it runs in the relay from the
// agent, with p.updates held.
func (p *Proxy) lookup(sessionID, terminalID string) *sandbox.Terminal {
	p.mu.Lock()
	e := p.embedded[termKey{sessionID, terminalID}]
	p.mu.Unlock()
	if e != nil {
		return e.t
	}
	now, cancel := context.WithCancel(p.ctx)
	cancel() // done: Session does not wait
	s, err := p.terms.scope.Session(now, sessionID)
	if err != nil {
		return nil
	}
	t, err := s.Terminal(terminalID)
	if err != nil {
		return nil
	}
	return t
}

// remember keeps a terminal shown in a tool call readable after release,
// as the protocol asks ("the Client displays live output ... even after the
// terminal is released"), forgetting the oldest finished ones beyond
// maxEmbedded, or beyond embeddedBytes of output.
func (p *Proxy) remember(sessionID string, t *sandbox.Terminal) {
	k := termKey{sessionID, t.ID}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.embedded[k]; ok {
		return
	}
	p.embedded[k] = &embeddedTerminal{t: t}
	p.embedOrder = append(p.embedOrder, k)
	held := 0
	for _, k := range p.embedOrder {
		if t := p.embedded[k].t; t.Exited() {
			held += t.Buffer().Held()
		}
	}
	for i := 0; (len(p.embedOrder) > maxEmbedded || held > embeddedBytes) && i < len(p.embedOrder); {
		old := p.embedOrder[i]
		if t := p.embedded[old].t; t.Exited() {
			held -= t.Buffer().Held()
			delete(p.embedded, old)
			p.embedOrder = append(p.embedOrder[:i], p.embedOrder[i+1:]...)
			continue
		}
		i++
	}
}

// terminalItem returns the terminal id of a {type: "terminal"} content item.
func terminalItem(item json.RawMessage) (string, bool) {
	var c struct {
		Type       string `json:"type"`
		TerminalID string `json:"terminalId"`
	}
	// One without an id names no terminal: editors skip it as invalid,
	// and it is left for them to.
	if json.Unmarshal(item, &c) != nil || c.Type != "terminal" || c.TerminalID == "" {
		return "", false
	}
	return c.TerminalID, true
}

// noteAgentTerminals remembers the terminals a session/update's _meta
// names: terminal_info, terminal_output and terminal_exit of the agent's
// own terminals.
func (p *Proxy) noteAgentTerminals(sessionID string, raw json.RawMessage) {
	// Member by member: _meta may hold anything else, of any type, and
	// one value that is no object must not hide the terminals.
	var meta map[string]json.RawMessage
	if len(raw) == 0 || json.Unmarshal(raw, &meta) != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, key := range []string{"terminal_info", "terminal_output", "terminal_exit"} {
		var v struct {
			TerminalID string `json:"terminal_id"`
		}
		if json.Unmarshal(meta[key], &v) != nil {
			continue
		}
		id := v.TerminalID
		k := termKey{sessionID, id}
		if id == "" || p.agentTerminals[k] {
			continue
		}
		p.agentTerminals[k] = true
		p.agentOrder = append(p.agentOrder, k)
		if len(p.agentOrder) > maxAgentTerminals {
			delete(p.agentTerminals, p.agentOrder[0])
			p.agentOrder = p.agentOrder[1:]
		}
	}
}

// agentTerminal reports whether the agent named terminal id of a session
// in its own _meta.
func (p *Proxy) agentTerminal(sessionID, id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.agentTerminals[termKey{sessionID, id}]
}

// announce adds terminal_info to a tool call and starts streaming the
// terminal's output as terminal_output and terminal_exit.
func (p *Proxy) announce(sessionID, callID string, update map[string]json.RawMessage, t *sandbox.Terminal) toolCallRewrite {
	meta := []byte("{}")
	if raw, ok := update["_meta"]; ok && string(raw) != "null" {
		if !isObject(raw) {
			return nil
		}
		meta = raw
	}
	cwd := t.Command().Cwd
	if cwd == "" {
		p.mu.Lock()
		cwd = p.specs[sessionID].Workspace
		p.mu.Unlock()
	}
	info, err := marshal(terminalInfo{TerminalID: t.ID, Cwd: cwd})
	if err != nil {
		return nil
	}
	out := make(toolCallRewrite, len(update))
	for k, v := range update {
		out[k] = v
	}
	if out["_meta"], err = setMember(meta, "terminal_info", info, false); err != nil {
		return nil
	}
	key := termKey{sessionID, t.ID}
	p.mu.Lock()
	_, running := p.metaWatches[key]
	if e := p.embedded[key]; e != nil {
		e.announced = true
	}
	p.mu.Unlock()
	if !running {
		startWatch(p, p.metaWatches, key, &watch{p: p, sessionID: sessionID, toolCallID: callID, term: t, wake: make(chan struct{}, 1)})
	}
	return out
}

// sameItems reports whether two contents are the same, item by item, byte
// for byte.
func sameItems(a, b []json.RawMessage) bool {
	return slices.EqualFunc(a, b, func(x, y json.RawMessage) bool { return bytes.Equal(x, y) })
}

// allAnnounced reports whether the editor knows every one of the terminals
// from terminal_info.
func (p *Proxy) allAnnounced(sessionID string, ids []string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		if e := p.embedded[termKey{sessionID, id}]; e == nil || !e.announced {
			return false
		}
	}
	return true
}

// maxExecCalls bounds the execute tool calls noteExec follows.
const maxExecCalls = 1024

// noteExec warns, once, when the agent shows it runs commands itself, on
// the host: a tool call of kind execute that names a terminal of its own
// (claude-agent-acp's terminal_info), or that ends without ever having
// shown a terminal of sandboxd's. A contained agent's commands are in its
// container anyway.
func (p *Proxy) noteExec(body []byte) {
	if p.contained || p.warnedExec.Load() || !containsAny(body, "tool_call") {
		return
	}
	var n struct {
		Method string `json:"method"`
		Params struct {
			SessionID string `json:"sessionId"`
			Update    struct {
				SessionUpdate string            `json:"sessionUpdate"`
				ToolCallID    string            `json:"toolCallId"`
				Kind          string            `json:"kind"`
				Status        string            `json:"status"`
				Content       []json.RawMessage `json:"content"`
				Meta          map[string]any    `json:"_meta"`
			} `json:"update"`
		} `json:"params"`
	}
	if json.Unmarshal(body, &n) != nil || n.Method != "session/update" {
		return
	}
	u := n.Params.Update
	key := toolCallKey{n.Params.SessionID, u.ToolCallID}
	p.mu.Lock()
	followed := p.execCalls[key]
	p.mu.Unlock()
	if u.SessionUpdate != "tool_call" && !followed || u.SessionUpdate == "tool_call" && u.Kind != "execute" {
		return
	}
	for _, item := range u.Content {
		if id, ok := terminalItem(item); ok && p.lookup(key.session, id) != nil {
			p.mu.Lock()
			delete(p.execCalls, key)
			p.mu.Unlock()
			return
		}
	}
	_, own := u.Meta["terminal_info"]
	if own || u.Status == "completed" || u.Status == "failed" {
		if p.warnedExec.CompareAndSwap(false, true) {
			p.log.Warn("this agent runs commands itself, on the host and outside any sandbox: a tool call of kind execute ran with no terminal of sandboxd's; `sandboxd wrap --contain` runs the agent itself in the container", "session", key.session, "tool_call", key.toolCall)
		}
		p.mu.Lock()
		clear(p.execCalls)
		p.mu.Unlock()
		return
	}
	p.mu.Lock()
	if followed || len(p.execCalls) < maxExecCalls {
		p.execCalls[key] = true
	}
	p.mu.Unlock()
}
