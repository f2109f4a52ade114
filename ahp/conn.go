package ahp

import (
	"bytes"
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
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
			c.reply(nil, nil, &rpcError{Code: jsonrpc.InvalidRequest, Message: "messages are JSON-RPC in text frames"})
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

// readMessage reads the next message. Waiting for one is not bounded, but
// once one has begun the rest must arrive within the read timeout,
// extended as its bytes arrive at minWriteRate or faster; the connection
// is cut off when it expires.
func (c *conn) readMessage(ctx context.Context) (websocket.MessageType, []byte, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Not bounded: a connection may be quiet for hours.
	typ, r, err := c.ws.Reader(rctx)
	if err != nil {
		return 0, nil, err
	}
	// Bounded once begun: a client that stopped part-way through a
	// message would otherwise hold it, up to the read limit, for ever.
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

func (c *conn) close() {
	c.closeOnce.Do(func() { close(c.done) })
}

func (c *conn) subscribed(channel string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.subs[channel]
}
