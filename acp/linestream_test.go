package acp

import (
	"bufio"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
)

func TestWrapReadRaw(t *testing.T) {
	long := `{"x":"` + strings.Repeat("é", 70<<10) + `"}`
	tests := []struct {
		name, in string
		want     []string
	}{
		{"lines", "one\n\n  \r\ntwo\r\n" + long + "\n", []string{"one\n", "two\r\n", long + "\n"}},
		{"last line without newline", "one\n{\"id\":1}", []string{"one\n", "{\"id\":1}\n"}},
		// The peer ended in the middle of a message: half of it must
		// not reach the other side.
		{"cut last line", "one\n{\"id\":1,\"method\":\"x", []string{"one\n"}},
		{"cut long last line", long[:len(long)-2], nil},
	}
	for _, tc := range tests {
		s := NewLineStream(pipeConn{Reader: strings.NewReader(tc.in)}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		for _, want := range tc.want {
			got, err := s.readRaw()
			if err != nil || string(got) != want {
				t.Fatalf("%s: readRaw = %.40q, %v; want %.40q", tc.name, got, err, want)
			}
		}
		if got, err := s.readRaw(); err != io.EOF {
			t.Errorf("%s: at the end: %.40q, %v, want EOF", tc.name, got, err)
		}
	}
}

func TestLineStreamSurvivesBadLines(t *testing.T) {
	send, recv := serveLines(t)
	tests := []struct {
		name string
		line string
		code float64
	}{
		{"truncated JSON", `{"jsonrpc":"2.0","id":1,"method":`, jsonrpc.ParseError},
		{"not JSON", `hello`, jsonrpc.ParseError},
		{"JSON but not a message", `{"jsonrpc":"2.0","id":5}`, jsonrpc.InvalidRequest},
		{"unknown method", `{"jsonrpc":"2.0","id":6,"method":"nope","params":{}}`, jsonrpc.MethodNotFound},
		{"no jsonrpc member", `{"id":8,"method":"echo","params":{}}`, jsonrpc.InvalidRequest},
		{"jsonrpc 1.0", `{"jsonrpc":"1.0","id":9,"method":"echo","params":{}}`, jsonrpc.InvalidRequest},
		{"jsonrpc a number", `{"jsonrpc":2.0,"id":10,"method":"echo","params":{}}`, jsonrpc.InvalidRequest},
		{"no jsonrpc member after a space", ` 	{"id":11,"method":"echo","params":{}}`, jsonrpc.InvalidRequest},
		// Only "id" is the id: an "Id" beside it is no member of JSON-RPC.
		{"an Id beside the id", `{"jsonrpc":"2.0","id":12,"Id":-1,"method":"nope","params":{}}`, jsonrpc.MethodNotFound},
		{"an ID of null beside the id", `{"jsonrpc":"2.0","id":13,"ID":null,"method":"nope","params":{}}`, jsonrpc.MethodNotFound},
		// Refused before a member is built, under its id all the same.
		{"too many members", `{"jsonrpc":"2.0","id":14,"method":"echo",` + strings.Repeat(`"x":1,`, maxMembers) + `"params":{}}`, jsonrpc.InvalidRequest},
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
	if rep := recv(); errCode(rep) != jsonrpc.InvalidRequest || rep["id"] != nil {
		t.Errorf("reply = %v, want -32600 with a null id for an id too long", rep)
	}
	// A request and a response at once is neither.
	send(`{"jsonrpc":"2.0","id":4,"method":"echo","params":{},"result":1}`)
	if rep := recv(); errCode(rep) != jsonrpc.InvalidRequest || rep["id"] != float64(4) {
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
		if rep["id"] != tc.id || errCode(rep) != jsonrpc.InvalidRequest || !strings.Contains(rep["error"].(map[string]any)["message"].(string), tc.msg) {
			t.Errorf("%s: reply %v, want -32600 for id %v saying %q", tc.line, rep, tc.id, tc.msg)
		}
		send(`{"jsonrpc":"2.0","id":99,"result":null}`)
		send(`{"jsonrpc":"2.0","id":7,"method":"echo","params":{"next":true}}`)
		if rep := recv(); rep["id"] != float64(7) {
			t.Errorf("after %s and a response: %v, want the answer to 7 (the refused request ran)", tc.line, rep)
		}
	}
}
