package acp

import (
	"context"
	"encoding/json"
	"errors"
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
