package acp

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/sandboxd/sandboxd/internal/loglimit"
	"github.com/sandboxd/sandboxd/sandbox"
)

// MaxMessageSize bounds one JSON-RPC message a proxy relays. A longer line
// is answered with an error and skipped; it never grows memory without
// bound.
const MaxMessageSize = 64 << 20

// MaxRequestSize bounds one message to serve: terminal requests are small
// (an argument is at most 128 KiB, all of them and the environment a few
// MiB, as Linux takes), and the JSON-RPC library holds a message it
// decodes at many times its size.
const MaxRequestSize = 4 << 20

// LineStream is a jsonrpc2.ObjectStream of newline-delimited JSON objects,
// as ACP frames messages on stdio. A line that is not a JSON-RPC message is
// answered with a parse or invalid-request error and skipped, so one bad
// line does not end the connection.
type LineStream struct {
	r   *bufio.Reader
	w   io.Writer
	c   io.Closer
	log *slog.Logger
	// max bounds one message: MaxMessageSize, lower in tests.
	max int

	wmu sync.Mutex

	// late holds the error replies ReadObject makes, which a goroutine of
	// their own writes (started with the first): the reader must not wait
	// for the peer to read, or a peer that writes all its requests before
	// it reads waits for sandboxd as sandboxd waits for it. Beyond its
	// capacity the reader waits after all.
	// params are those of the request read last (Params).
	params json.RawMessage

	late      chan []byte
	lateOnce  sync.Once
	closed    chan struct{}
	closeOnce sync.Once
}

// lateReplies bounds the replies written for the reader of a connection.
const lateReplies = 256

// NewLineStream frames messages on rwc.
func NewLineStream(rwc io.ReadWriteCloser, log *slog.Logger) *LineStream {
	return &LineStream{r: bufio.NewReaderSize(rwc, 64<<10), w: rwc, c: rwc, log: log, max: MaxMessageSize,
		late: make(chan []byte, lateReplies), closed: make(chan struct{})}
}

// writeLater queues a line for the late writer.
func (s *LineStream) writeLater(b []byte) {
	s.lateOnce.Do(func() { go s.writeLate() })
	select {
	case s.late <- b:
	case <-s.closed:
	}
}

func (s *LineStream) writeLate() {
	for {
		select {
		case b := <-s.late:
			if err := s.WriteLine(b); err != nil {
				s.log.Debug("reply to bad message", "err", err)
			}
		case <-s.closed:
			return
		}
	}
}

// WriteObject writes obj as one line.
func (s *LineStream) WriteObject(obj any) error {
	b, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	return s.WriteLine(restoreNegativeID(b))
}

// negativeID marks, in a string id, a negative numeric id the peer sent:
// the JSON-RPC library keeps numeric ids unsigned, so ReadObject hands it
// such an id as this string, and WriteObject gives the answer the number
// back. A peer's own string id may not start with it.
const negativeID = "\x00negative id "

// restoreNegativeID puts the number back in a response whose id, its
// first member as the library writes it, is a negativeID string.
func restoreNegativeID(b []byte) []byte {
	head := []byte(`{"id":"\u0000negative id `)
	if !bytes.HasPrefix(b, head) {
		return b
	}
	n := bytes.IndexByte(b[len(head):], '"')
	if n < 0 {
		return b
	}
	num := b[len(head) : len(head)+n]
	return append(append([]byte(`{"id":`), num...), b[len(head)+n+1:]...)
}

// WriteLine writes one already-encoded message followed by a newline.
func (s *LineStream) WriteLine(b []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if _, err := s.w.Write(append(b, '\n')); err != nil {
		return err
	}
	return nil
}

// ReadLine returns the next non-empty line, without its newline. A line
// longer than the stream's bound is skipped and reported as errTooLong.
func (s *LineStream) ReadLine() ([]byte, error) {
	for {
		line, err := readLine(s.r, s.max)
		if errors.Is(err, errTooLong) {
			return nil, err
		}
		if len(bytes.TrimSpace(line)) > 0 {
			return line, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

var errTooLong = errors.New("message longer than the maximum")

// tooLong is errTooLong with what the line said of itself (memberScan),
// so that its sender can be answered.
type tooLong struct{ members *memberScan }

func (e *tooLong) Error() string        { return errTooLong.Error() }
func (e *tooLong) Is(target error) bool { return target == errTooLong }

// membersOf returns the id of the line an error from a read was about, if
// it was one too long, and whether it was a request or a response.
func membersOf(err error) (id json.RawMessage, request, response bool) {
	var tl *tooLong
	if errors.As(err, &tl) {
		return tl.members.id, tl.members.request, tl.members.response
	}
	return nil, false, false
}

func readLine(r *bufio.Reader, limit int) ([]byte, error) {
	line, err := readRest(r, nil, limit)
	return bytes.TrimRight(line, "\r\n"), err
}

// readRest reads a line whose start, head, was read already, into a copy.
// Beyond limit bytes it skips the rest of the line, so the next message
// still parses, and returns a *tooLong.
func readRest(r *bufio.Reader, head []byte, limit int) ([]byte, error) {
	line := append([]byte(nil), head...)
	for {
		chunk, err := r.ReadSlice('\n')
		if len(line)+len(chunk) > limit {
			// The rest is only looked through: the id may come last.
			m := &memberScan{}
			m.Write(line)
			m.Write(chunk)
			for errors.Is(err, bufio.ErrBufferFull) {
				chunk, err = r.ReadSlice('\n')
				m.Write(chunk)
			}
			return nil, &tooLong{members: m}
		}
		line = append(line, chunk...)
		if !errors.Is(err, bufio.ErrBufferFull) {
			return line, err
		}
	}
}

// ReadObject reads the next valid message into v.
func (s *LineStream) ReadObject(v any) error {
	for {
		line, err := s.ReadLine()
		if errors.Is(err, errTooLong) {
			var id json.RawMessage
			if rid, request, _ := membersOf(err); request {
				id = rid
			}
			s.replyError(id, CodeInvalidRequest, fmt.Sprintf("message longer than %d bytes", s.max))
			continue
		}
		if err != nil {
			return err
		}
		if !json.Valid(line) {
			s.replyError(nil, CodeParseError, "parse error: not valid JSON")
			continue
		}
		// The id, as the peer wrote it, decides what the JSON-RPC
		// library can be given.
		// Members by their exact names, the last of a repeat, as the
		// library reads them: a struct would also take "Id" for "id", and
		// the answer would carry an id the peer did not send.
		var head map[string]json.RawMessage
		json.Unmarshal(line, &head) // a message that is no object fails below
		id := head["id"]
		var jsonrpc string
		_, hasMethod := head["method"]
		first := bytes.TrimLeft(line, " \t\r\n")
		if first[0] == '{' && (json.Unmarshal(head["jsonrpc"], &jsonrpc) != nil || jsonrpc != "2.0") {
			// The library ignores the member; JSON-RPC 2.0 says it must
			// be there and be exactly "2.0".
			s.replyError(id, CodeInvalidRequest, `invalid request: "jsonrpc" must be "2.0"`)
			continue
		}
		_, hasResult := head["result"]
		_, hasError := head["error"]
		if hasMethod && (hasResult || hasError) {
			// Neither request nor response: the library refused it
			// when it saw every member; it sees only a request's now.
			s.replyError(id, CodeInvalidRequest, "invalid request: a message with a method is a request, and has no result or error")
			continue
		}
		if hasMethod && string(id) == "null" {
			// The library takes it for a notification and would answer
			// nothing; the peer would wait for ever.
			s.replyError(nil, CodeInvalidRequest, errNullID.Message)
			continue
		}
		libID := id
		if len(id) > 0 && id[0] == '-' {
			if _, err := strconv.ParseInt(string(id), 10, 64); err != nil {
				s.replyError(id, CodeInvalidRequest, "invalid request: an id must be an integer or a string")
				continue
			}
			libID, _ = json.Marshal(negativeID + string(id))
		} else if str := ""; len(id) > 0 && json.Unmarshal(id, &str) == nil && strings.HasPrefix(str, negativeID) {
			s.replyError(id, CodeInvalidRequest, "invalid request: string ids starting with NUL are reserved")
			continue
		}
		if len(id) > maxIDSize {
			s.replyError(nil, CodeInvalidRequest, fmt.Sprintf("invalid request: an id longer than %d bytes", maxIDSize))
			continue
		}
		var params json.RawMessage
		if head != nil {
			line, params = slimMessage(head, libID)
		}
		// Decoded into a zero message every time: a failed decode leaves
		// what it read of the request in v, which a response decoded
		// into it next would carry along, to be run after all.
		reflect.ValueOf(v).Elem().SetZero()
		if err := json.Unmarshal(line, v); err != nil {
			msg := "invalid request: not a JSON-RPC 2.0 message (an id is a number or a string, a method a string, params an object)"
			if first[0] == '[' {
				msg = errBatch.Message
			}
			// The id as the peer wrote it, not as rewritten above.
			s.replyError(id, CodeInvalidRequest, msg)
			reflect.ValueOf(v).Elem().SetZero()
			continue
		}
		s.params = params
		return nil
	}
}

// maxIDSize bounds a request id: an id is held, twice, for as long as its
// request runs.
const maxIDSize = 1024

// slimMessage is the message the JSON-RPC library is given for one read
// as head (its members): jsonrpc, id (as libID), and a request's method,
// or a response's result and error. Unknown members, which the library
// would keep with the request for as long as it runs, decoded into
// generic values at tens of times their size, are left out, and so are a
// request's params, which it would decode so and encode again: they are
// returned as the peer sent them, for Params.
func slimMessage(head map[string]json.RawMessage, libID json.RawMessage) (msg []byte, params json.RawMessage) {
	slim := map[string]json.RawMessage{"jsonrpc": head["jsonrpc"]}
	if libID != nil {
		slim["id"] = libID
	}
	if method, ok := head["method"]; ok {
		slim["method"] = method
		params = head["params"]
	} else {
		for _, k := range []string{"result", "error"} {
			if v, ok := head[k]; ok {
				slim[k] = v
			}
		}
	}
	msg, _ = json.Marshal(slim) // raw values of a valid message
	return msg, params
}

// Params returns, once, the params of the request ReadObject returned
// last, as the peer sent them (nil when it sent none). The library calls
// its handler for a request before it reads the next.
func (s *LineStream) Params() json.RawMessage {
	p := s.params
	s.params = nil
	return p
}

// errNullID answers a request whose id is null, which JSON-RPC 2.0 allows
// but discourages: sandboxd could not tell its answer from others'.
var errNullID = &jsonrpc2.Error{Code: CodeInvalidRequest, Message: "invalid request: a request id of null is not supported; use a number or a string"}

func (s *LineStream) replyError(id json.RawMessage, code int, msg string) {
	if id == nil {
		id = json.RawMessage("null")
	}
	s.log.Warn("bad message from peer", "code", code, "err", msg)
	b, err := json.Marshal(map[string]any{
		"jsonrpc": "2.0",
		"id":      id,
		"error":   map[string]any{"code": code, "message": msg},
	})
	if err != nil {
		s.log.Debug("reply to bad message", "err", err)
		return
	}
	s.writeLater(b)
}

// Close closes the underlying connection.
func (s *LineStream) Close() error {
	s.closeOnce.Do(func() { close(s.closed) })
	return s.c.Close()
}

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

// duplicateID refuses a request whose id one in flight already has: its
// answer and a $/cancel_request could not tell the two apart.
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

func duplicateID(id string) error {
	return &jsonrpc2.Error{Code: CodeInvalidRequest, Message: fmt.Sprintf("id %.100s is already in use by a request in flight", id)}
}

// reply writes the answer to a request itself, encoded once and without
// the HTML escaping encoding/json does by default: through the library a
// terminal's output (up to 16 MiB) was encoded twice, copied four times,
// and grew six-fold for every '<', '>' and '&'.
func (d *Dispatcher) reply(id jsonrpc2.ID, res any) error {
	if res == nil {
		res = json.RawMessage("null")
	}
	// In the member order of the library's own answers (errors), the id
	// first, where restoreNegativeID finds it.
	b, err := marshal(struct {
		ID      jsonrpc2.ID `json:"id"`
		Result  any         `json:"result"`
		JSONRPC string      `json:"jsonrpc"`
	}{id, res, "2.0"})
	if err != nil {
		return err
	}
	return d.stream.WriteLine(restoreNegativeID(b))
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
	conn := jsonrpc2.NewConn(ctx, stream, d, jsonrpc2.SetLogger(debugLog{log}))
	select {
	case <-conn.DisconnectNotify():
	case <-ctx.Done():
		conn.Close()
	}
	d.cancelAll()
	// Requests still waiting (wait_for_exit) end when their sessions close.
	cctx := context.WithoutCancel(ctx)
	err := t.Close(cctx)
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

// ListenUnix listens on a unix socket that only the owner may connect to.
// The socket is created with mode 0600 from the start, not chmod-ed after,
// so no other user can connect in between; and every connection's peer is
// checked, since an abstract socket (@name) has no mode at all. log takes
// the refusals.
func ListenUnix(path string, log *slog.Logger) (net.Listener, error) {
	ln, err := bindUnix(path)
	if err != nil {
		return nil, err
	}
	return &ownerListener{Listener: ln, uids: []uint32{uint32(os.Geteuid()), 0}, log: log}, nil
}

func bindUnix(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		// A socket left by a crashed instance; a live one would still
		// accept connections.
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("listen %s: another sandboxd is serving there", path)
		}
		os.Remove(path)
	}
	if strings.HasPrefix(path, "@") {
		// An abstract socket: no file, nothing to see before it listens.
		ln, err := net.Listen("unix", path)
		if err != nil {
			return nil, fmt.Errorf("listen %s: %w", path, err)
		}
		return ln, nil
	}
	// Bound under another name and linked into place once it listens:
	// between bind and listen the file is there but refuses connections,
	// and a client that waits for the file to appear would be refused. A
	// link, unlike a rename, fails when something took the name meanwhile
	// (another sandboxd starting on the same path), rather than replace it.
	suffix := make([]byte, 6)
	rand.Read(suffix)
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".%s.%x", filepath.Base(path), suffix))
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", tmp)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	err = os.Link(tmp, path)
	os.Remove(tmp)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	return ln, nil
}

// ownerListener accepts connections from processes of the given users
// only; others are closed at once.
type ownerListener struct {
	net.Listener
	uids     []uint32
	log      *slog.Logger
	refusals loglimit.Limit
}

func (l *ownerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uid, pid, err := peerCred(c)
		if err == nil && slices.Contains(l.uids, uid) {
			return c, nil
		}
		if n, ok := l.refusals.Allow(time.Now()); ok {
			if err == nil {
				err = fmt.Errorf("uid %d is not sandboxd's", uid)
			}
			l.log.Warn("connection from another user refused", "pid", pid, "err", err, "not_logged", n)
		}
		c.Close()
	}
}

// peerCred returns the user and process of a unix connection's peer, as
// the kernel recorded them when it connected.
func peerCred(c net.Conn) (uid uint32, pid int32, err error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0, 0, fmt.Errorf("peer credentials: %T is no unix connection", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, 0, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, 0, fmt.Errorf("peer credentials: %w", err)
	}
	if cerr != nil {
		return 0, 0, fmt.Errorf("peer credentials: %w", cerr)
	}
	return cred.Uid, cred.Pid, nil
}

// ServeListener accepts connections until ctx ends and serves each with its
// own Terminals, so connections never see each other's sessions.
func ServeListener(ctx context.Context, ln net.Listener, m *sandbox.Manager, workspace string, log *slog.Logger) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	var delay time.Duration
	for n := 1; ; n++ {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("accept: %w", err)
			}
			// Out of descriptors, say: the connections being served
			// must go on, and new ones are taken again once some end.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			log.Warn("accept failed; retrying", "err", err, "in", delay)
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return nil
			}
			n--
			continue
		}
		delay = 0
		wg.Add(1)
		go func() {
			defer wg.Done()
			clog := log.With("conn", n)
			clog.Info("connection opened")
			t := NewTerminals(m, fmt.Sprintf("conn%d", n), workspace, sandbox.SessionSpec{})
			if err := Serve(ctx, c, t, clog); err != nil {
				clog.Warn("connection closed with errors", "err", err)
			}
			clog.Info("connection closed")
		}()
	}
}
