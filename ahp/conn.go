package ahp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// conn is one client connection.
type conn struct {
	s  *Server
	ws *websocket.Conn

	mu       sync.Mutex
	clientID string
	subs     map[string]bool
	// creating are the terminals the connection's createTerminal starts,
	// by channel, each closed once it is served or failed: a request that
	// names one waits for it (awaitCreated).
	creating map[string]chan struct{}

	// queue holds the messages the writer has yet to send and queued their
	// bytes; a client further behind than Config.Backlog is disconnected
	// rather than allowed to grow memory.
	qmu    sync.Mutex
	queue  []outgoing
	queued int
	wake   chan struct{} // capacity 1: the queue is not empty
	// writing says a goroutine is draining the queue: the writer, or the
	// reader after handling a message. quiet says the reader will drain
	// it, so a send need not wake the writer: answers and the echoes of
	// a client's own actions then leave without a hand-off between
	// goroutines, which costs a thread wake-up on the keystroke's path.
	writing, quiet bool
	// replies is what the answers to the client's requests hold, queued
	// or being written; they do not count against the backlog (one may
	// be far bigger than it), but while they exceed it the reader reads
	// no more requests (await). drained is signalled as they are written.
	replies int
	drained chan struct{} // capacity 1

	// background bounds the requests served away from the reader (a
	// terminal's start, its disposal): beyond it, the reader waits for
	// one to end.
	background chan struct{}

	// refused is set by the reader when it refused the client's protocol
	// versions: the connection ends once that answer is written.
	refused bool

	done      chan struct{}
	closeOnce sync.Once
	// ctx bounds the connection; abort cancels it, which cuts the
	// connection off and so unblocks a write to a client that stopped
	// reading.
	ctx   context.Context
	abort context.CancelFunc
}

func newConn(ctx context.Context, s *Server, ws *websocket.Conn) *conn {
	ctx, cancel := context.WithCancel(ctx)
	return &conn{s: s, ws: ws, subs: make(map[string]bool), creating: make(map[string]chan struct{}), wake: make(chan struct{}, 1), drained: make(chan struct{}, 1),
		background: make(chan struct{}, maxBackground), done: make(chan struct{}), ctx: ctx, abort: cancel}
}

// maxBackground is how many starts and disposals of terminals of one
// connection run at once.
const maxBackground = 16

func (c *conn) subscribed(channel string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.subs[channel]
}

// outgoing is a message queued for the client: msg, or what build makes
// when it is written; size is what it holds, or about (build); counted
// says it counts against the backlog.
type outgoing struct {
	msg     []byte
	build   func() []byte
	size    int
	counted bool
}

// bytes is the message as it is written.
func (o outgoing) bytes() []byte {
	if o.build != nil {
		return o.build()
	}
	return o.msg
}

// send queues msg for the client without blocking: it runs under the
// server's lock.
func (c *conn) send(msg []byte) { c.enqueue(outgoing{msg: msg, size: len(msg), counted: true}) }

// sendReply queues an answer to the client's request. It does not count
// against the backlog, which would cut off a client asking for a snapshot
// bigger than that; await bounds the answers instead.
func (c *conn) sendReply(msg []byte) { c.enqueue(outgoing{msg: msg, size: len(msg)}) }

func (c *conn) enqueue(o outgoing) {
	counted := o.counted
	c.qmu.Lock()
	if counted && c.queued > 0 && c.queued+o.size > c.s.cfg.Backlog {
		backlog := c.queued
		c.qmu.Unlock()
		select {
		case <-c.done:
		default:
			c.mu.Lock()
			id := c.clientID
			c.mu.Unlock()
			c.s.log.Warn("ahp client too slow; disconnecting", "client", id, "backlog", backlog)
			c.close()
			c.abort()
		}
		return
	}
	c.queue = append(c.queue, o)
	if counted {
		c.queued += o.size
	} else {
		c.replies += o.size
	}
	wake := !c.writing && !c.quiet
	c.qmu.Unlock()
	if wake {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// hold makes sends leave waking the writer to the reader's flush, which
// must follow.
func (c *conn) hold() {
	c.qmu.Lock()
	c.quiet = true
	c.qmu.Unlock()
}

// flush drains the queue in the calling goroutine unless another one
// does. The reader calls it after every message.
func (c *conn) flush(ctx context.Context) {
	c.qmu.Lock()
	c.quiet = false
	if c.writing || len(c.queue) == 0 {
		c.qmu.Unlock()
		return
	}
	c.writing = true
	c.qmu.Unlock()
	c.drain(ctx)
}

// drain writes what is queued until the queue is empty, then gives up the
// writing role. The caller holds it.
func (c *conn) drain(ctx context.Context) {
	var batch []outgoing
	for {
		c.qmu.Lock()
		if len(c.queue) == 0 {
			c.writing = false
			c.qmu.Unlock()
			return
		}
		batch, c.queue = c.queue, batch[:0]
		// What is being written no longer counts against the backlog:
		// a snapshot bigger than it would otherwise cut its client off
		// at the next action, and again at every reconnect.
		for _, o := range batch {
			if o.counted {
				c.queued -= o.size
			}
		}
		c.qmu.Unlock()
		for i, o := range batch {
			if err := c.writeMessage(ctx, o.bytes()); err != nil {
				c.close()
				return
			}
			if !o.counted {
				c.qmu.Lock()
				c.replies -= o.size
				c.qmu.Unlock()
				select {
				case c.drained <- struct{}{}:
				default:
				}
			}
			batch[i] = outgoing{}
		}
	}
}

// minWriteRate is the slowest a client may take in a message, in bytes per
// second, beyond the write timeout; and the slowest it may send one
// beyond the read timeout.
const minWriteRate = 256 << 10

// writeTimeout is how long a message of n bytes may take to write: a big
// snapshot gets longer, at minWriteRate, so that a slow link does not have
// it cut off, and reconnect for it, over and over.
func writeTimeout(base time.Duration, n int) time.Duration {
	return base + time.Duration(n/minWriteRate)*time.Second
}

// readMessage reads the next message. Waiting for one is not bounded (a
// connection may be quiet for hours), but once one has begun the rest
// must arrive within the read timeout, extended as its bytes arrive at
// minWriteRate or faster: otherwise a client that stopped part-way
// through a message would hold it, up to the read limit, for ever. The
// connection is cut off when it expires.
func (c *conn) readMessage(ctx context.Context) (websocket.MessageType, []byte, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	typ, r, err := c.ws.Reader(rctx)
	if err != nil {
		return 0, nil, err
	}
	start := time.Now()
	var expired atomic.Bool
	timer := time.AfterFunc(c.s.cfg.ReadTimeout, func() {
		expired.Store(true)
		cancel()
	})
	defer timer.Stop()
	var buf bytes.Buffer
	for {
		n, err := buf.ReadFrom(io.LimitReader(r, minWriteRate))
		if err != nil {
			if expired.Load() {
				c.mu.Lock()
				id := c.clientID
				c.mu.Unlock()
				c.s.log.Warn("ahp client stopped in the middle of a message; disconnecting", "client", id, "bytes", buf.Len())
			}
			return 0, nil, err
		}
		if n < minWriteRate {
			return typ, buf.Bytes(), nil
		}
		timer.Reset(time.Until(start.Add(writeTimeout(c.s.cfg.ReadTimeout, buf.Len()))))
	}
}

// writeMessage writes one message, within the server's write timeout: a
// client that stays connected but stops reading would otherwise hold the
// writer, and what is queued behind it, for ever. The connection is cut
// off when it expires.
func (c *conn) writeMessage(ctx context.Context, msg []byte) error {
	timeout := writeTimeout(c.s.cfg.WriteTimeout, len(msg))
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := c.ws.Write(wctx, websocket.MessageText, msg)
	if err != nil && ctx.Err() == nil && errors.Is(wctx.Err(), context.DeadlineExceeded) {
		c.mu.Lock()
		id := c.clientID
		c.mu.Unlock()
		c.s.log.Warn("ahp client not reading; disconnecting", "client", id, "timeout", timeout, "bytes", len(msg))
		c.abort()
	}
	return err
}

// await holds the reader while the answers waiting for the client exceed
// the backlog; one answer, however big, always goes. Otherwise a client
// that sends requests and reads no answers, behind a writer stuck on its
// socket (flush leaves the queue to the writer then), would grow them
// without bound. Its requests wait in its own socket meanwhile: no other
// client, and no terminal, waits with it. It reports false once the
// connection ends.
func (c *conn) await(ctx context.Context) bool {
	for {
		c.qmu.Lock()
		over := c.replies > c.s.cfg.Backlog
		c.qmu.Unlock()
		if !over {
			return true
		}
		// Whoever holds the writing role writes the answers, or fails
		// and closes the connection: after flush that is the writer.
		select {
		case <-c.drained:
		case <-c.done:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// write drains the queue whenever a send wakes it, until the connection
// ends.
func (c *conn) write(ctx context.Context) {
	for {
		select {
		case <-c.wake:
		case <-c.done:
			c.ws.Close(websocket.StatusGoingAway, "closing")
			return
		}
		c.qmu.Lock()
		if c.writing {
			c.qmu.Unlock()
			continue
		}
		c.writing = true
		c.qmu.Unlock()
		c.drain(ctx)
	}
}

func (c *conn) close() {
	c.closeOnce.Do(func() { close(c.done) })
}

func (c *conn) run() {
	ctx := c.ctx
	defer c.abort()
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		c.write(ctx)
	}()
	defer func() {
		c.close()
		<-wrote
	}()
	for {
		typ, data, err := c.readMessage(ctx)
		if err != nil {
			return
		}
		if typ != websocket.MessageText {
			c.reply(nil, nil, &rpcError{Code: codeInvalidRequest, Message: "messages are JSON-RPC in text frames"})
		} else {
			c.handle(ctx, data)
		}
		c.flush(ctx)
		if c.refused {
			// The versioning rules: answer UnsupportedProtocolVersion,
			// then close. Nothing but that answer was queued: a client
			// not initialized is subscribed to nothing.
			c.ws.Close(websocket.StatusPolicyViolation, "unsupported protocol version")
			return
		}
		if !c.await(ctx) {
			return
		}
	}
}

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

func (c *conn) reply(id json.RawMessage, result any, rerr *rpcError) {
	c.hold() // replies are sent by the reader
	// Made into JSON when written, not here: a snapshot's answer is
	// queued under the server lock (no newer action may overtake it),
	// and a big one would hold every terminal up while it was encoded.
	c.enqueue(outgoing{build: func() []byte { return answer(id, result, rerr) }, size: answerSize(result)})
}

// answerSize is about what an answer holds: its snapshots' states or its
// replayed actions, and some for the rest.
func answerSize(result any) int {
	n := 256
	var add func(v any)
	add = func(v any) {
		switch v := v.(type) {
		case snapshot:
			n += v.size
		case []any:
			for _, x := range v {
				add(x)
			}
		case []Envelope:
			for _, e := range v {
				n += e.size()
			}
		case map[string]any:
			for _, x := range v {
				add(x)
			}
		}
	}
	add(result)
	return n
}

// answer is the response to request id.
func answer(id json.RawMessage, result any, rerr *rpcError) []byte {
	if id == nil {
		id = json.RawMessage("null")
	}
	m := map[string]any{"jsonrpc": "2.0", "id": id}
	if rerr != nil {
		m["error"] = rerr
	} else {
		m["result"] = result
	}
	b, _ := json.Marshal(m)
	return b
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
	return &rpcError{Code: codeInvalidParams, Message: fmt.Sprintf(format, args...)}
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
		c.reply(nil, nil, &rpcError{Code: codeParse, Message: "parse error: " + err.Error()})
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
		c.reply(requestID(m.ID), nil, &rpcError{Code: codeInvalidRequest, Message: "invalid request: " + why})
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
		rerr = &rpcError{Code: codeInvalidRequest, Message: m.Method + ": the connection is already initialized"}
	case !handshake && !known:
		rerr = &rpcError{Code: codeInvalidRequest, Message: fmt.Sprintf("%.100s: initialize (or reconnect) first", m.Method)}
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
			c.refused = rerr != nil && rerr.Code == codeUnsupportedProto
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
		rerr = &rpcError{Code: codeMethodNotFound, Message: fmt.Sprintf("method not found: %.100s", m.Method)}
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
		return nil, &rpcError{Code: codeUnsupportedProto, Message: fmt.Sprintf("none of the protocol versions %.200s is spoken here (%s)", fmt.Sprint(p.ProtocolVersions), strings.Join(supportedVersions(), ", ")), Data: map[string]any{"supportedVersions": supportedVersions()}}
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
		return nil, &rpcError{Code: codeNotFound, Message: fmt.Sprintf("subscribe: unknown channel %.200q", p.Channel)}
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
