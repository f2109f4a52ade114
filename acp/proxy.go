package acp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/sandboxd/sandboxd/sandbox"
)

// refreshInterval bounds how often live terminal output is pushed to the
// editor.
const refreshInterval = 100 * time.Millisecond

// Proxy relays ACP between an editor and an agent, byte for byte, except
// that it tells the agent the client supports terminals, answers the
// agent's terminal/* requests itself in the session's container, prepares a
// container for every session the agent opens, and shows embedded terminals
// to the editor, which never created them, as live output.
type Proxy struct {
	terms  *Terminals
	editor *LineStream // reads the editor's messages, writes to the editor
	agent  *LineStream // reads the agent's messages, writes to the agent
	log    *slog.Logger

	mu sync.Mutex
	// sessionCalls are editor requests whose answer names a session:
	// session/new, session/load, session/resume, session/close.
	sessionCalls map[string]sessionCall
	// agentCalls are the agent's terminal requests in flight, by id, so a
	// $/cancel_request for one of them stops it here.
	agentCalls map[string]context.CancelFunc
	// editorMeta is true when the editor renders terminals from the
	// terminal_info/terminal_output/terminal_exit _meta of tool calls.
	editorMeta bool
	watches    map[string]*watch // by session and tool call, or terminal
	wg         sync.WaitGroup
	ctx        context.Context
}

type sessionCall struct {
	method string
	params json.RawMessage
}

// NewProxy returns a proxy between an editor and an agent connection.
func NewProxy(terms *Terminals, editor, agent io.ReadWriteCloser, log *slog.Logger) *Proxy {
	return &Proxy{
		terms:        terms,
		editor:       NewLineStream(editor, log),
		agent:        NewLineStream(agent, log),
		log:          log,
		sessionCalls: make(map[string]sessionCall),
		agentCalls:   make(map[string]context.CancelFunc),
		watches:      make(map[string]*watch),
	}
}

// message is what the proxy needs to know of a JSON-RPC message.
type message struct {
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  json.RawMessage `json:"error,omitempty"`
}

func (m message) isRequest() bool  { return m.Method != "" && len(m.ID) > 0 && string(m.ID) != "null" }
func (m message) isResponse() bool { return m.Method == "" && len(m.ID) > 0 }

// Run relays until either side ends. It returns which side ended first:
// errEditorClosed when the editor closed its end, errAgentClosed when the
// agent did.
func (p *Proxy) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p.ctx = ctx
	ended := make(chan error, 2)
	go func() { ended <- p.fromEditor(ctx) }()
	go func() { ended <- p.fromAgent(ctx) }()
	err := <-ended
	cancel()
	p.mu.Lock()
	for _, c := range p.agentCalls {
		c()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// ErrEditorClosed and ErrAgentClosed say which side ended a proxy.
var (
	ErrEditorClosed = errors.New("editor closed the connection")
	ErrAgentClosed  = errors.New("agent closed the connection")
)

func (p *Proxy) fromEditor(ctx context.Context) error {
	for {
		line, err := p.editor.ReadLine()
		if errors.Is(err, errTooLong) {
			p.log.Warn("dropped an over-long message from the editor")
			continue
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				p.log.Warn("read from editor", "err", err)
			}
			return ErrEditorClosed
		}
		var m message
		if json.Unmarshal(line, &m) == nil {
			switch m.Method {
			case "initialize":
				if m.isRequest() {
					line = p.rewriteInitialize(line)
				}
			case "session/new", "session/load", "session/resume", "session/close":
				if m.isRequest() {
					p.mu.Lock()
					p.sessionCalls[string(m.ID)] = sessionCall{method: m.Method, params: m.Params}
					p.mu.Unlock()
				}
			}
		}
		if err := p.agent.WriteLine(line); err != nil {
			return ErrAgentClosed
		}
	}
}

func (p *Proxy) fromAgent(ctx context.Context) error {
	for {
		line, err := p.agent.ReadLine()
		if errors.Is(err, errTooLong) {
			p.log.Warn("dropped an over-long message from the agent")
			continue
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				p.log.Warn("read from agent", "err", err)
			}
			return ErrAgentClosed
		}
		var m message
		if err := json.Unmarshal(line, &m); err != nil {
			p.log.Warn("dropped a line from the agent that is not JSON", "line", truncate(line, 200))
			continue
		}
		switch {
		case m.isRequest() && IsTerminalMethod(m.Method):
			p.answerTerminal(ctx, m)
			continue
		case m.Method == MethodCancel && p.cancelAgentCall(m.Params):
			continue
		case m.isResponse():
			p.sessionAnswered(m)
		case m.Method == "session/update":
			line = p.rewriteUpdate(line, m.Params)
		}
		if err := p.editor.WriteLine(line); err != nil {
			return ErrEditorClosed
		}
	}
}

// rewriteInitialize tells the agent the client supports terminals, and
// remembers whether the editor renders terminal _meta. Every other field
// stays as the editor wrote it.
func (p *Proxy) rewriteInitialize(line []byte) []byte {
	var msg map[string]json.RawMessage
	if json.Unmarshal(line, &msg) != nil {
		return line
	}
	var params map[string]json.RawMessage
	if json.Unmarshal(msg["params"], &params) != nil {
		return line
	}
	var caps map[string]json.RawMessage
	if raw, ok := params["clientCapabilities"]; ok && json.Unmarshal(raw, &caps) != nil {
		return line
	}
	if caps == nil {
		caps = map[string]json.RawMessage{}
	}
	var meta struct {
		TerminalOutput bool `json:"terminal_output"`
	}
	if raw, ok := caps["_meta"]; ok && json.Unmarshal(raw, &meta) == nil {
		p.mu.Lock()
		p.editorMeta = meta.TerminalOutput
		p.mu.Unlock()
	}
	caps["terminal"] = json.RawMessage("true")
	var err error
	if params["clientCapabilities"], err = json.Marshal(caps); err != nil {
		return line
	}
	if msg["params"], err = json.Marshal(params); err != nil {
		return line
	}
	out, err := json.Marshal(msg)
	if err != nil {
		return line
	}
	return out
}

// answerTerminal answers a terminal request of the agent in the session's
// container, in the background: wait_for_exit may take long.
func (p *Proxy) answerTerminal(ctx context.Context, m message) {
	key := string(m.ID)
	rctx, cancel := context.WithCancel(ctx)
	p.mu.Lock()
	p.agentCalls[key] = cancel
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer func() {
			p.mu.Lock()
			delete(p.agentCalls, key)
			p.mu.Unlock()
			cancel()
		}()
		res, err := p.terms.Handle(rctx, m.Method, m.Params)
		reply := map[string]any{"jsonrpc": "2.0", "id": m.ID}
		if err != nil {
			var re *jsonrpc2.Error
			if !errors.As(err, &re) {
				re = &jsonrpc2.Error{Code: CodeInternal, Message: err.Error()}
			}
			reply["error"] = re
		} else {
			reply["result"] = res
		}
		if err := p.agent.WriteObject(reply); err != nil {
			p.log.Debug("reply to agent", "method", m.Method, "err", err)
		}
	}()
}

func (p *Proxy) cancelAgentCall(params json.RawMessage) bool {
	var c struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	if json.Unmarshal(params, &c) != nil {
		return false
	}
	p.mu.Lock()
	cancel, ok := p.agentCalls[string(c.RequestID)]
	p.mu.Unlock()
	if ok {
		cancel()
	}
	return ok
}

// sessionAnswered prepares the container of a session the agent opened,
// loaded or resumed, and removes the container of one it closed.
func (p *Proxy) sessionAnswered(m message) {
	p.mu.Lock()
	call, ok := p.sessionCalls[string(m.ID)]
	delete(p.sessionCalls, string(m.ID))
	p.mu.Unlock()
	if !ok || len(m.Error) > 0 {
		return
	}
	var req struct {
		SessionID string   `json:"sessionId"`
		Cwd       string   `json:"cwd"`
		Dirs      []string `json:"additionalDirectories"`
	}
	if json.Unmarshal(call.params, &req) != nil {
		return
	}
	if call.method == "session/close" {
		if err := p.terms.CloseSession(p.ctx, req.SessionID); err != nil && rpcError(p.ctx, err).Code != CodeResourceMissing {
			p.log.Warn("close session", "session", req.SessionID, "err", err)
		}
		return
	}
	if call.method == "session/new" {
		var res struct {
			SessionID string `json:"sessionId"`
		}
		if json.Unmarshal(m.Result, &res) != nil || res.SessionID == "" {
			return
		}
		req.SessionID = res.SessionID
	}
	if req.SessionID == "" || req.Cwd == "" {
		return
	}
	p.terms.Prepare(sandbox.SessionSpec{ID: req.SessionID, Workspace: req.Cwd, ExtraDirs: req.Dirs})
}

func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "..."
}

// rewriteUpdate shows the editor the terminals embedded in a tool call. The
// editor never created them, so their bare ids mean nothing to it: with
// terminal _meta support the update gets terminal_info and output follows
// as terminal_output/terminal_exit; without, each terminal item becomes a
// text item holding its output, refreshed as output arrives.
func (p *Proxy) rewriteUpdate(line []byte, params json.RawMessage) []byte {
	if !bytes.Contains(params, []byte(`"terminal"`)) {
		return line
	}
	var n struct {
		SessionID string                     `json:"sessionId"`
		Update    map[string]json.RawMessage `json:"update"`
	}
	if json.Unmarshal(params, &n) != nil || n.Update == nil {
		return line
	}
	var kind, toolCallID string
	json.Unmarshal(n.Update["sessionUpdate"], &kind)
	json.Unmarshal(n.Update["toolCallId"], &toolCallID)
	if (kind != "tool_call" && kind != "tool_call_update") || toolCallID == "" {
		return line
	}
	var content []json.RawMessage
	if json.Unmarshal(n.Update["content"], &content) != nil {
		return line
	}
	var terms []*sandbox.Terminal
	for _, item := range content {
		var c struct {
			Type       string `json:"type"`
			TerminalID string `json:"terminalId"`
		}
		if json.Unmarshal(item, &c) != nil || c.Type != "terminal" {
			continue
		}
		t := p.lookup(n.SessionID, c.TerminalID)
		if t == nil {
			p.log.Warn("tool call embeds an unknown terminal", "session", n.SessionID, "terminal", c.TerminalID)
		}
		terms = append(terms, t)
	}
	if len(terms) == 0 {
		return line
	}
	p.mu.Lock()
	metaMode := p.editorMeta
	p.mu.Unlock()
	var out []byte
	if metaMode {
		out = p.withTerminalInfo(n.SessionID, toolCallID, n.Update, terms)
	} else {
		out = p.withTextContent(n.SessionID, toolCallID, n.Update, content)
	}
	if out == nil {
		return line
	}
	var msg map[string]json.RawMessage
	if json.Unmarshal(line, &msg) != nil {
		return line
	}
	var np map[string]json.RawMessage
	if json.Unmarshal(msg["params"], &np) != nil {
		return line
	}
	np["update"] = out
	var err error
	if msg["params"], err = json.Marshal(np); err != nil {
		return line
	}
	if line, err = json.Marshal(msg); err != nil {
		return line
	}
	return line
}

func (p *Proxy) lookup(sessionID, terminalID string) *sandbox.Terminal {
	s, err := p.terms.Session(p.ctx, sessionID)
	if err != nil {
		return nil
	}
	t, err := s.Terminal(terminalID)
	if err != nil {
		return nil
	}
	return t
}

// withTerminalInfo adds _meta.terminal_info for the first terminal of the
// update and starts streaming each terminal's output to the editor.
func (p *Proxy) withTerminalInfo(sessionID, toolCallID string, update map[string]json.RawMessage, terms []*sandbox.Terminal) json.RawMessage {
	var first *sandbox.Terminal
	for _, t := range terms {
		if t == nil {
			continue
		}
		if first == nil {
			first = t
		}
		p.watch("t\x00"+t.ID, func() *watch {
			return &watch{p: p, sessionID: sessionID, toolCallID: toolCallID, term: t, meta: true}
		})
	}
	if first == nil {
		return nil
	}
	meta := map[string]json.RawMessage{}
	if raw, ok := update["_meta"]; ok {
		json.Unmarshal(raw, &meta)
	}
	info, _ := json.Marshal(map[string]string{"terminal_id": first.ID, "cwd": first.Command().Cwd})
	meta["terminal_info"] = info
	update["_meta"], _ = json.Marshal(meta)
	out, err := json.Marshal(update)
	if err != nil {
		return nil
	}
	return out
}

// withTextContent replaces each terminal item by a text item with its
// output so far, and keeps the tool call's content fresh from then on.
func (p *Proxy) withTextContent(sessionID, toolCallID string, update map[string]json.RawMessage, content []json.RawMessage) json.RawMessage {
	key := "c\x00" + sessionID + "\x00" + toolCallID
	w := p.watch(key, func() *watch {
		return &watch{p: p, sessionID: sessionID, toolCallID: toolCallID}
	})
	w.setContent(content)
	items := w.render()
	update["content"], _ = json.Marshal(items)
	out, err := json.Marshal(update)
	if err != nil {
		return nil
	}
	return out
}

// watch returns the watch under key, starting a new one made by mk when
// there is none.
func (p *Proxy) watch(key string, mk func() *watch) *watch {
	p.mu.Lock()
	defer p.mu.Unlock()
	if w, ok := p.watches[key]; ok {
		return w
	}
	w := mk()
	p.watches[key] = w
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		w.run(p.ctx)
		p.mu.Lock()
		delete(p.watches, key)
		p.mu.Unlock()
	}()
	return w
}

// watch streams the output of embedded terminals to the editor as
// tool_call_update notifications, at most every refreshInterval and once
// more when the command exits.
type watch struct {
	p          *Proxy
	sessionID  string
	toolCallID string

	// meta mode: one terminal, sent as terminal_output deltas.
	meta bool
	term *sandbox.Terminal
	sent int64
	tail []byte // an incomplete UTF-8 sequence held back

	// content mode: the tool call's content with terminals in it.
	mu      sync.Mutex
	content []json.RawMessage
	terms   []*sandbox.Terminal
}

func (w *watch) setContent(content []json.RawMessage) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.content = content
	w.terms = w.terms[:0]
	for _, item := range content {
		var c struct {
			Type       string `json:"type"`
			TerminalID string `json:"terminalId"`
		}
		if json.Unmarshal(item, &c) == nil && c.Type == "terminal" {
			if t := w.p.lookup(w.sessionID, c.TerminalID); t != nil {
				w.terms = append(w.terms, t)
			}
		}
	}
}

// render returns the content with every terminal item replaced by its
// current output.
func (w *watch) render() []json.RawMessage {
	w.mu.Lock()
	defer w.mu.Unlock()
	items := make([]json.RawMessage, 0, len(w.content))
	for _, item := range w.content {
		var c struct {
			Type       string `json:"type"`
			TerminalID string `json:"terminalId"`
		}
		if json.Unmarshal(item, &c) != nil || c.Type != "terminal" {
			items = append(items, item)
			continue
		}
		text := "(terminal " + c.TerminalID + " is not known to sandboxd)"
		if t := w.p.lookup(w.sessionID, c.TerminalID); t != nil {
			text = terminalText(t)
		} else {
			for _, t := range w.terms {
				if t.ID == c.TerminalID {
					text = terminalText(t)
				}
			}
		}
		b, _ := json.Marshal(map[string]any{"type": "content", "content": map[string]string{"type": "text", "text": text}})
		items = append(items, b)
	}
	return items
}

// terminalText is a terminal's output for a text item, with its exit status
// once it has exited.
func terminalText(t *sandbox.Terminal) string {
	out, truncated, st := t.Output()
	text := string(out)
	if truncated {
		text = "[earlier output truncated]\n" + text
	}
	if st != nil {
		switch {
		case st.Signal != nil:
			text += fmt.Sprintf("\n[killed by %s]", *st.Signal)
		case st.ExitCode != nil:
			text += fmt.Sprintf("\n[exit code %d]", *st.ExitCode)
		}
	}
	return text
}

func (w *watch) terminals() []*sandbox.Terminal {
	if w.meta {
		return []*sandbox.Terminal{w.term}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*sandbox.Terminal(nil), w.terms...)
}

func (w *watch) run(ctx context.Context) {
	last := time.Time{}
	for {
		terms := w.terminals()
		done := true
		changed := make([]<-chan struct{}, 0, len(terms))
		for _, t := range terms {
			changed = append(changed, t.Buffer().Changed())
			if !t.Exited() {
				done = false
			}
		}
		if err := w.send(done); err != nil {
			return
		}
		if done {
			return
		}
		// Wait for output or exit, then no sooner than the interval.
		if !waitAny(ctx, changed, terms) {
			return
		}
		if d := refreshInterval - time.Since(last); d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		}
		last = time.Now()
	}
}

// waitAny waits until one of the terminals writes or exits.
func waitAny(ctx context.Context, changed []<-chan struct{}, terms []*sandbox.Terminal) bool {
	if len(terms) == 0 {
		return false
	}
	cases := make(chan struct{}, 1)
	stop := make(chan struct{})
	defer close(stop)
	for i := range terms {
		go func() {
			select {
			case <-changed[i]:
			case <-terms[i].Done():
			case <-stop:
				return
			}
			select {
			case cases <- struct{}{}:
			default:
			}
		}()
	}
	select {
	case <-cases:
		return true
	case <-ctx.Done():
		return false
	}
}

// send pushes what is new to the editor.
func (w *watch) send(final bool) error {
	update := map[string]any{"sessionUpdate": "tool_call_update", "toolCallId": w.toolCallID}
	if w.meta {
		data, next := w.term.Buffer().Since(w.sent)
		w.sent = next
		data = append(w.tail, data...)
		w.tail = nil
		if !final {
			// Hold back a character cut in half; the rest of it comes next.
			if cut := sandbox.IncompleteTail(data); cut > 0 {
				w.tail = append([]byte(nil), data[len(data)-cut:]...)
				data = data[:len(data)-cut]
			}
		}
		meta := map[string]any{}
		if len(data) > 0 {
			meta["terminal_output"] = map[string]string{"terminal_id": w.term.ID, "data": string(data)}
		}
		if final {
			_, _, st := w.term.Output()
			exit := map[string]any{"terminal_id": w.term.ID, "exit_code": nil, "signal": nil}
			if st != nil {
				exit["exit_code"], exit["signal"] = st.ExitCode, st.Signal
			}
			meta["terminal_exit"] = exit
		}
		if len(meta) == 0 {
			return nil
		}
		update["_meta"] = meta
	} else {
		update["content"] = w.render()
	}
	return w.p.editor.WriteObject(map[string]any{
		"jsonrpc": "2.0",
		"method":  "session/update",
		"params":  map[string]any{"sessionId": w.sessionID, "update": update},
	})
}
