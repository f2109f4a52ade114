package ahp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
)

// rpcError is the error of an answer.
type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

// validID reports whether id is one JSON-RPC allows: a string, a number or
// null.
func validID(id json.RawMessage) bool {
	if len(id) == 0 {
		return false
	}
	switch b := id[0]; {
	case b == '"', b == '-', '0' <= b && b <= '9':
		return true
	}
	return string(id) == "null"
}

// requestID returns id to echo in an answer, or nil (null) when it is not a
// valid one: an object or array is not to be echoed as if it were.
func requestID(id json.RawMessage) json.RawMessage {
	if !validID(id) {
		return nil
	}
	return id
}

func invalid(format string, args ...any) *rpcError {
	return &rpcError{Code: jsonrpc.InvalidParams, Message: fmt.Sprintf(format, args...)}
}

func (c *conn) handle(ctx context.Context, data []byte) {
	var m struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Method  string          `json:"method"`
		Params  json.RawMessage `json:"params"`
	}
	err := json.Unmarshal(data, &m)
	var serr *json.SyntaxError
	if errors.As(err, &serr) {
		c.reply(nil, nil, &rpcError{Code: jsonrpc.ParseError, Message: "parse error: " + err.Error()})
		return
	}
	// JSON, but perhaps not a request: that is answered InvalidRequest,
	// with the id when one can be read.
	var why string
	switch {
	case !bytes.HasPrefix(bytes.TrimLeft(data, " \t\r\n"), []byte("{")):
		why = "the message is not a request object"
	case err != nil:
		// An object: only a member can be of the wrong type.
		why = "method and jsonrpc must be strings"
	case len(m.ID) > 0 && !validID(m.ID):
		why = "id must be a string, a number or null"
	case m.JSONRPC != "2.0":
		why = `jsonrpc must be "2.0"`
	case m.Method == "":
		why = "method is required"
	}
	if why != "" {
		c.reply(requestID(m.ID), nil, &rpcError{Code: jsonrpc.InvalidRequest, Message: "invalid request: " + why})
		return
	}
	// A notification has no id at all; an id of null is a request
	// (JSON-RPC 2.0 discourages it, but it is one) and gets its answer.
	isRequest := len(m.ID) > 0
	var res any
	var rerr *rpcError
	c.mu.Lock()
	known := c.clientID != ""
	c.mu.Unlock()
	handshake := m.Method == "initialize" || m.Method == "reconnect"
	switch {
	case m.Method == "ping":
	case handshake && known:
		// The client's id, which its claims and origins carry, is
		// settled once per connection.
		rerr = &rpcError{Code: jsonrpc.InvalidRequest, Message: m.Method + ": the connection is already initialized"}
	case !handshake && !known:
		rerr = &rpcError{Code: jsonrpc.InvalidRequest, Message: fmt.Sprintf("%.100s: initialize (or reconnect) first", m.Method)}
	}
	if rerr == nil && !c.awaitCreated(ctx, m.Params) {
		return // the connection ends
	}
	switch {
	case rerr != nil:
	case handshake || m.Method == "subscribe":
		// Params are read before the server lock, which every terminal
		// waits for; the answer is queued under the lock it was made
		// under, so no action newer than its snapshot or replay reaches
		// the client before it.
		switch m.Method {
		case "initialize":
			var p initializeParams
			if p, rerr = parseInitialize(m.Params); rerr == nil {
				c.s.mu.Lock()
				defer c.s.mu.Unlock()
				res, rerr = c.initializeLocked(p)
			}
			c.refused = rerr != nil && rerr.Code == jsonrpc.UnsupportedProtocolVersion
		case "subscribe":
			var p subscribeParams
			if p, rerr = parseSubscribe(m.Method, m.Params); rerr == nil {
				c.s.mu.Lock()
				defer c.s.mu.Unlock()
				res, rerr = c.subscribeLocked(p)
			}
		default:
			var p reconnectParams
			if p, rerr = parseReconnect(m.Params); rerr == nil {
				c.s.mu.Lock()
				defer c.s.mu.Unlock()
				res, rerr = c.reconnectLocked(p)
			}
		}
	case m.Method == "ping":
		// No payload either way: the result is null.
	case m.Method == "unsubscribe":
		var p subscribeParams
		if p, rerr = parseSubscribe(m.Method, m.Params); rerr != nil {
			break
		}
		c.mu.Lock()
		delete(c.subs, p.Channel)
		c.mu.Unlock()
	case m.Method == "createTerminal":
		var start func(context.Context) *rpcError
		if start, rerr = c.s.reserveTerminal(m.Params); rerr != nil {
			break
		}
		// The start (an exec, a container's start the first time) must
		// not hold up what the client sends next, such as input to its
		// other terminals; what it sends about this one waits for it.
		var p struct {
			Channel string `json:"channel"`
		}
		json.Unmarshal(m.Params, &p)
		started := make(chan struct{})
		c.mu.Lock()
		c.creating[p.Channel] = started
		c.mu.Unlock()
		// Requests that wait for it are read once its answer is queued:
		// theirs follow it.
		c.serveBeside(m.ID, isRequest, func() *rpcError { return start(ctx) }, func() {
			c.mu.Lock()
			delete(c.creating, p.Channel)
			c.mu.Unlock()
			close(started)
		})
		return
	case m.Method == "disposeTerminal":
		var kill func(context.Context) *rpcError
		if kill, rerr = c.s.removeTerminal(m.Params); rerr != nil {
			break
		}
		// The kill (an exec in the container, then the grace period)
		// must not hold up what the client sends next, such as input
		// to its other terminals: the answer follows when it is done.
		c.serveBeside(m.ID, isRequest, func() *rpcError { return kill(ctx) }, nil)
		return
	case m.Method == "dispatchAction":
		c.dispatch(m.Params)
	default:
		rerr = &rpcError{Code: jsonrpc.MethodNotFound, Message: fmt.Sprintf("method not found: %.100s", m.Method)}
	}
	if isRequest {
		if rerr == nil && res == nil {
			res = json.RawMessage("null")
		}
		c.reply(m.ID, res, rerr)
	}
}

// serveBeside does a request's work beside the reader, at most
// maxBackground at once (beyond, the reader waits for one to end), and
// answers it, null or do's error, once done: the writer sends the answer.
// then, if not nil, runs once the answer is queued.
func (c *conn) serveBeside(id json.RawMessage, isRequest bool, do func() *rpcError, then func()) {
	c.background <- struct{}{}
	go func() {
		defer func() { <-c.background }()
		if rerr := do(); isRequest {
			c.sendReply(answer(id, json.RawMessage("null"), rerr))
		}
		if then != nil {
			then()
		}
	}()
}

// awaitCreated waits until the terminal a request's params name as its
// channel, if the connection is starting it, has started or failed. It
// reports false when the connection ends meanwhile.
func (c *conn) awaitCreated(ctx context.Context, params json.RawMessage) bool {
	c.mu.Lock()
	none := len(c.creating) == 0
	c.mu.Unlock()
	if none {
		return true
	}
	var p struct {
		Channel string `json:"channel"`
	}
	if json.Unmarshal(params, &p) != nil {
		return true
	}
	c.mu.Lock()
	started := c.creating[p.Channel]
	c.mu.Unlock()
	if started == nil {
		return true
	}
	select {
	case <-started:
		return true
	case <-ctx.Done():
		return false
	}
}

// dispatch handles a client's action.
func (c *conn) dispatch(params json.RawMessage) {
	var p struct {
		Channel   string          `json:"channel"`
		ClientSeq int64           `json:"clientSeq"`
		Action    json.RawMessage `json:"action"`
	}
	perr := json.Unmarshal(params, &p)
	c.mu.Lock()
	origin := &Origin{ClientID: c.clientID, ClientSeq: p.ClientSeq}
	c.mu.Unlock()
	var a Action
	if perr == nil {
		perr = json.Unmarshal(p.Action, &a)
	}
	if perr != nil {
		// Every dispatch is answered, so the client can drop its
		// optimistic copy: this one with why it did not decode.
		c.s.mu.Lock()
		c.s.rejectLocked(c, p.Channel, p.Action, origin, fmt.Sprintf("malformed action: %v", perr))
		c.s.mu.Unlock()
		return
	}
	c.s.apply(c, p.Channel, a, p.Action, origin)
}
