package acp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
)

// TestCancelledReleaseStillReleases: a terminal/release asked off while
// its kill waits has released the terminal all the same (its id is gone,
// the sweep ends what is left), and says so rather than -32800.
func TestCancelledReleaseStillReleases(t *testing.T) {
	e := newFakeEngine(t)
	terms := newTerminals(e.m, "test", t.TempDir(), sandbox.SessionSpec{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := terms.create(ctx, json.RawMessage(`{"sessionId":"s","command":"sleep","args":["60"]}`))
	if err != nil {
		t.Fatal(err)
	}
	id := res.(CreateTerminalResponse).TerminalID
	params := json.RawMessage(`{"sessionId":"s","terminalId":"` + id + `"}`)
	// A terminal/kill under way, whose signal's exec the engine holds:
	// the release waits on it.
	before := e.Execs.Load()
	killed := make(chan error, 1)
	go func() {
		_, err := terms.kill(ctx, params)
		killed <- err
	}()
	for e.Execs.Load() == before {
		if ctx.Err() != nil {
			t.Fatal("the kill sent no signal")
		}
		time.Sleep(time.Millisecond)
	}
	asked, off := context.WithCancel(ctx)
	off()
	if _, err := terms.release(asked, params); err != nil {
		t.Errorf("release asked off: %v, want it released", err)
	}
	if _, err := terms.output(ctx, params); err == nil || !strings.Contains(err.Error(), "unknown terminal") {
		t.Errorf("output after the release: %v, want the terminal unknown", err)
	}
	close(e.Output) // every exec ends: the kill's and the sweep's too
	if err := <-killed; err != nil {
		t.Errorf("kill: %v", err)
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

// TestOutputReplyIsTerminalOutputResponse: a terminal/output answer,
// encoded a chunk at a time into the connection, is byte for byte what
// encoding/json makes of a TerminalOutputResponse: control bytes, HTML
// characters, U+2028, bytes that are no UTF-8, characters across chunks.
func TestOutputReplyIsTerminalOutputResponse(t *testing.T) {
	chunk := replyChunk / 6
	long := bytes.Repeat([]byte("é"), chunk) // 2 bytes each: chunks cut one
	for i := range long {
		if i%7919 == 0 {
			long[i] = 0xff
		}
	}
	code := 3
	for _, tc := range []struct {
		name   string
		out    []byte
		status *ExitStatus
	}{
		{"empty", nil, nil},
		{"control", bytes.Repeat([]byte{1}, 3*chunk+5), &ExitStatus{ExitCode: &code}},
		{"special", []byte("a<b>&c\u2028\u2029\"\\\t\n\r\x7f\xe2\x82"), nil},
		{"characters cut by chunks", long, nil},
		{"four-byte characters", bytes.Repeat([]byte("x😀"), chunk), nil},
	} {
		want, err := marshal(TerminalOutputResponse{Output: string(tc.out), Truncated: true, ExitStatus: tc.status})
		if err != nil {
			t.Fatal(err)
		}
		r := outputReply{out: tc.out, truncated: true, status: tc.status}
		got, err := marshal(r)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: marshalled %.200s, %v; want %.200s", tc.name, got, err, want)
		}
		var line bytes.Buffer
		s := NewLineStream(pipeConn{strings.NewReader(""), &line}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err := s.WriteReply(json.RawMessage(`-4`), r); err != nil {
			t.Fatal(err)
		}
		if w := `{"id":-4,"result":` + string(want) + `,"jsonrpc":"2.0"}` + "\n"; line.String() != w {
			t.Errorf("%s: streamed %.200s, want %.200s", tc.name, line.String(), w)
		}
	}
}

// TestCreateThatCannotRunOpensNoSession: a command refused as it is (here:
// args past what execve takes) is refused before its session is opened.
func TestCreateThatCannotRunOpensNoSession(t *testing.T) {
	e := newFakeEngine(t)
	terms := newTerminals(e.m, "test", t.TempDir(), sandbox.SessionSpec{})
	args := `"` + strings.Repeat("a", 100<<10) + `",`
	params := `{"sessionId":"s","command":"true","args":[` + strings.Repeat(args, 20) + `"a"]}`
	_, err := terms.create(context.Background(), json.RawMessage(params))
	if err == nil || !strings.Contains(err.Error(), "more than the") {
		t.Fatalf("create past ARG_MAX: %v, want it refused", err)
	}
	if n := e.m.Sessions(); n != 0 {
		t.Errorf("%d sessions opened for it", n)
	}
}
