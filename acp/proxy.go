package acp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/sandboxd/sandboxd/sandbox"
)

const (
	// refreshInterval bounds how often a watch pushes live terminal
	// output to the editor.
	refreshInterval = 100 * time.Millisecond
	// displayLimit bounds the text shown for one terminal in a tool call:
	// the editor re-renders it on every refresh, and the agent reads the
	// whole output through terminal/output anyway.
	displayLimit = 64 << 10
	// embeddedBytes bounds the output the proxy keeps of finished
	// terminals shown in tool calls: once released, their buffers are
	// outside server.max_output_memory.
	embeddedBytes = 64 << 20
	// maxEmbedded bounds how many terminals shown in tool calls the proxy
	// keeps readable after the agent released them.
	maxEmbedded = 256
	// stopTimeout bounds how long Run waits for work in flight once it
	// ends: a write to a peer that stopped reading never returns, and a
	// container still being removed is the manager's to remove at close.
	stopTimeout = 2 * time.Second
)

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
	ctx    context.Context // set by Run; background work ends with it

	// updates is held while a session/update that shows terminals is
	// rewritten and written, and while a watch renders and writes a
	// refresh: the editor never sees a refresh before the tool call it
	// refreshes, nor a stale one after the agent replaced the content.
	updates sync.Mutex

	// work is the background work Run waits for as it ends.
	work workGroup

	mu sync.Mutex
	// sessionCalls are editor requests whose answer opens or ends a
	// session, by request id.
	sessionCalls map[string]sessionCall
	// agentCalls are the agent's terminal requests in flight, by id, so a
	// $/cancel_request for one of them stops it here.
	agentCalls map[string]context.CancelFunc
	limit      *requestLimiter
	// specs are the sessions the proxy prepared, by id, for the cwd a
	// tool call shows for a terminal that names none.
	specs map[string]sandbox.SessionSpec
	// editorMeta is true when the editor renders terminals from the
	// terminal_info/terminal_output/terminal_exit _meta of tool calls.
	editorMeta bool
	// textWatches refresh tool calls whose terminals are shown as text;
	// metaWatches stream terminals announced with terminal_info.
	textWatches map[toolCallKey]*watch
	metaWatches map[termKey]*watch
	// endedWatches are the contents of text watches whose terminals all
	// ended, as the agent sent them, by tool call, at most maxEmbedded:
	// the agent's update that completes the tool call names the same
	// terminals again, and the editor keeps the final output it has
	// rather than get it once more. Only the content is kept, not the
	// terminals, whose output is bounded elsewhere (embeddedBytes).
	endedWatches map[toolCallKey][]json.RawMessage
	// embedded are the terminals shown in tool calls, oldest first in
	// embedOrder, readable after release.
	embedded   map[termKey]*embeddedTerminal
	embedOrder []termKey
	// agentTerminals are the terminals the agent runs itself and shows
	// under its own _meta terminal_info (claude-agent-acp's Bash), newest
	// last in agentOrder: tool calls show them as the agent wrote them.
	agentTerminals map[termKey]bool
	agentOrder     []termKey
}

// maxAgentTerminals bounds how many of the agent's own terminals the proxy
// remembers.
const maxAgentTerminals = 4096

type embeddedTerminal struct {
	t *sandbox.Terminal
	// announced is true once the editor got the terminal's terminal_info
	// and so knows its id.
	announced bool
}

type sessionCall struct {
	method string
	params json.RawMessage
}

type toolCallKey struct{ session, toolCall string }

type termKey struct{ session, terminal string }

// NewProxy returns a proxy between an editor and an agent connection.
// Sessions get their image, network and limits from the defaults of terms.
func NewProxy(terms *Terminals, editor, agent io.ReadWriteCloser, log *slog.Logger) *Proxy {
	return &Proxy{
		terms:          terms,
		editor:         NewLineStream(editor, log),
		agent:          NewLineStream(agent, log),
		log:            log,
		ctx:            context.Background(),
		sessionCalls:   make(map[string]sessionCall),
		agentCalls:     make(map[string]context.CancelFunc),
		limit:          newRequestLimiter(),
		specs:          make(map[string]sandbox.SessionSpec),
		textWatches:    make(map[toolCallKey]*watch),
		endedWatches:   make(map[toolCallKey][]json.RawMessage),
		metaWatches:    make(map[termKey]*watch),
		embedded:       make(map[termKey]*embeddedTerminal),
		agentTerminals: make(map[termKey]bool),
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

// plainID returns the id of a message that is an object with exactly one
// member that can be read as id in any case spelling, spelled "id", whose
// value is a number or a string, with some member that can be read as
// method and none that can be read as result or error: a request whose
// other members are ambiguous can still be answered by that id.
func plainID(body []byte) (json.RawMessage, bool) {
	spans, err := objectMembers(body)
	if err != nil {
		return nil, false
	}
	var id json.RawMessage
	ids, method, answer := 0, false, false
	for _, sp := range spans {
		switch {
		case strings.EqualFold(sp.name, "id"):
			ids++
			if sp.name == "id" {
				id = body[sp.valueStart:sp.end]
			}
		case strings.EqualFold(sp.name, "method"):
			method = true
		case strings.EqualFold(sp.name, "result"), strings.EqualFold(sp.name, "error"):
			// It may be a response, whose id is one of sandboxd's own
			// requests', not the agent's: no answer.
			answer = true
		}
	}
	if ids != 1 || len(id) == 0 || !method || answer {
		return nil, false
	}
	switch c := id[0]; {
	case c == '"', c == '-', '0' <= c && c <= '9':
		return id, true
	}
	return nil, false
}

func (m message) isRequest() bool  { return m.Method != "" && len(m.ID) > 0 && string(m.ID) != "null" }
func (m message) isResponse() bool { return m.Method == "" && len(m.ID) > 0 }

// ErrEditorClosed and ErrAgentClosed say which side ended a proxy.
var (
	ErrEditorClosed = errors.New("editor closed the connection")
	ErrAgentClosed  = errors.New("agent closed the connection")
)

// Run relays until either side ends or ctx is done, and returns why:
// ErrEditorClosed, ErrAgentClosed or the context's error. Work in flight
// (terminal requests, watches) is cancelled and waited for, up to
// stopTimeout; the readers are not, since a read from the editor cannot be
// interrupted: the caller ends the process or closes the connections.
func (p *Proxy) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p.ctx = ctx
	fromEditor, fromAgent := make(chan error, 1), make(chan error, 1)
	go func() { fromEditor <- p.fromEditor() }()
	go func() { fromAgent <- p.fromAgent() }()
	var why error
	select {
	case why = <-fromEditor:
		if errors.Is(why, ErrAgentClosed) {
			// A write to the agent failed: it is gone, but what it
			// wrote last may still be in its pipe, for the editor.
			select {
			case <-fromAgent:
			case <-ctx.Done():
			case <-time.After(lastLinesTimeout):
				// An agent that closed its input but keeps its output
				// open, and runs on.
			}
		}
	case why = <-fromAgent:
	case <-ctx.Done():
		why = ctx.Err()
	}
	cancel()
	// A watch blocked writing to an editor that stopped reading sees the
	// cancellation only once its write returns, which may be never: the
	// caller must still get to stop the agent and remove the containers.
	if !p.work.Stop(stopTimeout) {
		p.log.Warn("relay ended with work still in flight (a peer that does not read?)", "waited", stopTimeout)
	}
	return why
}

// refuseBatch answers a batch from the editor, which ACP does not have:
// passed on, its initialize would not be rewritten, nor its session calls
// seen, and the agent's answer, an array, would be dropped (see
// fromAgent). Each request in it gets InvalidRequest, in an array, as
// JSON-RPC answers a batch.
func (p *Proxy) refuseBatch(batch []byte) {
	p.log.Warn("refused a batch from the editor")
	var items []json.RawMessage
	if err := json.Unmarshal(batch, &items); err != nil || len(items) == 0 {
		rerr := errBatch
		if err != nil {
			rerr = &jsonrpc2.Error{Code: CodeParseError, Message: "parse error: " + err.Error()}
		}
		b, _ := marshal(map[string]any{"jsonrpc": "2.0", "id": nil, "error": rerr})
		p.editor.writeLater(b)
		return
	}
	var answers []any
	for _, item := range items {
		// Requests only: a response in it (the editor's answer to the
		// agent) carries the agent's id, which may be one of the
		// editor's own.
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(item, &m) == nil && len(m.ID) > 0 && m.Method != "" {
			answers = append(answers, map[string]any{"jsonrpc": "2.0", "id": m.ID, "error": errBatch})
		}
	}
	if len(answers) == 0 {
		return // notifications only: nothing to answer
	}
	b, _ := marshal(answers)
	p.editor.writeLater(b)
}

var errBatch = &jsonrpc2.Error{Code: CodeInvalidRequest, Message: "invalid request: batches are not supported"}

// mayConcernProxy reports whether an editor line may be one of the
// requests the proxy looks into; every other line is forwarded without
// being decoded. As with mayNeedProxy, a line with an escape in it may
// spell a method differently ("session\/new", as PHP and lua-cjson write
// it), so it is decoded too.
func mayConcernProxy(line []byte) bool {
	return containsAny(line, `"initialize"`, `"session/new"`, `"session/load"`, `"session/resume"`, `"session/close"`, `"session/delete"`, `\`)
}

// next reads one line from a side, skipping over-long ones; at the end of
// the stream it returns closed.
func (p *Proxy) next(s *LineStream, side string, closed error) ([]byte, error) {
	for {
		line, err := s.readRaw()
		if errors.Is(err, errTooLong) {
			p.log.Warn("dropped an over-long message from the " + side)
			p.answerTooLong(s, err)
			continue
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				p.log.Warn("read from "+side, "err", err)
			}
			return nil, closed
		}
		return line, nil
	}
}

// answerTooLong answers for a message from s that was too long to relay,
// so that nobody waits for an answer that will not come: a request gets
// an error back, a response reaches the side that asked as an error.
func (p *Proxy) answerTooLong(s *LineStream, err error) {
	id, isRequest, isResponse := membersOf(err)
	if len(id) == 0 || string(id) == "null" || isRequest == isResponse {
		return
	}
	if isResponse && s == p.agent {
		// No session comes of it.
		p.mu.Lock()
		delete(p.sessionCalls, idKey(id))
		p.mu.Unlock()
	}
	to, code, msg := s, int64(CodeInvalidRequest), fmt.Sprintf("message longer than %d bytes", s.max)
	if isResponse {
		to, code, msg = p.editor, CodeInternal, fmt.Sprintf("the agent's answer was longer than %d bytes", s.max)
		if s == p.editor {
			to, msg = p.agent, fmt.Sprintf("the editor's answer was longer than %d bytes", s.max)
		}
	}
	b, err := marshal(response{JSONRPC: "2.0", ID: id, Error: &jsonrpc2.Error{Code: code, Message: msg}})
	if err != nil {
		p.log.Debug("answer for an over-long message", "err", err)
		return
	}
	if to != s {
		// The other side, in place: it keeps its order among the lines
		// this reader relays there.
		if err := to.WriteLine(b); err != nil {
			p.log.Debug("answer for an over-long message", "err", err)
		}
		return
	}
	// Queued, not written: the reader must not wait for a peer that
	// writes before it reads, as LineStream.late says.
	to.writeLater(b)
}

func (p *Proxy) fromEditor() error {
	for {
		line, err := p.next(p.editor, "editor", ErrEditorClosed)
		if err != nil {
			return err
		}
		if body := bytes.TrimLeft(line, " \t"); len(body) > 0 && body[0] == '[' {
			p.refuseBatch(trimEOL(body))
			continue
		}
		if mayConcernProxy(line) {
			var m message
			if json.Unmarshal(trimEOL(line), &m) == nil && m.isRequest() {
				switch m.Method {
				case "initialize":
					if out := p.rewriteInitialize(trimEOL(line)); out != nil {
						line = append(out, '\n')
					}
				case "session/new", "session/load", "session/resume", "session/close", "session/delete":
					p.mu.Lock()
					p.sessionCalls[idKey(m.ID)] = sessionCall{method: m.Method, params: m.Params}
					p.mu.Unlock()
				}
			}
		}
		if err := p.agent.writeRaw(line); err != nil {
			return ErrAgentClosed
		}
	}
}

// mayNeedProxy reports whether an agent line may be one the proxy acts on:
// a terminal request, a tool call that shows a terminal, a cancellation.
// A line with an escape in it may spell any of those differently, so it
// may too: without one, a string decodes to the bytes it is written with.
func mayNeedProxy(line []byte) bool {
	return containsAny(line, `terminal`, `$/cancel_request`, `\`)
}

// decodeStrict decodes an agent's message as every peer reads it, or fails.
// encoding/json matches member names regardless of case and lets the last
// of a repeated member win, where the editor's parser may match exactly or
// keep the first: a message whose method the two could read differently
// (say, "method" and "METHOD") could slip a terminal request past the
// proxy to an editor that runs it on the host.
func decodeStrict(body []byte) (message, error) {
	members := [...]string{"jsonrpc", "id", "method", "params", "result", "error"}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return message{}, fmt.Errorf("not a JSON object")
	}
	var seen [len(members)]bool
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return message{}, err
		}
		key, _ := tok.(string)
		if strings.ContainsFunc(key, func(r rune) bool { return r < 0x20 }) {
			// A parser of C strings would read "method\u0000" as method.
			return message{}, fmt.Errorf("member %q has a control character", truncate([]byte(key), 40))
		}
		for i, name := range members {
			if strings.EqualFold(key, name) {
				if key != name || seen[i] {
					return message{}, fmt.Errorf("member %q is ambiguous", truncate([]byte(key), 40))
				}
				seen[i] = true
			}
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return message{}, err
		}
	}
	var m message
	err := json.Unmarshal(body, &m)
	return m, err
}

func (p *Proxy) fromAgent() error {
	for {
		line, err := p.next(p.agent, "agent", ErrAgentClosed)
		if err != nil {
			return err
		}
		body := trimEOL(line)
		if !isObject(body) {
			p.log.Warn("dropped a line from the agent that is not a JSON object", "line", truncate(body, 200))
			continue
		}
		if bytes.IndexByte(body, '\r') >= 0 {
			// In valid JSON a CR is whitespace between tokens; to an
			// editor that splits lines on it, a line break, after which
			// it would read a message of its own, unchecked.
			body = bytes.ReplaceAll(body, []byte{'\r'}, []byte{' '})
			line = append(body[:len(body):len(body)], '\n')
		}
		p.flushEnded()
		p.mu.Lock()
		pending := len(p.sessionCalls) > 0
		// While a tool call shows terminals, an update that replaces
		// its content names no terminal, and the watch must hear of it,
		// or its refreshes would put the old output back over the new
		// content (as text) or stream it on (to Zed).
		watching := len(p.textWatches)+len(p.metaWatches) > 0
		// And an ended watch must hear of the tool call's next content,
		// lest a repeat of its terminals after other content go
		// without their output.
		watching = watching || len(p.endedWatches) > 0 && containsAny(body, "tool_call", "toolCall")
		p.mu.Unlock()
		if !pending && !watching && !mayNeedProxy(body) {
			if err := p.editor.writeRaw(line); err != nil {
				return ErrEditorClosed
			}
			continue
		}
		m, err := decodeStrict(body)
		if err != nil && !mayNeedProxy(body) {
			// Looked into only for a session call of the editor's that
			// waits for its answer: a line that cannot be a terminal
			// request goes on as it would with none waiting.
			if err := p.editor.writeRaw(line); err != nil {
				return ErrEditorClosed
			}
			continue
		}
		if err != nil {
			p.log.Warn("dropped a message from the agent that is not JSON-RPC", "err", err, "line", truncate(body, 200))
			if id, ok := plainID(body); ok {
				// A request gets its answer, or the agent waits for
				// ever; a response gets none (JSON-RPC), and its
				// requester, sandboxd, has none in flight by this id.
				p.replyToAgentLater(message{ID: id}, nil, &jsonrpc2.Error{Code: CodeInvalidRequest, Message: "invalid request: " + err.Error()})
			}
			continue
		}
		switch {
		case strings.HasPrefix(m.Method, "terminal/"):
			// Every terminal method is the proxy's: one it does not know
			// gets method not found from it, never the editor's host.
			if m.isRequest() {
				p.answerTerminal(m)
			} else if string(m.ID) == "null" {
				p.replyToAgentLater(m, nil, errNullID)
			} else if actsWithoutAnswer(m.Method) {
				p.terminalNotified(m)
			} else {
				p.log.Warn("dropped a terminal notification from the agent", "method", m.Method)
			}
			continue
		case m.Method == MethodCancel && p.cancelAgentCall(m):
			continue
		case m.isResponse():
			p.sessionAnswered(m)
		case (m.Method == "session/update" || m.Method == "session/request_permission") && (watching || containsAny(m.Params, `terminal`, `\`)):
			p.updates.Lock()
			if out := p.rewriteTerminals(m, body); out != nil {
				line = append(out, '\n')
			}
			err := p.editor.writeRaw(line)
			p.updates.Unlock()
			if err != nil {
				return ErrEditorClosed
			}
			continue
		}
		if err := p.editor.writeRaw(line); err != nil {
			return ErrEditorClosed
		}
	}
}

// flushEnded sends the editor the last refresh of every watch whose
// terminals have all ended, now, ahead of whatever message of the agent's
// is about to be relayed: the agent has seen them end (wait_for_exit), and its next
// update or its answer to the prompt must not reach the editor before
// their final output. The watches send nothing more.
func (p *Proxy) flushEnded() {
	// Most lines pass with no watch at all: they take no lock the
	// watches' refreshes hold.
	p.mu.Lock()
	none := len(p.textWatches)+len(p.metaWatches) == 0
	p.mu.Unlock()
	if none {
		return
	}
	p.updates.Lock()
	defer p.updates.Unlock()
	p.mu.Lock()
	var ended []*watch
	for _, w := range p.textWatches {
		ended = append(ended, w)
	}
	for _, w := range p.metaWatches {
		ended = append(ended, w)
	}
	p.mu.Unlock()
	for _, w := range ended {
		if w.closed || w.hidden || !allEnded(w.terminals()) {
			continue // a hidden one waits to be shown again (run)
		}
		if _, err := w.refresh(true); err != nil {
			p.log.Debug("refresh tool call", "toolCall", w.toolCallID, "err", err)
		}
		p.watchEnded(w)
		w.closed = true
		w.forget()
	}
}

// allEnded reports whether every one of terms has exited.
func allEnded(terms []*sandbox.Terminal) bool {
	return !slices.ContainsFunc(terms, func(t *sandbox.Terminal) bool { return !t.Exited() })
}

func containsAny(line []byte, subs ...string) bool {
	for _, s := range subs {
		if bytes.Contains(line, []byte(s)) {
			return true
		}
	}
	return false
}

// isObject reports whether line is one valid JSON object.
func isObject(line []byte) bool {
	t := bytes.TrimLeft(line, " \t\r\n")
	return len(t) > 0 && t[0] == '{' && json.Valid(t)
}

func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "..."
}

// marshal is json.Marshal without HTML escaping: rewritten messages keep
// "<", ">" and "&" as the peer wrote them.
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// rewriteInitialize tells the agent the client supports terminals, and
// remembers whether the editor renders terminal _meta. Every other field
// stays as the editor wrote it. It returns nil when it cannot rewrite.
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

// response is a JSON-RPC response the proxy writes to the agent.
type response struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  any             `json:"result,omitempty"`
	Error   *jsonrpc2.Error `json:"error,omitempty"`
}

// answerTerminal answers a terminal request of the agent in the session's
// container, in the background: wait_for_exit may take long.
func (p *Proxy) answerTerminal(m message) {
	key := idKey(m.ID)
	p.mu.Lock()
	_, dup := p.agentCalls[key]
	p.mu.Unlock()
	if dup {
		p.replyToAgentLater(m, nil, duplicateID(string(m.ID)))
		return
	}
	release, err := p.limit.acquire(m.Method, len(m.Params)+2*len(m.ID))
	if err != nil {
		p.replyToAgentLater(m, nil, err)
		return
	}
	ctx, cancel := context.WithCancel(p.ctx)
	p.mu.Lock()
	p.agentCalls[key] = cancel
	p.mu.Unlock()
	forget := func() {
		p.mu.Lock()
		delete(p.agentCalls, key)
		p.mu.Unlock()
		cancel()
	}
	started := p.work.Go(func() {
		defer release() // after the reply is written: it holds the memory
		res, built, err := p.limit.run(ctx, p.terms, m.Method, m.Params)
		defer built() // after the reply is written
		// Before the reply: the agent may reuse the id as soon as it has it.
		forget()
		p.replyToAgent(m, res, err)
	})
	if !started {
		forget()
		release()
	}
}

// terminalNotified runs a terminal/kill or terminal/release the agent sent
// as a notification: done, but not answered.
func (p *Proxy) terminalNotified(m message) {
	release, err := p.limit.acquire(m.Method, len(m.Params))
	if err != nil {
		p.log.Warn("terminal notification from the agent not run", "method", m.Method, "err", err)
		return
	}
	started := p.work.Go(func() {
		defer release()
		_, built, err := p.limit.run(p.ctx, p.terms, m.Method, m.Params)
		built()
		if err != nil {
			p.log.Warn("terminal notification from the agent", "method", m.Method, "err", err)
		}
	})
	if !started {
		release()
	}
}

// replyToAgent answers an agent's request with res, or with err.
func (p *Proxy) replyToAgent(m message, res any, err error) {
	b, err := p.reply(m, res, err)
	if err == nil {
		err = p.agent.WriteLine(b)
	}
	if err != nil {
		p.log.Debug("reply to agent", "method", m.Method, "err", err)
	}
}

// replyToAgentLater is replyToAgent for the reader of the agent's
// messages: the reply is queued, since an agent that blocks writing its
// stdout while its stdin is full would otherwise wait for the reader as the
// reader waits for it.
func (p *Proxy) replyToAgentLater(m message, res any, err error) {
	b, err := p.reply(m, res, err)
	if err != nil {
		p.log.Debug("reply to agent", "method", m.Method, "err", err)
		return
	}
	p.agent.writeLater(b)
}

func (p *Proxy) reply(m message, res any, err error) ([]byte, error) {
	reply := response{JSONRPC: "2.0", ID: m.ID}
	if err != nil {
		reply.Error = rpcError(p.ctx, err)
	} else {
		reply.Result = res
	}
	return marshal(reply)
}

// idKey is a request id as a map key: ids the peers match as JSON values
// ("\u0061" and "a", 1 and 1.0) get the same key, ids of another type
// never do.
func idKey(id json.RawMessage) string {
	if len(id) > 0 && id[0] == '"' {
		var s string
		if json.Unmarshal(id, &s) == nil {
			return `"` + s
		}
		return string(id)
	}
	if n, err := strconv.ParseInt(string(id), 10, 64); err == nil {
		return strconv.FormatInt(n, 10)
	}
	// A peer in JavaScript reads every number as a float64, and answers
	// with what it read.
	if f, err := strconv.ParseFloat(string(id), 64); err == nil {
		if f == math.Trunc(f) && math.Abs(f) < 1<<63 {
			return strconv.FormatInt(int64(f), 10)
		}
		return strconv.FormatFloat(f, 'g', -1, 64)
	}
	return string(id)
}

// cancelAgentCall cancels the agent's terminal request that a
// $/cancel_request names, and answers the cancellation when it was sent
// as a request. It reports whether the request named is the proxy's.
func (p *Proxy) cancelAgentCall(m message) bool {
	var c struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	if json.Unmarshal(m.Params, &c) != nil {
		return false
	}
	p.mu.Lock()
	cancel, ok := p.agentCalls[idKey(c.RequestID)]
	_, dup := p.agentCalls[idKey(m.ID)]
	p.mu.Unlock()
	switch {
	case !ok:
		return false
	case m.isRequest() && dup:
		// Its answer could not be told from the answer to the request
		// in flight under the same id, which goes on.
		p.replyToAgentLater(m, nil, duplicateID(string(m.ID)))
		return true
	}
	cancel()
	if m.isRequest() {
		p.replyToAgentLater(m, json.RawMessage("null"), nil)
	}
	return true
}

// sessionAnswered prepares the container of a session the agent opened,
// loaded or resumed, and removes the container of one it closed or deleted.
func (p *Proxy) sessionAnswered(m message) {
	key := idKey(m.ID)
	p.mu.Lock()
	call, ok := p.sessionCalls[key]
	delete(p.sessionCalls, key)
	p.mu.Unlock()
	if !ok || (len(m.Error) > 0 && string(m.Error) != "null") {
		return
	}
	f, err := decodeFields(call.params, "")
	if err != nil {
		return
	}
	var sessionID, cwd string
	if get(f, "sessionId", false, &sessionID) != nil {
		return
	}
	switch call.method {
	case "session/close", "session/delete":
		p.closeSession(sessionID)
		return
	case "session/new":
		var res struct {
			SessionID string `json:"sessionId"`
		}
		if json.Unmarshal(m.Result, &res) != nil {
			return
		}
		sessionID = res.SessionID
	}
	if get(f, "cwd", false, &cwd) != nil || sessionID == "" || cwd == "" {
		return
	}
	spec := p.terms.defaults
	// additionalDirectories is read as the agent reads it (the schema's
	// x-deserialize-skip-invalid-items): an item that is no string is
	// left out, the others are mounted.
	extra, _ := items[string](f, "additionalDirectories", nil)
	spec.ID, spec.Workspace, spec.ExtraDirs = sessionID, cwd, extra
	p.mu.Lock()
	before, open := p.specs[spec.ID]
	p.mu.Unlock()
	if !open {
		// A command may have opened it before the agent answered.
		before, open = p.terms.implicitSpec(spec.ID)
	}
	if open && !sameMounts(before, spec) {
		// A container cannot gain or change mounts: a session loaded
		// again with other directories gets a new one, so that what the
		// editor names is what the agent's commands see.
		p.log.Info("session opened again with other directories; its container is replaced", "session", spec.ID, "cwd", cwd)
		p.closeSession(spec.ID)
	}
	p.mu.Lock()
	p.specs[spec.ID] = spec
	p.mu.Unlock()
	// Prepare reserves the session at once, so a terminal request that
	// follows waits for the container instead of finding no session.
	p.terms.Prepare(spec)
}

// sameMounts tells whether two specs of a session mount the same
// directories: the same workspace, and the same additional directories in
// any order.
func sameMounts(a, b sandbox.SessionSpec) bool {
	extra := func(s sandbox.SessionSpec) []string {
		d := make([]string, len(s.ExtraDirs))
		for i, x := range s.ExtraDirs {
			d[i] = filepath.Clean(x)
		}
		slices.Sort(d)
		return slices.Compact(d)
	}
	return filepath.Clean(a.Workspace) == filepath.Clean(b.Workspace) && slices.Equal(extra(a), extra(b))
}

// closeSession forgets a session the agent closed, at once, so that a
// session/load or resume of the same id that follows is a new session; its
// container is removed in the background, since that takes a while and the
// agent's messages must keep flowing meanwhile.
func (p *Proxy) closeSession(id string) {
	// The editor has closed the session: its tool calls get no more
	// updates, also not the last one the kill of its terminals would give.
	p.updates.Lock()
	p.mu.Lock()
	for _, w := range p.textWatches {
		if w.sessionID == id {
			w.closed = true
		}
	}
	for _, w := range p.metaWatches {
		if w.sessionID == id {
			w.closed = true
			w.wakeUp() // one waiting to be shown again ends
		}
	}
	for k := range p.endedWatches {
		if k.session == id {
			delete(p.endedWatches, k)
		}
	}
	delete(p.specs, id)
	order := p.embedOrder[:0]
	for _, k := range p.embedOrder {
		if k.session == id {
			delete(p.embedded, k)
		} else {
			order = append(order, k)
		}
	}
	p.embedOrder = order
	p.mu.Unlock()
	p.updates.Unlock()
	remove := p.terms.End(id)
	if remove == nil {
		return
	}
	p.work.Go(func() {
		if err := remove(context.WithoutCancel(p.ctx)); err != nil {
			p.log.Warn("close session", "session", id, "err", err)
		}
	})
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
	s, err := p.terms.Session(now, sessionID)
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

// watchEnded keeps the content of a text watch whose terminals have all
// ended and whose final output the editor got, for showsEnded. A watch
// whose content the agent replaced with none of its terminals shows none.
// p.updates is held.
func (p *Proxy) watchEnded(w *watch) {
	if w.term != nil || w.closed || len(w.terms) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.endedWatches) >= maxEmbedded {
		for k := range p.endedWatches {
			delete(p.endedWatches, k)
			break
		}
	}
	p.endedWatches[toolCallKey{w.sessionID, w.toolCallID}] = w.content
}

// showsEnded reports whether an update of kind sets the content an ended
// watch of the tool call showed, which the editor has with the terminals'
// final output. Anything else replaces it: the ended watch is forgotten.
// p.updates is held.
func (p *Proxy) showsEnded(key toolCallKey, kind string, content []json.RawMessage) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	ended, ok := p.endedWatches[key]
	if !ok {
		return false
	}
	if kind == "tool_call_update" && sameItems(content, ended) {
		return true
	}
	delete(p.endedWatches, key)
	return false
}

// showAnnounced notes which of the terminals announced in a tool call
// its content still shows: output of one it no longer shows is not
// streamed while it is not, and what it wrote meanwhile follows once it
// is shown again. p.updates is held.
func (p *Proxy) showAnnounced(sessionID, callID string, ids []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.metaWatches {
		if w.sessionID == sessionID && w.toolCallID == callID {
			hidden := !slices.Contains(ids, w.term.ID)
			if w.hidden && !hidden {
				w.wakeUp()
			}
			w.hidden = hidden
		}
	}
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

// startWatch registers w in watches, a map of p guarded by p.mu, and runs
// it until its terminals exit.
func startWatch[K comparable](p *Proxy, watches map[K]*watch, key K, w *watch) {
	p.mu.Lock()
	watches[key] = w
	p.mu.Unlock()
	w.forget = func() {
		p.mu.Lock()
		if watches[key] == w {
			delete(watches, key)
		}
		p.mu.Unlock()
	}
	if !p.work.Go(func() { w.run(p.ctx) }) {
		w.forget()
	}
}

// Terminal _meta as Zed reads it (crates/agent_servers/src/acp.rs).
type (
	terminalInfo struct {
		TerminalID string `json:"terminal_id"`
		Cwd        string `json:"cwd,omitempty"`
	}
	terminalOutput struct {
		TerminalID string `json:"terminal_id"`
		Data       string `json:"data"`
	}
	terminalExit struct {
		TerminalID string  `json:"terminal_id"`
		ExitCode   *int    `json:"exit_code"`
		Signal     *string `json:"signal"`
	}
	terminalMeta struct {
		Output *terminalOutput `json:"terminal_output,omitempty"`
		Exit   *terminalExit   `json:"terminal_exit,omitempty"`
	}
)

// notification is a session/update the proxy sends the editor itself.
type notification struct {
	JSONRPC string             `json:"jsonrpc"`
	Method  string             `json:"method"`
	Params  notificationParams `json:"params"`
}

type notificationParams struct {
	SessionID string         `json:"sessionId"`
	Update    toolCallUpdate `json:"update"`
}

type toolCallUpdate struct {
	SessionUpdate string            `json:"sessionUpdate"`
	ToolCallID    string            `json:"toolCallId"`
	Content       []json.RawMessage `json:"content,omitempty"`
	Meta          *terminalMeta     `json:"_meta,omitempty"`
}

// watch pushes the output of embedded terminals to the editor as
// tool_call_update notifications, at most every refreshInterval and once
// more when they exit. A text watch refreshes a tool call's content; a meta
// watch streams one announced terminal.
type watch struct {
	p          *Proxy
	sessionID  string
	toolCallID string
	wake       chan struct{} // the agent replaced the content
	forget     func()
	// shownAt is when the editor got the terminals' output last: from a
	// refresh, or from the rewritten tool call that started a text watch
	// or replaced its content. Guarded by p.updates.
	shownAt time.Time
	// closed says the session is closed: nothing more is sent. Guarded
	// by p.updates.
	closed bool

	// Text watches; guarded by p.updates.
	content []json.RawMessage   // as the agent sent it
	terms   []*sandbox.Terminal // the known terminals in it
	shown   []byte              // the content the editor has

	// Meta watches; guarded by p.updates.
	term *sandbox.Terminal
	// hidden says the tool call no longer shows the terminal: the
	// agent replaced its content.
	hidden bool
	sent   int64  // output offset sent so far
	tail   []byte // the start of a character whose rest has not come yet
}

// setContent replaces a text watch's content and returns it rendered.
// p.updates is held.
func (w *watch) setContent(content []json.RawMessage, terms []*sandbox.Terminal) json.RawMessage {
	w.content, w.terms = content, terms
	shown, _ := marshal(w.render())
	return w.show(shown)
}

// show records that the editor gets shown, now, and wakes the watch to
// refresh from there. p.updates is held.
func (w *watch) show(shown json.RawMessage) json.RawMessage {
	w.shown, w.shownAt = shown, time.Now()
	w.wakeUp()
	return shown
}

// wakeUp has the watch look again at once, rather than when its terminals
// next write.
func (w *watch) wakeUp() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// due returns a text watch's content rendered when the editor should get
// it now: it changed, and a refresh is due or the last one is (a terminal
// ended, which the person watching is to see with the agent's update, not
// after it). The output is only rendered when one of those holds.
// p.updates is held.
func (w *watch) due() (json.RawMessage, bool) {
	if time.Since(w.shownAt) < refreshInterval && !slices.ContainsFunc(w.terms, (*sandbox.Terminal).Exited) {
		return nil, false
	}
	shown, err := marshal(w.render())
	if err != nil || bytes.Equal(shown, w.shown) {
		return nil, false
	}
	return shown, true
}

func (w *watch) terminals() []*sandbox.Terminal {
	if w.term != nil {
		return []*sandbox.Terminal{w.term}
	}
	return w.terms
}

func (w *watch) run(ctx context.Context) {
	for {
		w.p.updates.Lock()
		last, ended := w.shownAt, allEnded(w.terminals())
		w.p.updates.Unlock()
		// The last refresh goes at once: it is what the agent is about
		// to report on.
		if d := refreshInterval - time.Since(last); d > 0 && !ended {
			select {
			case <-ctx.Done():
				w.forget()
				return
			case <-time.After(d):
			}
		}
		w.p.updates.Lock()
		terms := w.terminals()
		changed := make([]<-chan struct{}, len(terms))
		final := true
		for i, t := range terms {
			// Taken before the output is read: a write after the
			// read closes it.
			changed[i] = t.Buffer().Changed()
			if !t.Exited() {
				final = false
			}
		}
		if final && w.hidden && !w.closed {
			// Its terminal ended while the tool call shows other
			// content: the rest of its output and its exit go to the
			// editor if it is shown again.
			w.p.updates.Unlock()
			select {
			case <-w.wake:
				continue
			case <-ctx.Done():
				w.forget()
				return
			}
		}
		sent, err := w.refresh(final)
		if sent {
			w.shownAt = time.Now()
		}
		if final || err != nil {
			// Forgotten before p.updates is released, so an update of
			// the agent either reaches this watch in time or starts a
			// new one.
			if err == nil {
				w.p.watchEnded(w)
			}
			w.forget()
		}
		w.p.updates.Unlock()
		if err != nil {
			w.p.log.Debug("refresh tool call", "toolCall", w.toolCallID, "err", err)
			return
		}
		if final {
			return
		}
		if !waitAny(ctx, w.wake, changed, terms) {
			w.forget()
			return
		}
	}
}

// waitAny waits until one of the terminals writes or exits, or wake.
func waitAny(ctx context.Context, wake <-chan struct{}, changed []<-chan struct{}, terms []*sandbox.Terminal) bool {
	if len(terms) == 1 {
		select {
		case <-changed[0]:
		case <-terms[0].Done():
		case <-wake:
		case <-ctx.Done():
			return false
		}
		return true
	}
	any := make(chan struct{}, 1)
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
			case any <- struct{}{}:
			default:
			}
		}()
	}
	select {
	case <-any:
	case <-wake:
	case <-ctx.Done():
		return false
	}
	return true
}

// refresh sends the editor what changed, if anything. p.updates is held.
func (w *watch) refresh(final bool) (bool, error) {
	if w.closed || w.hidden {
		return false, nil
	}
	update := toolCallUpdate{SessionUpdate: "tool_call_update", ToolCallID: w.toolCallID}
	if w.term != nil {
		data, next, dropped := w.term.Buffer().Since(w.sent)
		w.sent = next
		if dropped > 0 {
			// The command wrote more between two refreshes than its
			// outputByteLimit keeps: the person watching is told what
			// is missing, and the head of a character held back last
			// time has lost its rest.
			w.tail = fmt.Appendf(nil, "\r\n[sandboxd: %d bytes of output not shown]\r\n", dropped+int64(len(w.tail)))
		}
		data = append(w.tail, data...)
		w.tail = nil
		if !final {
			// Hold back a character cut in half; its rest comes next.
			if cut := sandbox.IncompleteTail(data); cut > 0 {
				w.tail = append([]byte(nil), data[len(data)-cut:]...)
				data = data[:len(data)-cut]
			}
		}
		meta := terminalMeta{}
		if len(data) > 0 {
			meta.Output = &terminalOutput{TerminalID: w.term.ID, Data: string(data)}
		}
		if final {
			_, _, st := w.term.Output()
			meta.Exit = &terminalExit{TerminalID: w.term.ID}
			if st != nil {
				meta.Exit.ExitCode, meta.Exit.Signal = st.ExitCode, st.Signal
			}
		}
		if meta.Output == nil && meta.Exit == nil {
			return false, nil
		}
		update.Meta = &meta
	} else {
		items := w.render()
		shown, err := marshal(items)
		if err != nil || bytes.Equal(shown, w.shown) {
			return false, err
		}
		w.shown = shown
		update.Content = items
	}
	b, err := marshal(notification{JSONRPC: "2.0", Method: "session/update",
		Params: notificationParams{SessionID: w.sessionID, Update: update}})
	if err != nil {
		return false, err
	}
	return true, w.p.editor.WriteLine(b)
}

// render returns the content with every terminal item replaced by a text
// item with its output. A terminal the content names again gets a line
// that points up: an agent repeating one item must not make a line that
// grows with the square of the repeats.
func (w *watch) render() []json.RawMessage {
	items := make([]json.RawMessage, 0, len(w.content))
	shown := make(map[string]bool, len(w.terms))
	for _, item := range w.content {
		id, ok := terminalItem(item)
		if !ok || w.p.agentTerminal(w.sessionID, id) {
			items = append(items, item) // not a terminal, or the agent's own
			continue
		}
		text := fmt.Sprintf("(the output of terminal %s is not available)", id)
		if shown[id] {
			text = fmt.Sprintf("(the output of terminal %s is shown above)", id)
		} else if i := slices.IndexFunc(w.terms, func(t *sandbox.Terminal) bool { return t.ID == id }); i >= 0 {
			text = terminalText(w.terms[i])
			shown[id] = true
		}
		b, err := marshal(textContent{Type: "content", Content: textBlock{Type: "text", Text: text}})
		if err != nil {
			continue
		}
		items = append(items, b)
	}
	return items
}

type textContent struct {
	Type    string    `json:"type"`
	Content textBlock `json:"content"`
}

type textBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// terminalText is a terminal's output for a text item, with its exit status
// once it has exited.
func terminalText(t *sandbox.Terminal) string {
	out, truncated, st := t.Output()
	if len(out) > displayLimit {
		out = out[len(out)-displayLimit:]
		for len(out) > 0 && !utf8.RuneStart(out[0]) {
			out = out[1:]
		}
		truncated = true
	}
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
