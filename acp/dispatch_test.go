package acp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
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
		return nil, &jsonrpc2.Error{Code: jsonrpc.RequestCancelled, Message: "request cancelled"}
	}
	return nil, &jsonrpc2.Error{Code: jsonrpc.MethodNotFound, Message: "method not found: " + method}
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

func TestCancelRequest(t *testing.T) {
	send, recv := serveLines(t)
	send(`{"jsonrpc":"2.0","id":"w1","method":"block","params":{}}`)
	// A second request with the id of one in flight is refused: the
	// cancel below could not tell them apart.
	send(`{"jsonrpc":"2.0","id":"w1","method":"block","params":{}}`)
	if rep := recv(); rep["id"] != "w1" || errCode(rep) != jsonrpc.InvalidRequest {
		t.Errorf("reply = %v, want -32600 for the second w1", rep)
	}
	send(`{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"w1"}}`)
	rep := recv()
	if rep["id"] != "w1" || errCode(rep) != jsonrpc.RequestCancelled {
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

func TestNegativeIDs(t *testing.T) {
	send, recv := serveLines(t)
	send(`{"jsonrpc":"2.0","id":-3,"method":"echo","params":{}}`)
	if rep := recv(); rep["id"] != float64(-3) || rep["error"] != nil {
		t.Errorf("reply = %v, want an answer to id -3", rep)
	}
	// Cancelled by its own negative id.
	send(`{"jsonrpc":"2.0","id":-9223372036854775808,"method":"block","params":{}}`)
	send(`{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":-9223372036854775808}}`)
	if rep := recv(); errCode(rep) != jsonrpc.RequestCancelled {
		t.Errorf("reply = %v, want -32800", rep)
	}
	// Not integers, or the string form sandboxd keeps them in.
	send(`{"jsonrpc":"2.0","id":-1.5,"method":"echo","params":{}}`)
	if rep := recv(); rep["id"] != -1.5 || errCode(rep) != jsonrpc.InvalidRequest {
		t.Errorf("reply = %v, want -32600 for id -1.5", rep)
	}
	send(`{"jsonrpc":"2.0","id":"\u0000negative id -3","method":"echo","params":{}}`)
	if rep := recv(); errCode(rep) != jsonrpc.InvalidRequest {
		t.Errorf("reply = %v, want -32600 for a reserved string id", rep)
	}
	send(`{"jsonrpc":"2.0","id":4,"method":"echo","params":{}}`)
	if rep := recv(); rep["id"] != float64(4) || rep["error"] != nil {
		t.Errorf("reply = %v", rep)
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
	if rep := recv(); rep["id"] != nil || errCode(rep) != jsonrpc.InvalidRequest {
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
	if rep := recv(); rep["id"] != float64(0) || errCode(rep) != jsonrpc.RequestCancelled {
		t.Errorf("reply = %v, want -32800 for 0", rep)
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
	if rep := recv(); errCode(rep) != jsonrpc.RequestCancelled {
		t.Errorf("reply %v, want the block cancelled", rep)
	}
}

// TestLibraryMessagesGoToTheDebugLog: a response nobody asked for is the
// JSON-RPC library's to report; it goes to sandboxd's debug log, which a
// peer cannot flood stderr through.
func TestLibraryMessagesGoToTheDebugLog(t *testing.T) {
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	in := strings.NewReader(`{"jsonrpc":"2.0","id":42,"result":null}` + "\n")
	if err := Serve(context.Background(), pipeConn{in, io.Discard}, newTerminals(nil, "c", "/w", sandbox.SessionSpec{}), log); err != nil {
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
	if rep := recv(); rep["id"] != float64(3) || errCode(rep) != jsonrpc.InvalidRequest {
		t.Errorf("reply %v, want -32600 for the reused id", rep)
	}
	send(`{"jsonrpc":"2.0","id":4,"method":"echo","params":{}}`)
	if rep := recv(); rep["id"] != float64(4) {
		t.Errorf("reply %v, want the echo: the block was cancelled", rep)
	}
	send(`{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":3}}`)
	if rep := recv(); rep["id"] != float64(3) || errCode(rep) != jsonrpc.RequestCancelled {
		t.Errorf("reply %v, want -32800 for 3", rep)
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
		done <- Serve(ctx, pipeConn{in, out}, newTerminals(nil, "c", "/w", sandbox.SessionSpec{}), slog.New(slog.NewTextHandler(&logs, nil)))
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
