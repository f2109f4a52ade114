package acp

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
)

// MaxRequestSize bounds one message to serve: terminal requests are small
// (an argument is at most 128 KiB, all of them and the environment a few
// MiB, as Linux takes), and the JSON-RPC library holds a message it
// decodes at many times its size.
const MaxRequestSize = 4 << 20

// RequestHandler answers one request by method and params.
type RequestHandler interface {
	Handle(ctx context.Context, method string, params json.RawMessage) (any, error)
}

// Dispatcher is a jsonrpc2.Handler that runs every request in its own
// goroutine, so a long terminal/wait_for_exit does not hold up others, and
// cancels a request's context on $/cancel_request.
type Dispatcher struct {
	h      RequestHandler
	stream *LineStream // of the connection, for each request's params
	log    *slog.Logger

	limit *requestLimiter
	// late bounds the replies the reader hands to goroutines of their
	// own, for the reason LineStream.late gives.
	late chan struct{}

	// work is the requests in flight and the replies written apart.
	work workGroup

	mu      sync.Mutex
	pending map[string]context.CancelFunc
}

// NewDispatcher wraps h, for a connection that reads from stream.
func NewDispatcher(h RequestHandler, stream *LineStream, log *slog.Logger) *Dispatcher {
	return &Dispatcher{h: h, stream: stream, log: log, pending: make(map[string]context.CancelFunc), limit: newRequestLimiter(), late: make(chan struct{}, lateReplies)}
}

// Handle implements jsonrpc2.Handler. It is called in message order, so a
// request's cancel func is registered before any later $/cancel_request for
// it is seen.
func (d *Dispatcher) Handle(ctx context.Context, conn *jsonrpc2.Conn, req *jsonrpc2.Request) {
	params := d.stream.Params()
	if req.Method == MethodCancel {
		if !req.Notif && d.inFlight(req.ID) {
			// Its answer would be a second one to the request in flight.
			d.later(func() { d.replyError(ctx, conn, req, duplicateID(idText(req.ID))) })
			return
		}
		d.cancel(params)
		if !req.Notif {
			// Sent as a request: it gets its answer.
			d.later(func() {
				if err := conn.Reply(ctx, req.ID, nil); err != nil {
					d.log.Debug("reply", "method", req.Method, "err", err)
				}
			})
		}
		return
	}
	if req.Notif {
		d.notified(ctx, req, params)
		return
	}
	if d.inFlight(req.ID) {
		d.later(func() { d.replyError(ctx, conn, req, duplicateID(idText(req.ID))) })
		return
	}
	key := req.ID.String()
	release, err := d.limit.acquire(req.Method, len(params)+2*len(key))
	if err != nil {
		d.later(func() { d.replyError(ctx, conn, req, err) })
		return
	}
	rctx, cancel := context.WithCancel(ctx)
	d.mu.Lock()
	d.pending[key] = cancel
	d.mu.Unlock()
	started := d.work.Go(func() {
		defer release() // after the reply is written: it holds the memory
		res, built, err := d.limit.run(rctx, d.h, req.Method, params)
		defer built() // after the reply is written
		// Before the reply: a peer may reuse the id as soon as it has it.
		d.mu.Lock()
		delete(d.pending, key)
		d.mu.Unlock()
		cancel()
		if err != nil {
			d.replyError(ctx, conn, req, err)
			return
		}
		if rerr := d.reply(req.ID, res); rerr != nil {
			d.log.Debug("reply", "method", req.Method, "err", rerr)
		}
	})
	if !started {
		// The connection is ending: the peer gets no more answers.
		d.mu.Lock()
		delete(d.pending, key)
		d.mu.Unlock()
		cancel()
		release()
	}
}

// notified acts on a notification that asks for something done without an
// answer: JSON-RPC still runs it. Of the terminal methods only kill and
// release mean anything without their answer.
func (d *Dispatcher) notified(ctx context.Context, req *jsonrpc2.Request, params json.RawMessage) {
	if !actsWithoutAnswer(req.Method) {
		d.log.Debug("ignored notification", "method", req.Method)
		return
	}
	release, err := d.limit.acquire(req.Method, len(params))
	if err != nil {
		d.log.Warn("notification not run", "method", req.Method, "err", err)
		return
	}
	started := d.work.Go(func() {
		defer release()
		_, built, err := d.limit.run(ctx, d.h, req.Method, params)
		built()
		if err != nil {
			d.log.Warn("notification", "method", req.Method, "err", err)
		}
	})
	if !started {
		release()
	}
}

// actsWithoutAnswer tells the terminal methods that do something when sent
// as notifications.
func actsWithoutAnswer(method string) bool {
	return method == "terminal/kill" || method == "terminal/release"
}

// inFlight reports whether a request with id is still being answered.
func (d *Dispatcher) inFlight(id jsonrpc2.ID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.pending[id.String()]
	return ok
}

// idText shows a request id as the peer wrote it.
func idText(id jsonrpc2.ID) string {
	if id.IsString && strings.HasPrefix(id.Str, negativeID) {
		return strings.TrimPrefix(id.Str, negativeID)
	}
	return id.String()
}

// duplicateID refuses a request whose id one in flight already has: its
// answer and a $/cancel_request could not tell the two apart.
func duplicateID(id string) error {
	return &jsonrpc2.Error{Code: jsonrpc.InvalidRequest, Message: fmt.Sprintf("id %.100s is already in use by a request in flight", id)}
}

// reply writes the answer to a request itself, encoded once and without
// the HTML escaping encoding/json does by default (through the library a
// terminal's output, up to 16 MiB, was encoded twice, copied four times,
// and grew six-fold for every '<', '>' and '&'); a terminal's output is
// encoded into the connection as the peer reads it (WriteReply).
func (d *Dispatcher) reply(id jsonrpc2.ID, res any) error {
	if res == nil {
		res = json.RawMessage("null")
	}
	wire := json.RawMessage(strings.TrimPrefix(id.Str, negativeID))
	if !id.IsString || !strings.HasPrefix(id.Str, negativeID) {
		b, err := marshal(id)
		if err != nil {
			return err
		}
		wire = b
	}
	return d.stream.WriteReply(wire, res)
}

func (d *Dispatcher) replyError(ctx context.Context, conn *jsonrpc2.Conn, req *jsonrpc2.Request, err error) {
	if rerr := conn.ReplyWithError(ctx, req.ID, rpcError(ctx, err)); rerr != nil {
		d.log.Debug("reply", "method", req.Method, "err", rerr)
	}
}

// later writes a reply the reader makes in a goroutine of its own, at most
// lateReplies at once; beyond them the reader writes it itself.
func (d *Dispatcher) later(reply func()) {
	select {
	case d.late <- struct{}{}:
		started := d.work.Go(func() {
			defer func() { <-d.late }()
			reply()
		})
		if !started {
			<-d.late // the connection is ending: no more answers
		}
	default:
		reply()
	}
}

func (d *Dispatcher) cancel(params json.RawMessage) {
	if params == nil {
		return
	}
	var p struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	var id jsonrpc2.ID
	if err := json.Unmarshal(params, &p); err != nil || len(p.RequestID) == 0 || string(p.RequestID) == "null" {
		d.log.Debug("bad $/cancel_request", "err", err)
		return
	}
	if _, err := strconv.ParseInt(string(p.RequestID), 10, 64); err == nil && p.RequestID[0] == '-' {
		id = jsonrpc2.ID{Str: negativeID + string(p.RequestID), IsString: true}
	} else if err := json.Unmarshal(p.RequestID, &id); err != nil {
		d.log.Debug("bad $/cancel_request", "err", err)
		return
	}
	d.mu.Lock()
	cancel := d.pending[id.String()]
	d.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// cancelAll cancels every request in flight: their peer is gone.
func (d *Dispatcher) cancelAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, cancel := range d.pending {
		cancel()
	}
}

// Serve answers ACP terminal requests on rwc until the peer disconnects,
// then closes every session the connection opened.
func Serve(ctx context.Context, rwc io.ReadWriteCloser, t *Terminals, log *slog.Logger) error {
	stream := NewLineStream(rwc, log)
	stream.max = MaxRequestSize
	d := NewDispatcher(t, stream, log)
	d.limit.shared = t.scope.Config().RequestMemory()
	conn := jsonrpc2.NewConn(ctx, stream, d, jsonrpc2.SetLogger(debugLog{log}))
	select {
	case <-conn.DisconnectNotify():
	case <-ctx.Done():
		conn.Close()
	}
	d.cancelAll()
	// Requests still waiting (wait_for_exit) end when their sessions close.
	cctx := context.WithoutCancel(ctx)
	err := t.scope.Close(cctx)
	// A reply blocked writing to a peer that stopped reading may never
	// end; shutdown must go on all the same.
	if !d.work.Stop(stopTimeout) {
		log.Warn("connection ended with replies unwritten (a peer that does not read?)", "waited", stopTimeout)
	}
	return err
}

// debugLog takes the JSON-RPC library's own messages (a response nobody
// asked for, say) to the debug log: a peer could otherwise fill stderr.
type debugLog struct{ log *slog.Logger }

func (l debugLog) Printf(format string, args ...any) {
	l.log.Debug(strings.TrimSpace(fmt.Sprintf(format, args...)))
}
