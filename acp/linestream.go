package acp

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
)

// MaxMessageSize bounds one JSON-RPC message a proxy relays. A longer line
// is answered with an error and skipped; it never grows memory without
// bound.
const MaxMessageSize = 64 << 20

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

	// params are those of the request read last (Params).
	params json.RawMessage

	// late holds the error replies ReadObject makes, which a goroutine of
	// their own writes (started with the first): the reader must not wait
	// for the peer to read, or a peer that writes all its requests before
	// it reads waits for sandboxd as sandboxd waits for it. Beyond its
	// capacity the reader waits after all.
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

// streamedJSON is a value that encodes itself as JSON into a writer, a
// piece at a time, so that it is never held whole once encoded.
type streamedJSON interface {
	writeJSON(w *bufio.Writer) error
}

// replyChunk is the most of a streamed reply written at once.
const replyChunk = 64 << 10

// WriteReply writes the answer res to the request whose id is id, as the
// peer wrote it: {"id":...,"result":...,"jsonrpc":"2.0"}, the id first
// as the library writes its own answers. A result that is streamedJSON is
// encoded into the connection as it is written: what the reply holds is
// then bounded by what the peer reads, not by the result's encoded size.
func (s *LineStream) WriteReply(id json.RawMessage, res any) error {
	st, streamed := res.(streamedJSON)
	if !streamed {
		b, err := marshal(res)
		if err != nil {
			return err
		}
		return s.WriteLine(slices.Concat([]byte(`{"id":`), id, []byte(`,"result":`), b, []byte(`,"jsonrpc":"2.0"}`)))
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	w := bufio.NewWriterSize(s.w, replyChunk)
	w.WriteString(`{"id":`)
	w.Write(id)
	w.WriteString(`,"result":`)
	if err := st.writeJSON(w); err != nil {
		return err
	}
	w.WriteString(`,"jsonrpc":"2.0"}` + "\n")
	return w.Flush()
}

// writeJSONString writes b as the JSON string that encoding/json makes of
// string(b), without HTML escaping (as marshal), a chunk at a time.
func writeJSONString(w *bufio.Writer, b []byte) error {
	var chunk bytes.Buffer
	enc := json.NewEncoder(&chunk)
	enc.SetEscapeHTML(false)
	w.WriteByte('"')
	for len(b) > 0 {
		n := min(len(b), replyChunk/6) // at most 6 bytes for one
		if n < len(b) {
			// Never inside a character: each half would become
			// U+FFFD.
			for k := n - 1; k > n-utf8.UTFMax && k > 0; k-- {
				if utf8.RuneStart(b[k]) {
					if !utf8.FullRune(b[k:n]) {
						n = k
					}
					break
				}
			}
		}
		chunk.Reset()
		if err := enc.Encode(string(b[:n])); err != nil {
			return err
		}
		// Without the quotes and the newline Encode adds.
		if _, err := w.Write(chunk.Bytes()[1 : chunk.Len()-2]); err != nil {
			return err
		}
		b = b[n:]
	}
	return w.WriteByte('"')
}

// writeRaw writes one line that already ends with its newline, in one
// write, so a reader never sees half a message.
func (s *LineStream) writeRaw(line []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_, err := s.w.Write(line)
	return err
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

// readRaw returns the next line that is not blank, newline included, for a
// relay that forwards most lines untouched. A line that fits the read
// buffer is returned in place, without a copy: it is valid only until the
// next read. A last line without a newline gets one, unless it is no
// whole JSON value (the peer stopped in the middle). A line longer than
// the stream's bound is skipped and reported as errTooLong.
func (s *LineStream) readRaw() ([]byte, error) {
	for {
		line, err := s.r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			line, err = readRest(s.r, line, s.max)
			if errors.Is(err, io.EOF) && len(line) > 0 {
				err = nil
			}
		}
		if errors.Is(err, errTooLong) {
			return nil, err
		}
		if len(bytes.TrimSpace(line)) > 0 {
			if line[len(line)-1] != '\n' {
				if !json.Valid(line) {
					// Cut off by the peer's end: half a message
					// would reach the other side as one.
					return nil, io.EOF
				}
				line = append(line[:len(line):len(line)], '\n')
			}
			return line, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// trimEOL returns line without its line ending.
func trimEOL(line []byte) []byte {
	return bytes.TrimRight(line, "\r\n")
}

var errTooLong = errors.New("message longer than the maximum")

// tooLong is errTooLong with what the line said of itself (memberScan),
// so that its sender can be answered.
type tooLong struct{ members *memberScan }

func (e *tooLong) Error() string { return errTooLong.Error() }

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
			s.replyError(id, jsonrpc.InvalidRequest, fmt.Sprintf("message longer than %d bytes", s.max))
			continue
		}
		if err != nil {
			return err
		}
		if !json.Valid(line) {
			s.replyError(nil, jsonrpc.ParseError, "parse error: not valid JSON")
			continue
		}
		// The id, as the peer wrote it, decides what the JSON-RPC
		// library can be given.
		// Members by their exact names, the last of a repeat, as the
		// library reads them: a struct would also take "Id" for "id", and
		// the answer would carry an id the peer did not send. Found in
		// place: a copy of each would double what the line holds.
		head, err := memberMap(line) // a message that is no object fails below
		if errors.Is(err, errTooMany) {
			// Refused before it is built (each member would cost
			// tens of times its bytes).
			m := &memberScan{}
			m.Write(line)
			var id json.RawMessage
			if m.request {
				id = m.id
			}
			s.replyError(id, jsonrpc.InvalidRequest, fmt.Sprintf("invalid request: more than %d members", maxMembers))
			continue
		}
		id := head["id"]
		var version string
		_, hasMethod := head["method"]
		first := bytes.TrimLeft(line, " \t\r\n")
		if first[0] == '{' && (json.Unmarshal(head["jsonrpc"], &version) != nil || version != "2.0") {
			// The library ignores the member; JSON-RPC 2.0 says it must
			// be there and be exactly "2.0".
			s.replyError(id, jsonrpc.InvalidRequest, `invalid request: "jsonrpc" must be "2.0"`)
			continue
		}
		_, hasResult := head["result"]
		_, hasError := head["error"]
		if hasMethod && (hasResult || hasError) {
			// Neither request nor response: the library refused it
			// when it saw every member; it sees only a request's now.
			s.replyError(id, jsonrpc.InvalidRequest, "invalid request: a message with a method is a request, and has no result or error")
			continue
		}
		if hasMethod && string(id) == "null" {
			// The library takes it for a notification and would answer
			// nothing; the peer would wait for ever.
			s.replyError(nil, jsonrpc.InvalidRequest, errNullID.Message)
			continue
		}
		libID := id
		if len(id) > 0 && id[0] == '-' {
			if _, err := strconv.ParseInt(string(id), 10, 64); err != nil {
				s.replyError(id, jsonrpc.InvalidRequest, "invalid request: an id must be an integer or a string")
				continue
			}
			libID, _ = json.Marshal(negativeID + string(id))
		} else if str := ""; len(id) > 0 && json.Unmarshal(id, &str) == nil && strings.HasPrefix(str, negativeID) {
			s.replyError(id, jsonrpc.InvalidRequest, "invalid request: string ids starting with NUL are reserved")
			continue
		}
		if len(id) > maxIDSize {
			s.replyError(nil, jsonrpc.InvalidRequest, fmt.Sprintf("invalid request: an id longer than %d bytes", maxIDSize))
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
			s.replyError(id, jsonrpc.InvalidRequest, msg)
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
// or a response's result and error, and nothing else. A request's params
// are returned apart, as the peer sent them, for Params.
func slimMessage(head map[string]json.RawMessage, libID json.RawMessage) (msg []byte, params json.RawMessage) {
	// Unknown members are left out: the library would keep them with the
	// request for as long as it runs, decoded into generic values at tens
	// of times their size.
	slim := map[string]json.RawMessage{"jsonrpc": head["jsonrpc"]}
	if libID != nil {
		slim["id"] = libID
	}
	if method, ok := head["method"]; ok {
		slim["method"] = method
		// Kept from the library, which would decode them so and encode
		// them again; copied out of the line, which they would keep
		// whole.
		params = bytes.Clone(head["params"])
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
var errNullID = &jsonrpc2.Error{Code: jsonrpc.InvalidRequest, Message: "invalid request: a request id of null is not supported; use a number or a string"}

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
