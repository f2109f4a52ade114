package acp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/sandboxd/sandboxd/sandbox"
)

// echoHandler answers "echo" with its params and "block" when cancelled.
type echoHandler struct{}

func (echoHandler) Handle(ctx context.Context, method string, params json.RawMessage) (any, error) {
	switch method {
	case "echo":
		return params, nil
	case "params":
		// As a string, so that the answer shows the very bytes.
		return string(params), nil
	case "block":
		<-ctx.Done()
		return nil, &jsonrpc2.Error{Code: CodeCancelled, Message: "request cancelled"}
	}
	return nil, &jsonrpc2.Error{Code: CodeMethodNotFound, Message: "method not found: " + method}
}

type pipeConn struct {
	io.Reader
	io.Writer
}

func (pipeConn) Close() error { return nil }

// rawReply is where serveLines's recv keeps the reply line as written.
const rawReply = "\x00raw"

// serveLines runs the dispatcher over pipes and returns a way to send lines
// and read reply lines.
func serveLines(t *testing.T) (send func(string), recv func() map[string]any) {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	stream := NewLineStream(pipeConn{inR, outW}, log)
	conn := jsonrpc2.NewConn(context.Background(), stream, NewDispatcher(echoHandler{}, stream, log))
	t.Cleanup(func() {
		inW.Close()
		conn.Close()
	})
	r := bufio.NewReader(outR)
	send = func(line string) {
		if _, err := io.WriteString(inW, line+"\n"); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	recv = func() map[string]any {
		ch := make(chan []byte, 1)
		go func() {
			b, _ := r.ReadBytes('\n')
			ch <- b
		}()
		select {
		case b := <-ch:
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatalf("reply %q: %v", b, err)
			}
			if bytes.Count(b, []byte("\n")) != 1 {
				t.Fatalf("reply is not one line: %q", b)
			}
			m[rawReply] = string(b)
			return m
		case <-time.After(10 * time.Second):
			t.Fatal("no reply")
		}
		return nil
	}
	return send, recv
}

func errCode(m map[string]any) float64 {
	e, ok := m["error"].(map[string]any)
	if !ok {
		return 0
	}
	return e["code"].(float64)
}

func TestLineStreamSurvivesBadLines(t *testing.T) {
	send, recv := serveLines(t)
	tests := []struct {
		name string
		line string
		code float64
	}{
		{"truncated JSON", `{"jsonrpc":"2.0","id":1,"method":`, CodeParseError},
		{"not JSON", `hello`, CodeParseError},
		{"JSON but not a message", `{"jsonrpc":"2.0","id":5}`, CodeInvalidRequest},
		{"unknown method", `{"jsonrpc":"2.0","id":6,"method":"nope","params":{}}`, CodeMethodNotFound},
		{"no jsonrpc member", `{"id":8,"method":"echo","params":{}}`, CodeInvalidRequest},
		{"jsonrpc 1.0", `{"jsonrpc":"1.0","id":9,"method":"echo","params":{}}`, CodeInvalidRequest},
		{"jsonrpc a number", `{"jsonrpc":2.0,"id":10,"method":"echo","params":{}}`, CodeInvalidRequest},
		{"no jsonrpc member after a space", ` 	{"id":11,"method":"echo","params":{}}`, CodeInvalidRequest},
		// Only "id" is the id: an "Id" beside it is no member of JSON-RPC.
		{"an Id beside the id", `{"jsonrpc":"2.0","id":12,"Id":-1,"method":"nope","params":{}}`, CodeMethodNotFound},
		{"an ID of null beside the id", `{"jsonrpc":"2.0","id":13,"ID":null,"method":"nope","params":{}}`, CodeMethodNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			send(tc.line)
			rep := recv()
			if got := errCode(rep); got != tc.code {
				t.Errorf("code = %v, want %v", got, tc.code)
			}
			// Answered under the id sent, when it could be read.
			var sent map[string]any
			if json.Unmarshal([]byte(tc.line), &sent) == nil {
				if want, ok := sent["id"]; ok && rep["id"] != want {
					t.Errorf("answered id %v, want %v", rep["id"], want)
				}
			}
		})
	}
	// Blank lines are skipped and the connection still answers.
	send("")
	send(`{"jsonrpc":"2.0","id":7,"method":"echo","params":{"a":"line\nbreak"}}`)
	rep := recv()
	if rep["id"].(float64) != 7 || rep["result"].(map[string]any)["a"] != "line\nbreak" {
		t.Errorf("echo after bad lines = %v", rep)
	}
}

// TestLineStreamTooLong: a line too long to read is answered, with its id
// even when that comes after all the rest, and the next line is read.
func TestLineStreamTooLong(t *testing.T) {
	in := `{"jsonrpc":"2.0","method":"echo","params":"` + strings.Repeat("x", MaxMessageSize+10) + `","id":"big"}` + "\n" + `{"jsonrpc":"2.0","id":1,"method":"echo"}` + "\n"
	pr, pw := io.Pipe()
	s := NewLineStream(pipeConn{strings.NewReader(in), pw}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer s.Close()
	var req jsonrpc2.Request
	if err := s.ReadObject(&req); err != nil {
		t.Fatalf("ReadObject: %v", err)
	}
	if req.Method != "echo" {
		t.Errorf("method = %q", req.Method)
	}
	// The reply is written by a goroutine of its own, not the reader.
	out, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil || !strings.Contains(out, `"code":-32600`) || !strings.Contains(out, `"id":"big"`) {
		t.Errorf("no error reply to request big for the long line: %q, %v", out, err)
	}
}

func TestCancelRequest(t *testing.T) {
	send, recv := serveLines(t)
	send(`{"jsonrpc":"2.0","id":"w1","method":"block","params":{}}`)
	// A second request with the id of one in flight is refused: the
	// cancel below could not tell them apart.
	send(`{"jsonrpc":"2.0","id":"w1","method":"block","params":{}}`)
	if rep := recv(); rep["id"] != "w1" || errCode(rep) != CodeInvalidRequest {
		t.Errorf("reply = %v, want -32600 for the second w1", rep)
	}
	send(`{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"w1"}}`)
	rep := recv()
	if rep["id"] != "w1" || errCode(rep) != CodeCancelled {
		t.Errorf("reply = %v, want -32800 for w1", rep)
	}
	// Cancelling an unknown or finished request is harmless.
	send(`{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"w1"}}`)
	send(`{"jsonrpc":"2.0","method":"$/cancel_request","params":"junk"}`)
	send(`{"jsonrpc":"2.0","id":2,"method":"echo","params":{}}`)
	if rep := recv(); rep["id"].(float64) != 2 {
		t.Errorf("reply = %v", rep)
	}
}

func TestParamsNameTheField(t *testing.T) {
	tests := []struct {
		params string
		want   string
	}{
		{`null`, "params"},
		{`[1]`, "params"},
		{`{"sessionId":1}`, "sessionId: must be a string"},
		{`{}`, "sessionId: required"},
		{`{"sessionId":"a\u0000b"}`, "sessionId: contains a NUL byte"},
		{`{"sessionId":"` + strings.Repeat("s", 4097) + `"}`, "sessionId: 4097 bytes is longer than the 4096"},
	}
	for _, tc := range tests {
		f, err := decodeFields(json.RawMessage(tc.params), "")
		if err == nil {
			var s string
			err = get(f, "sessionId", true, &s)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.params, err, tc.want)
		}
	}
}

// flakyListener fails its first accepts, as a listener out of descriptors
// does, then hands out conns until closed.
type flakyListener struct {
	fails  int
	conns  chan net.Conn
	closed chan struct{}
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails > 0 {
		l.fails--
		return nil, errors.New("accept4: too many open files")
	}
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *flakyListener) Close() error {
	select {
	case <-l.closed:
	default:
		close(l.closed)
	}
	return nil
}

func (l *flakyListener) Addr() net.Addr { return &net.UnixAddr{Name: "flaky", Net: "unix"} }

func TestServeListenerOutlivesFailedAccepts(t *testing.T) {
	ln := &flakyListener{fails: 3, conns: make(chan net.Conn), closed: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- ServeListener(ctx, ln, nil, "/", slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	client, server := net.Pipe()
	defer client.Close()
	ln.conns <- server
	if _, err := io.WriteString(client, `{"jsonrpc":"2.0","id":1,"method":"nope"}`+"\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(client).ReadString('\n')
	if err != nil || !strings.Contains(line, `"code":-32601`) {
		t.Errorf("reply %q, %v: want method not found", line, err)
	}
	client.Close()
	cancel()
	if err := <-served; err != nil {
		t.Errorf("ServeListener: %v", err)
	}
}

func TestNegativeIDs(t *testing.T) {
	send, recv := serveLines(t)
	send(`{"jsonrpc":"2.0","id":-3,"method":"echo","params":{}}`)
	if rep := recv(); rep["id"] != float64(-3) || rep["error"] != nil {
		t.Errorf("reply = %v, want an answer to id -3", rep)
	}
	// Cancelled by its own negative id.
	send(`{"jsonrpc":"2.0","id":-9223372036854775808,"method":"block","params":{}}`)
	send(`{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":-9223372036854775808}}`)
	if rep := recv(); errCode(rep) != CodeCancelled {
		t.Errorf("reply = %v, want -32800", rep)
	}
	// Not integers, or the string form sandboxd keeps them in.
	send(`{"jsonrpc":"2.0","id":-1.5,"method":"echo","params":{}}`)
	if rep := recv(); rep["id"] != -1.5 || errCode(rep) != CodeInvalidRequest {
		t.Errorf("reply = %v, want -32600 for id -1.5", rep)
	}
	send(`{"jsonrpc":"2.0","id":"\u0000negative id -3","method":"echo","params":{}}`)
	if rep := recv(); errCode(rep) != CodeInvalidRequest {
		t.Errorf("reply = %v, want -32600 for a reserved string id", rep)
	}
	send(`{"jsonrpc":"2.0","id":4,"method":"echo","params":{}}`)
	if rep := recv(); rep["id"] != float64(4) || rep["error"] != nil {
		t.Errorf("reply = %v", rep)
	}
}

// TestRequestsReachTheHandlerAsSent: the handler gets a request's params
// byte for byte as the peer wrote them, and nothing of the members it does
// not know (which the JSON-RPC library would hold, decoded, at tens of
// times their size, for as long as the request runs); an id too long to
// hold is refused.
func TestRequestsReachTheHandlerAsSent(t *testing.T) {
	send, recv := serveLines(t)
	params := `{ "b":1.0e2, "a":"<\u00e9>", "c":[ ] }`
	send(`{"jsonrpc":"2.0","id":1,"method":"params","params":` + params + `,"x":[` + strings.Repeat(`{},`, 100000) + `{}],"meta":{"y":1}}`)
	rep := recv()
	if rep["result"] != params {
		t.Errorf("params reached the handler as %v, want %s", rep["result"], params)
	}
	// Answers are written without HTML escaping: a terminal's output of
	// '<' would grow six-fold.
	if raw := rep[rawReply].(string); !strings.Contains(raw, `"a\":\"<\\u00e9>\"`) {
		t.Errorf("answer %s: want '<' and '>' as they are", raw)
	}
	send(`{"jsonrpc":"2.0","id":2,"method":"params"}`)
	if rep := recv(); rep["result"] != "" || rep["id"] != float64(2) {
		t.Errorf("reply = %v, want no params", rep)
	}
	send(`{"jsonrpc":"2.0","id":"` + strings.Repeat("i", maxIDSize) + `","method":"echo","params":{}}`)
	if rep := recv(); errCode(rep) != CodeInvalidRequest || rep["id"] != nil {
		t.Errorf("reply = %v, want -32600 with a null id for an id too long", rep)
	}
	// A request and a response at once is neither.
	send(`{"jsonrpc":"2.0","id":4,"method":"echo","params":{},"result":1}`)
	if rep := recv(); errCode(rep) != CodeInvalidRequest || rep["id"] != float64(4) {
		t.Errorf("reply = %v, want -32600 for a message with a method and a result", rep)
	}
	send(`{"jsonrpc":"2.0","id":3,"method":"echo","params":{}}`)
	if rep := recv(); rep["id"] != float64(3) || rep["error"] != nil {
		t.Errorf("reply = %v", rep)
	}
}

func TestSlimMessage(t *testing.T) {
	for _, tc := range []struct {
		line, want, params string
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":1},"x":[1],"meta":2}`, `{"id":1,"jsonrpc":"2.0","method":"m"}`, `{"a":1}`},
		{`{"jsonrpc":"2.0","method":"m","params":null}`, `{"jsonrpc":"2.0","method":"m"}`, `null`},
		{`{"jsonrpc":"2.0","id":"a","result":{"r":1},"x":1}`, `{"id":"a","jsonrpc":"2.0","result":{"r":1}}`, ``},
		{`{"jsonrpc":"2.0","id":"a","error":{"code":1}}`, `{"error":{"code":1},"id":"a","jsonrpc":"2.0"}`, ``},
	} {
		var head map[string]json.RawMessage
		if err := json.Unmarshal([]byte(tc.line), &head); err != nil {
			t.Fatal(err)
		}
		msg, params := slimMessage(head, head["id"])
		if string(msg) != tc.want || string(params) != tc.params {
			t.Errorf("slimMessage(%s) = %s, %s; want %s, %s", tc.line, msg, params, tc.want, tc.params)
		}
	}
}

// TestIDReusedAfterItsAnswer: a peer may reuse an id as soon as it has the
// answer to it.
func TestIDReusedAfterItsAnswer(t *testing.T) {
	send, recv := serveLines(t)
	for i := range 2000 {
		send(`{"jsonrpc":"2.0","id":1,"method":"echo","params":{}}`)
		if rep := recv(); rep["error"] != nil {
			t.Fatalf("request %d: %v", i, rep)
		}
	}
}

// TestNullIDAndCancelAsRequestAreAnswered: a request with id null, which
// the JSON-RPC library would take for a notification, and a
// $/cancel_request sent as a request each get an answer.
func TestNullIDAndCancelAsRequestAreAnswered(t *testing.T) {
	send, recv := serveLines(t)
	send(`{"jsonrpc":"2.0","id":null,"method":"echo","params":{}}`)
	if rep := recv(); rep["id"] != nil || errCode(rep) != CodeInvalidRequest {
		t.Errorf("reply = %v, want -32600 with id null", rep)
	}
	send(`{"jsonrpc":"2.0","id":"c1","method":"$/cancel_request","params":{"requestId":"nothing"}}`)
	if rep := recv(); rep["id"] != "c1" || rep["error"] != nil {
		t.Errorf("reply = %v, want a result for c1", rep)
	}
	// A cancel naming id null cancels nothing, request 0 least of all.
	send(`{"jsonrpc":"2.0","id":0,"method":"block","params":{}}`)
	send(`{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":null}}`)
	send(`{"jsonrpc":"2.0","id":5,"method":"echo","params":{}}`)
	if rep := recv(); rep["id"] != float64(5) {
		t.Errorf("reply = %v, want the echo: request 0 was cancelled by a cancel of null", rep)
	}
	send(`{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":0}}`)
	if rep := recv(); rep["id"] != float64(0) || errCode(rep) != CodeCancelled {
		t.Errorf("reply = %v, want -32800 for 0", rep)
	}
}

// TestRejectedRequestNeverRuns: a request refused as invalid (here for its
// id) is not run later, when a response line is decoded after it; and the
// refusal carries the id as the peer wrote it, negative ones included.
func TestRejectedRequestNeverRuns(t *testing.T) {
	send, recv := serveLines(t)
	for _, tc := range []struct {
		line string
		id   any
		msg  string
	}{
		{`{"jsonrpc":"2.0","id":1.5,"method":"echo","params":{"ran":true}}`, 1.5, "not a JSON-RPC 2.0 message"},
		{`{"jsonrpc":"2.0","id":-5,"method":5}`, float64(-5), "not a JSON-RPC 2.0 message"},
		{`[{"jsonrpc":"2.0","id":3,"method":"echo"}]`, nil, "batches are not supported"},
	} {
		send(tc.line)
		rep := recv()
		if rep["id"] != tc.id || errCode(rep) != CodeInvalidRequest || !strings.Contains(rep["error"].(map[string]any)["message"].(string), tc.msg) {
			t.Errorf("%s: reply %v, want -32600 for id %v saying %q", tc.line, rep, tc.id, tc.msg)
		}
		send(`{"jsonrpc":"2.0","id":99,"result":null}`)
		send(`{"jsonrpc":"2.0","id":7,"method":"echo","params":{"next":true}}`)
		if rep := recv(); rep["id"] != float64(7) {
			t.Errorf("after %s and a response: %v, want the answer to 7 (the refused request ran)", tc.line, rep)
		}
	}
}

// TestDuplicateNegativeIDIsNamedAsSent: the error for an id in use shows
// the id the peer sent, not sandboxd's inner form of it.
func TestDuplicateNegativeIDIsNamedAsSent(t *testing.T) {
	send, recv := serveLines(t)
	send(`{"jsonrpc":"2.0","id":-7,"method":"block","params":{}}`)
	send(`{"jsonrpc":"2.0","id":-7,"method":"echo","params":{}}`)
	rep := recv()
	msg, _ := rep["error"].(map[string]any)["message"].(string)
	if rep["id"] != float64(-7) || !strings.Contains(msg, "id -7 is already in use") || strings.Contains(msg, "negative id") {
		t.Errorf("reply %v, want -32600 naming id -7", rep)
	}
	send(`{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":-7}}`)
	if rep := recv(); errCode(rep) != CodeCancelled {
		t.Errorf("reply %v, want the block cancelled", rep)
	}
}

// TestClosedTerminalsOpenNothing: a request still under way when its
// connection ends opens no session, which nothing would close.
func TestClosedTerminalsOpenNothing(t *testing.T) {
	terms := NewTerminals(nil, "c", "/w", sandbox.SessionSpec{})
	if err := terms.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := terms.open(context.Background(), "s", sandbox.SessionSpec{ID: "s", Workspace: "/w"}, nil, false); err != errClosed {
		t.Errorf("open after Close: %v, want errClosed", err)
	}
	terms.Prepare(sandbox.SessionSpec{ID: "p", Workspace: "/w"})
	if len(terms.sessions) != 0 {
		t.Errorf("sessions after Close: %v, want none", terms.sessions)
	}
}

// TestLibraryMessagesGoToTheDebugLog: a response nobody asked for is the
// JSON-RPC library's to report; it goes to sandboxd's debug log, which a
// peer cannot flood stderr through.
func TestLibraryMessagesGoToTheDebugLog(t *testing.T) {
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	in := strings.NewReader(`{"jsonrpc":"2.0","id":42,"result":null}` + "\n")
	if err := Serve(context.Background(), pipeConn{in, io.Discard}, NewTerminals(nil, "c", "/w", sandbox.SessionSpec{}), log); err != nil {
		t.Fatal(err)
	}
	if got := logs.String(); !strings.Contains(got, "level=DEBUG") || !strings.Contains(got, "ignoring response #42") {
		t.Errorf("logs %q, want the library's note at debug level", got)
	}
}

// TestCancelAsRequestWithAnIDInFlight: a $/cancel_request sent as a
// request under an id still in flight is refused like any request that
// reuses one, and cancels nothing.
func TestCancelAsRequestWithAnIDInFlight(t *testing.T) {
	send, recv := serveLines(t)
	send(`{"jsonrpc":"2.0","id":3,"method":"block","params":{}}`)
	send(`{"jsonrpc":"2.0","id":3,"method":"$/cancel_request","params":{"requestId":3}}`)
	if rep := recv(); rep["id"] != float64(3) || errCode(rep) != CodeInvalidRequest {
		t.Errorf("reply %v, want -32600 for the reused id", rep)
	}
	send(`{"jsonrpc":"2.0","id":4,"method":"echo","params":{}}`)
	if rep := recv(); rep["id"] != float64(4) {
		t.Errorf("reply %v, want the echo: the block was cancelled", rep)
	}
	send(`{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":3}}`)
	if rep := recv(); rep["id"] != float64(3) || errCode(rep) != CodeCancelled {
		t.Errorf("reply %v, want -32800 for 3", rep)
	}
}

// TestCreateNamesItemsByTheirPlace: an item of args or env is named by its
// place in what the peer sent, although items of the wrong shape before it
// are left out.
func TestCreateNamesItemsByTheirPlace(t *testing.T) {
	for _, tc := range []struct {
		params, want string
	}{
		{`{"sessionId":"s","command":"c","args":["a",5,"b\u0000"]}`, "args[2]: contains a NUL byte"},
		{`{"sessionId":"s","command":"c","args":[null,"` + strings.Repeat("x", sandbox.MaxArgLen) + `"]}`, "args[1]: 131072 bytes"},
		{`{"sessionId":"s","command":"c","env":[{"name":1,"value":"x"},{"name":"","value":"y"}]}`, "env[1].name: must not be empty"},
		{`{"sessionId":"s","command":"c","env":[{"name":"A"},{"name":"B=","value":"y"}]}`, "env[1].name: \"B=\" must not contain"},
		{`{"sessionId":"s","command":"c","env":[7,{"name":"SANDBOXD_TERMINAL","value":"y"}]}`, "env[1].name: SANDBOXD_TERMINAL is reserved"},
		{`{"sessionId":"s","command":"c","env":[7,{"name":"` + strings.Repeat("N", sandbox.MaxArgLen) + `","value":""}]}`, "env[1]: 131073 bytes"},
	} {
		_, err := (&Terminals{}).create(context.Background(), json.RawMessage(tc.params))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("%.120s: err = %v, want %q", tc.params, err, tc.want)
		}
	}
}

// TestServeEndsWhileAReplyCannotBeWritten: a peer that stops reading
// leaves a reply blocked in its write; a shutdown must end Serve all the
// same, within stopTimeout, not wait for that write for ever.
func TestServeEndsWhileAReplyCannotBeWritten(t *testing.T) {
	in, inW := io.Pipe()
	defer inW.Close()
	out := &stuckWriter{entered: make(chan struct{}), release: make(chan struct{})}
	defer close(out.release)
	ctx, cancel := context.WithCancel(context.Background())
	var logs syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, pipeConn{in, out}, NewTerminals(nil, "c", "/w", sandbox.SessionSpec{}), slog.New(slog.NewTextHandler(&logs, nil)))
	}()
	for i := range 3 {
		fmt.Fprintf(inW, `{"jsonrpc":"2.0","id":%d,"method":"no/such"}`+"\n", i)
	}
	<-out.entered
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
		if !strings.Contains(logs.String(), "replies unwritten") {
			t.Errorf("logs %q, want the reply left blocked named", logs.String())
		}
	case <-time.After(stopTimeout + 20*time.Second):
		t.Fatal("Serve did not end after its context was cancelled while a reply was blocked")
	}
}

// stuckWriter is a peer that stops reading: every write blocks until
// release.
type stuckWriter struct {
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (w *stuckWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.entered) })
	<-w.release
	return 0, io.ErrClosedPipe
}

func TestWorkGroupStartsNothingOnceStopping(t *testing.T) {
	var g workGroup
	release := make(chan struct{})
	if !g.Go(func() { <-release }) {
		t.Fatal("Go before Stop refused")
	}
	if g.Stop(10 * time.Millisecond) {
		t.Error("Stop reported all work ended while one still blocks")
	}
	ran := false
	if g.Go(func() { ran = true }) {
		t.Error("Go after Stop started work")
	}
	close(release)
	if !g.Stop(time.Minute) {
		t.Error("Stop did not see the work end")
	}
	if ran {
		t.Error("work refused by Go ran")
	}
}

// TestListenUnix: the socket appears under its name only once it listens
// (a client waiting for the file is never refused), with mode 0600 and no
// other file left beside it; a live one is not taken over, a stale one is.
func TestListenUnix(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	path := filepath.Join(dir, "sandboxd.sock")
	ln, err := ListenUnix(path, quiet)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket file: %v, %v; want a socket of mode 0600", fi, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("files beside the socket: %v", entries)
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c.Close()
	if _, err := ListenUnix(path, quiet); err == nil || !strings.Contains(err.Error(), "another sandboxd") {
		t.Errorf("a second listen on a live socket: %v", err)
	}
	ln.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the socket file went with the listener: %v (its owner removes it)", err)
	}
	ln, err = ListenUnix(path, quiet)
	if err != nil {
		t.Fatalf("listen over a stale socket: %v", err)
	}
	ln.Close()
	// What is no socket is never replaced.
	file := filepath.Join(dir, "a-file")
	if err := os.WriteFile(file, []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ListenUnix(file, quiet); err == nil {
		t.Error("listen on a regular file's path: no error")
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "mine" {
		t.Errorf("the file after a listen on its path: %q, %v", b, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("files left: %v, want the socket and the file", entries)
	}
}

// TestListenUnixServesTheOwnerOnly: a connection from another user is
// closed unanswered and logged, also on an abstract socket, which has no
// file mode to keep others out; the owner's is served.
func TestListenUnixServesTheOwnerOnly(t *testing.T) {
	for _, path := range []string{filepath.Join(t.TempDir(), "s.sock"), fmt.Sprintf("@sandboxd-test-%d", os.Getpid())} {
		t.Run(path, func(t *testing.T) {
			for _, owner := range []bool{false, true} {
				var logs syncBuffer
				ln, err := ListenUnix(path, slog.New(slog.NewTextHandler(&logs, nil)))
				if err != nil {
					t.Fatal(err)
				}
				if !owner {
					// As if another user connected.
					ln.(*ownerListener).uids = []uint32{uint32(os.Geteuid()) + 1}
				}
				accepted := make(chan net.Conn, 1)
				go func() {
					c, err := ln.Accept()
					if err == nil {
						accepted <- c
					}
				}()
				c, err := net.Dial("unix", path)
				if err != nil {
					t.Fatal(err)
				}
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				if owner {
					select {
					case s := <-accepted:
						s.Close()
					case <-time.After(10 * time.Second):
						t.Error("the owner's connection was not accepted")
					}
				} else {
					if n, err := c.Read(make([]byte, 1)); err != io.EOF {
						t.Errorf("another user's connection: read %d, %v; want it closed", n, err)
					}
					if !strings.Contains(logs.String(), "connection from another user refused") {
						t.Errorf("log %q, want the refusal", logs.String())
					}
				}
				c.Close()
				ln.Close()
			}
		})
	}
}
