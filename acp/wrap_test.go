package acp

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/limits"
	"github.com/sandboxd/sandboxd/sandbox"
)

// TestWrapRelaysTheAgentsLastLines: the agent wrote its last lines and
// exited while the relay still waited for the editor to read the first.
// Neither a line of the editor's, whose write to the gone agent fails, nor
// an editor slower to read than the agent's drain time may end the relay
// before the rest reached the editor.
func TestWrapRelaysTheAgentsLastLines(t *testing.T) {
	for _, slow := range []bool{false, true} {
		t.Run(fmt.Sprintf("slow editor %v", slow), func(t *testing.T) {
			dir := t.TempDir()
			exited := filepath.Join(dir, "exited")
			// a is longer than the pipe holds, so b is written only once
			// the relay has taken all of a, and stays in the pipe while
			// the relay waits for the editor to read a.
			script := `read l; printf '{"jsonrpc":"2.0","method":"a","params":{"pad":"%0200000d"}}\n' 0; echo '{"jsonrpc":"2.0","method":"b"}'; : > "$1"; exit 3`
			edInR, edInW := io.Pipe()
			edOutR, edOutW := io.Pipe()
			done := make(chan int, 1)
			go func() {
				// Limits of their own: no spare container, so no manager
				// needed.
				terms := newTerminals(nil, "t", "/", sandbox.SessionSpec{Limits: limits.Limits{Pids: 10}})
				code, _ := Wrap(context.Background(), terms, pipeConn{edInR, edOutW}, Agent{Argv: []string{"sh", "-c", script, "sh", exited}, Stderr: io.Discard, Grace: time.Second}, slog.New(slog.NewTextHandler(io.Discard, nil)))
				done <- code
			}()
			io.WriteString(edInW, `{"jsonrpc":"2.0","method":"x"}`+"\n")
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				if _, err := os.Stat(exited); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the agent did not get to its end")
				}
			}
			if slow {
				// The editor's slowness is what is tested, not a wait for
				// an event: it reads after the agent's drain time.
				time.Sleep(drainTimeout + 500*time.Millisecond)
			} else {
				// Written to an agent that is gone (or about to be).
				go io.WriteString(edInW, `{"jsonrpc":"2.0","method":"y"}`+"\n")
			}
			editor := bufio.NewReader(edOutR)
			for _, want := range []string{`"method":"a"`, `"method":"b"`} {
				if got := recv(t, editor); !strings.Contains(got, want) {
					t.Fatalf("editor got %.100q, want the agent's line with %s", got, want)
				}
			}
			edInW.Close()
			select {
			case code := <-done:
				if code != 3 {
					t.Errorf("wrap exited %d, want the agent's 3", code)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("wrap did not end")
			}
		})
	}
}
