package ahp

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/coder/websocket"
)

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
// the backlog; one answer, however big, always goes. It reports false
// once the connection ends.
func (c *conn) await(ctx context.Context) bool {
	// Otherwise a client that sends requests and reads no answers, behind
	// a writer stuck on its socket (flush leaves the queue to the writer
	// then), would grow them without bound. Its requests wait in its own
	// socket meanwhile: no other client, and no terminal, waits with it.
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
