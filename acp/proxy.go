package acp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
	"github.com/sandboxd/sandboxd/sandbox"
)

// stopTimeout bounds how long Run waits for work in flight once it ends:
// a write to a peer that stopped reading never returns, and a container
// still being removed is the manager's to remove at close.
const stopTimeout = 2 * time.Second

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
	// contained says the agent runs in the scope's one container (wrap
	// --contain): a session it cannot show is refused.
	contained bool
	// execCalls are the tool calls of kind execute that have shown no
	// terminal of sandboxd's yet, at most maxExecCalls; warnedExec says
	// the agent was found running commands itself (noteExec).
	execCalls  map[toolCallKey]bool
	warnedExec atomic.Bool
}

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
		execCalls:      make(map[toolCallKey]bool),
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

func (m message) isRequest() bool { return m.Method != "" && len(m.ID) > 0 && string(m.ID) != "null" }

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
// each request in it gets InvalidRequest, in an array, as JSON-RPC answers
// a batch.
func (p *Proxy) refuseBatch(batch []byte) {
	p.log.Warn("refused a batch from the editor")
	var items []json.RawMessage
	if err := json.Unmarshal(batch, &items); err != nil || len(items) == 0 {
		rerr := errBatch
		if err != nil {
			rerr = &jsonrpc2.Error{Code: jsonrpc.ParseError, Message: "parse error: " + err.Error()}
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

var errBatch = &jsonrpc2.Error{Code: jsonrpc.InvalidRequest, Message: "invalid request: batches are not supported"}

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
	to, code, msg := s, int64(jsonrpc.InvalidRequest), fmt.Sprintf("message longer than %d bytes", s.max)
	if isResponse {
		to, code, msg = p.editor, jsonrpc.InternalError, fmt.Sprintf("the agent's answer was longer than %d bytes", s.max)
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
			// Passed on, its initialize would not be rewritten, nor its
			// session calls seen, and the agent's answer, an array, would
			// be dropped (see fromAgent).
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
					if rerr := p.outsideContainer(m); rerr != nil {
						p.refuseToEditor(m, rerr)
						continue
					}
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

// decodeStrict decodes an agent's message as every peer reads it, or fails:
// on a member of JSON-RPC's spelled in another case or repeated, and on a
// member name with a control character.
func decodeStrict(body []byte) (message, error) {
	// encoding/json matches member names regardless of case and lets the
	// last of a repeated member win, where the editor's parser may match
	// exactly or keep the first: a message whose method the two could
	// read differently (say, "method" and "METHOD") could slip a terminal
	// request past the proxy to an editor that runs it on the host.
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
		p.noteExec(body)
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
		// A contained agent is told of no fs capability (see
		// rewriteInitialize); one that asks all the same is refused.
		fsCall := p.contained && containsAny(body, `fs/`)
		if !pending && !watching && !fsCall && !mayNeedProxy(body) {
			if err := p.editor.writeRaw(line); err != nil {
				return ErrEditorClosed
			}
			continue
		}
		m, err := decodeStrict(body)
		if err != nil && !fsCall && !mayNeedProxy(body) {
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
				p.replyToAgentLater(message{ID: id}, nil, &jsonrpc2.Error{Code: jsonrpc.InvalidRequest, Message: "invalid request: " + err.Error()})
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
		case p.contained && strings.HasPrefix(m.Method, "fs/"):
			if m.isRequest() {
				p.replyToAgentLater(m, nil, &jsonrpc2.Error{Code: jsonrpc.MethodNotFound, Message: fmt.Sprintf("method not found: %.100s: a contained agent's files are its container's", m.Method)})
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

// response is a JSON-RPC response the proxy writes to the agent.
type response struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  any             `json:"result,omitempty"`
	Error   *jsonrpc2.Error `json:"error,omitempty"`
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
