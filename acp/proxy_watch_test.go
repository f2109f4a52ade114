package acp

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestWrapProxyFirstRefreshWaits: the rewritten tool call that starts a
// text watch carries the output already, so the first refresh comes no
// sooner than refreshInterval after it.
func TestWrapProxyFirstRefreshWaits(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.newSession(t, "s")
	id := pp.createTerminal(t, ``)
	// Taken before the tool call is sent, so the proxy's own moment of
	// showing it is later: a slow test run cannot make the wait look short.
	shown := time.Now()
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"terminal","terminalId":"`+id+`"}]}}}`+"\n")
	if got := recv(t, pp.editor); !strings.Contains(got, `"sessionUpdate":"tool_call"`) || strings.Contains(got, id+`"}`) {
		t.Fatalf("editor got %q, want the tool call with the terminal as text", got)
	}
	e.Output <- []byte("building\n")
	got := recv(t, pp.editor)
	if since := time.Since(shown); since < refreshInterval*8/10 {
		t.Errorf("first refresh %v after the tool call, want %v or more", since, refreshInterval)
	}
	if !strings.Contains(got, `"sessionUpdate":"tool_call_update"`) || !strings.Contains(got, `building\n`) {
		t.Errorf("editor got %q, want a refresh with the output", got)
	}
	close(e.Output)
	if got := recv(t, pp.editor); !strings.Contains(got, `[exit code 0]`) {
		t.Errorf("editor got %q, want the output with the exit code", got)
	}
}

// TestWrapProxyMarksOutputItCouldNotShow: an editor that renders terminal
// _meta is told how much output went by between two refreshes that the
// terminal's outputByteLimit did not keep, instead of losing it silently.
func TestWrapProxyMarksOutputItCouldNotShow(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.rendersTerminalMeta()
	pp.newSession(t, "s")
	id := pp.createTerminal(t, `,"outputByteLimit":4`)
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"terminal","terminalId":"`+id+`"}],"_meta":{"z":1, "a":[2]}}}}`+"\n")
	// terminal_info joins the agent's own _meta; nothing else changes.
	head := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"terminal","terminalId":"` + id + `"}],"_meta":{"terminal_info":{"terminal_id":"` + id + `","cwd":"/`
	tail := `"},"z":1, "a":[2]}}}}` + "\n"
	if got := recv(t, pp.editor); !strings.HasPrefix(got, head) || !strings.HasSuffix(got, tail) {
		t.Fatalf("editor got %q, want %q...%q", got, head, tail)
	}
	e.Output <- []byte("0123456789")
	want := `"data":"\r\n[sandboxd: 6 bytes of output not shown]\r\n6789"`
	if got := recv(t, pp.editor); !strings.Contains(got, want) {
		t.Errorf("editor got %q, want terminal_output with %s", got, want)
	}
	close(e.Output)
	if got := recv(t, pp.editor); !strings.Contains(got, `"terminal_exit"`) {
		t.Errorf("editor got %q, want terminal_exit", got)
	}
}

// TestWrapProxyShowsALateTerminalAsTextToZed: Zed makes its terminal view
// only from a tool_call; a terminal first shown in a tool_call_update
// reaches it as text, refreshed, like any editor's.
func TestWrapProxyShowsALateTerminalAsTextToZed(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.rendersTerminalMeta()
	pp.newSession(t, "s")
	id := pp.createTerminal(t, ``)
	call := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","title":"make"}}}` + "\n"
	send(t, pp.toProxyFromAgent, call)
	if got := recv(t, pp.editor); got != call {
		t.Fatalf("editor got %q, want the tool call as it was", got)
	}
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","content":[{"type":"terminal","terminalId":"`+id+`"}]}}}`+"\n")
	if got := recv(t, pp.editor); strings.Contains(got, "terminal_info") || strings.Contains(got, `"terminalId"`) || !strings.Contains(got, `"type":"text"`) {
		t.Errorf("editor got %q, want the terminal as text", got)
	}
	e.Output <- []byte("building\n")
	if got := recv(t, pp.editor); !strings.Contains(got, `building\n`) {
		t.Errorf("editor got %q, want a refresh with the output", got)
	}
	close(e.Output)
	if got := recv(t, pp.editor); !strings.Contains(got, `[exit code 0]`) {
		t.Errorf("editor got %q, want the output with the exit code", got)
	}
}

// TestWrapProxyUpdateRepeatingItsTerminalsKeepsTheContent: a status
// change that names the same terminals again does not send their whole
// output once more; the editor keeps what the refreshes gave it.
func TestWrapProxyUpdateRepeatingItsTerminalsKeepsTheContent(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.newSession(t, "s")
	id := pp.createTerminal(t, ``)
	content := `[{"type":"terminal","terminalId":"` + id + `"}]`
	update := func(kind, more string) string {
		line := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"` + kind + `","toolCallId":"c"` + more + `}}}` + "\n"
		send(t, pp.toProxyFromAgent, line)
		return recv(t, pp.editor)
	}
	if got := update("tool_call", `,"title":"make","content":`+content); !strings.Contains(got, `"content":[{`) {
		t.Fatalf("tool call reached the editor as %q, want its content as text", got)
	}
	tests := []struct {
		name, kind, more string
		wantContent      bool
	}{
		{"same terminals", "tool_call_update", `,"status":"in_progress","content":` + content, false},
		{"other content", "tool_call_update", `,"content":[{"type":"content","content":{"type":"text","text":"note"}},` + content[1:], true},
		{"a tool call replaces all", "tool_call", `,"title":"make","content":[{"type":"content","content":{"type":"text","text":"note"}},` + content[1:], true},
	}
	for _, tc := range tests {
		got := update(tc.kind, tc.more)
		if has := strings.Contains(got, `"content":[`); has != tc.wantContent {
			t.Errorf("%s: editor got %q, want content: %v", tc.name, got, tc.wantContent)
		}
		// The rest of the agent's message reaches the editor as written.
		want := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","status":"in_progress"}}}` + "\n"
		if tc.kind == "tool_call_update" && !tc.wantContent && got != want {
			t.Errorf("%s: editor got %q, want %q", tc.name, got, want)
		}
	}
}

// TestWrapProxyCompletionKeepsTheFinalOutput: the agent's update that
// completes a tool call names its ended terminal again; the editor, which
// got the final output already, gets the update without the output once
// more. Other content afterwards still replaces it.
func TestWrapProxyCompletionKeepsTheFinalOutput(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.newSession(t, "s")
	id := pp.createTerminal(t, ``)
	content := `[{"type":"terminal","terminalId":"` + id + `"}]`
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","title":"make","content":`+content+`}}}`+"\n")
	if got := recv(t, pp.editor); !strings.Contains(got, `"type":"text"`) {
		t.Fatalf("editor got %q, want the terminal as text", got)
	}
	e.Output <- []byte("built\n")
	close(e.Output)
	waitExited(t, e, id)
	completed := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","status":"completed","content":` + content + `}}}` + "\n"
	send(t, pp.toProxyFromAgent, completed)
	if got := recv(t, pp.editor); !strings.Contains(got, `built\n\n[exit code 0]`) {
		t.Fatalf("editor got %q, want the final output", got)
	}
	want := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","status":"completed"}}}` + "\n"
	if got := recv(t, pp.editor); got != want {
		t.Errorf("editor got %q, want %q", got, want)
	}
	// Once more: still nothing to send again.
	send(t, pp.toProxyFromAgent, completed)
	if got := recv(t, pp.editor); got != want {
		t.Errorf("editor got %q, want %q", got, want)
	}
	note := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","content":[{"type":"content","content":{"type":"text","text":"note"}}]}}}` + "\n"
	send(t, pp.toProxyFromAgent, note)
	if got := recv(t, pp.editor); got != note {
		t.Errorf("editor got %q, want the note as sent", got)
	}
	// The terminal shown again after other content: its output again.
	send(t, pp.toProxyFromAgent, completed)
	if got := recv(t, pp.editor); !strings.Contains(got, `built\n\n[exit code 0]`) || !strings.Contains(got, `"status":"completed"`) {
		t.Errorf("editor got %q, want the output with the update", got)
	}
}

// TestWrapProxyEndedContentIsWhatTheEditorHas: the shortcut of
// TestWrapProxyCompletionKeepsTheFinalOutput holds only while the editor
// shows those terminals: not after the agent replaced them (and then sent
// empty content), nor after a permission request showed other content.
func TestWrapProxyEndedContentIsWhatTheEditorHas(t *testing.T) {
	for _, tc := range []struct {
		name, between string
		running       bool // between comes while the terminal runs
	}{
		{"replaced while running, then empty", `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","content":[{"type":"content","content":{"type":"text","text":"done"}}]}}}`, true},
		{"replaced after the end, then empty", `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","content":[{"type":"content","content":{"type":"text","text":"done"}}]}}}`, false},
		{"a permission request with other content", `{"jsonrpc":"2.0","id":7,"method":"session/request_permission","params":{"sessionId":"s","toolCall":{"toolCallId":"c","content":[{"type":"content","content":{"type":"text","text":"allow?"}}]},"options":[]}}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEngine(t)
			pp := startProxyWith(t, e.m)
			pp.newSession(t, "s")
			id := pp.createTerminal(t, ``)
			content := `[{"type":"terminal","terminalId":"` + id + `"}]`
			send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":`+content+`}}}`+"\n")
			recv(t, pp.editor)
			if !tc.running {
				close(e.Output)
				waitExited(t, e, id)
			}
			send(t, pp.toProxyFromAgent, tc.between+"\n")
			for got := recv(t, pp.editor); !strings.Contains(got, `"done"`) && !strings.Contains(got, `"allow?"`); got = recv(t, pp.editor) {
				// the final refresh comes first
			}
			if tc.running {
				close(e.Output)
				waitExited(t, e, id)
			}
			next := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","content":[]}}}` + "\n"
			if !strings.HasPrefix(tc.name, "replaced") {
				next = `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","content":` + content + `}}}` + "\n"
			}
			send(t, pp.toProxyFromAgent, next)
			if got := recv(t, pp.editor); !strings.Contains(got, `"content":[`) {
				t.Errorf("editor got %q, want the update with its content", got)
			}
		})
	}
}

// TestWrapProxyFinalOutputBeforeTheAnswer: the final output of a terminal
// the agent waited for reaches the editor before the agent's next update
// and its answer to the prompt, not after them, in either form.
func TestWrapProxyFinalOutputBeforeTheAnswer(t *testing.T) {
	for _, meta := range []bool{false, true} {
		e := newFakeEngine(t)
		pp := startProxyWith(t, e.m)
		final := `[exit code 0]`
		if meta {
			pp.rendersTerminalMeta()
			final = `"terminal_exit"`
		}
		pp.newSession(t, "s")
		id := pp.createTerminal(t, ``)
		send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"terminal","terminalId":"`+id+`"}]}}}`+"\n")
		if got := recv(t, pp.editor); !strings.Contains(got, `"sessionUpdate":"tool_call"`) {
			t.Fatalf("editor got %q, want the tool call", got)
		}
		// The editor reads all along, as an editor does.
		lines := make(chan string, 64)
		go func() {
			for {
				line, err := pp.editor.ReadString('\n')
				if err != nil {
					close(lines)
					return
				}
				lines <- line
			}
		}()
		e.Output <- []byte("hello\n")
		close(e.Output)
		send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","id":5,"method":"terminal/wait_for_exit","params":{"sessionId":"s","terminalId":"`+id+`"}}`+"\n")
		if got := recv(t, pp.agent); !strings.Contains(got, `"exitCode":0`) {
			t.Fatalf("agent got %q, want the exit", got)
		}
		send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","status":"completed"}}}`+"\n"+
			`{"jsonrpc":"2.0","id":77,"result":{"stopReason":"end_turn"}}`+"\n")
		var seen []string
	read:
		for {
			select {
			case got := <-lines:
				if strings.Contains(got, `"status":"completed"`) || strings.Contains(got, `"id":77`) {
					break read
				}
				seen = append(seen, got)
			case <-time.After(5 * time.Second):
				t.Fatalf("meta %v: the agent's update did not come", meta)
			}
		}
		if !slices.ContainsFunc(seen, func(l string) bool {
			return strings.Contains(l, final) && strings.Contains(l, "hello") || meta && strings.Contains(l, final)
		}) {
			t.Errorf("meta %v: before the agent's next messages the editor got %q, want the final output", meta, seen)
		}
	}
}

// TestWrapProxyShowsARepeatedTerminalOnce: a tool call that names one
// terminal many times shows its output once, so the line to the editor
// grows with the message, not with the square of the repeats.
func TestWrapProxyShowsARepeatedTerminalOnce(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.newSession(t, "s")
	id := pp.createTerminal(t, ``)
	e.Output <- bytes.Repeat([]byte("x"), 70<<10)
	const repeats = 200
	item := `{"type":"terminal","terminalId":"` + id + `"}`
	content := "[" + strings.TrimSuffix(strings.Repeat(item+",", repeats), ",") + "]"
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":`+content+`}}}`+"\n")
	got := recv(t, pp.editor)
	if n := strings.Count(got, "is shown above"); n != repeats-1 {
		t.Errorf("%d items point to the output above, want %d", n, repeats-1)
	}
	if max := displayLimit + repeats*200; len(got) > max {
		t.Errorf("line to the editor is %d bytes, want at most %d", len(got), max)
	}
}

// TestWrapProxyStopsRefreshingReplacedContent: an update that replaces a
// tool call's terminal with other content, naming no terminal, reaches the
// editor, and no refresh of the terminal's output follows it, shown as
// text or streamed to Zed: a tool_call_update with other content, or the
// tool call sent again without content (which is none), or with content
// null.
func TestWrapProxyStopsRefreshingReplacedContent(t *testing.T) {
	for _, zed := range []bool{false, true} {
		for _, replacement := range []string{
			`"sessionUpdate":"tool_call_update","toolCallId":"c","content":[{"type":"content","content":{"type":"text","text":"done"}}]`,
			`"sessionUpdate":"tool_call","toolCallId":"c","title":"make"`,
			`"sessionUpdate":"tool_call","toolCallId":"c","title":"make","content":null`,
		} {
			e := newFakeEngine(t)
			pp := startProxyWith(t, e.m)
			if zed {
				pp.rendersTerminalMeta()
			}
			pp.newSession(t, "s")
			id := pp.createTerminal(t, ``)
			send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"terminal","terminalId":"`+id+`"}]}}}`+"\n")
			if got := recv(t, pp.editor); !strings.Contains(got, `"type":"text"`) && !strings.Contains(got, "terminal_info") {
				t.Fatalf("zed %v: editor got %q, want the terminal shown", zed, got)
			}
			replaced := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{` + replacement + `}}}` + "\n"
			send(t, pp.toProxyFromAgent, replaced)
			if got := recv(t, pp.editor); got != replaced {
				t.Fatalf("zed %v, %s: editor got %q, want the replacement as sent", zed, replacement, got)
			}
			// The terminal prints and ends: a watch still running would
			// show it before the agent's next line.
			e.Output <- []byte("late output\n")
			close(e.Output)
			waitExited(t, e, id)
			marker := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"next"}}}}` + "\n"
			send(t, pp.toProxyFromAgent, marker)
			if got := recv(t, pp.editor); got != marker {
				t.Errorf("zed %v, %s: editor got %q after the replacement, want the agent's next line", zed, replacement, got)
			}
		}
	}
}

// TestWrapProxyStreamsToZedWhatAReshownTerminalWrote: a terminal whose
// tool call showed other content for a while, and then shows it again,
// gets to Zed what it wrote meanwhile.
func TestWrapProxyStreamsToZedWhatAReshownTerminalWrote(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.rendersTerminalMeta()
	pp.newSession(t, "s")
	id := pp.createTerminal(t, ``)
	shows := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","content":[{"type":"terminal","terminalId":"` + id + `"}]}}}` + "\n"
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"terminal","terminalId":"`+id+`"}]}}}`+"\n")
	if got := recv(t, pp.editor); !strings.Contains(got, "terminal_info") {
		t.Fatalf("editor got %q, want terminal_info", got)
	}
	hides := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","content":[]}}}` + "\n"
	send(t, pp.toProxyFromAgent, hides)
	if got := recv(t, pp.editor); got != hides {
		t.Fatalf("editor got %q, want the update as sent", got)
	}
	e.Output <- []byte("meanwhile\n")
	send(t, pp.toProxyFromAgent, shows)
	if got := recv(t, pp.editor); got != shows {
		t.Fatalf("editor got %q, want the update as sent", got)
	}
	if got := recv(t, pp.editor); !strings.Contains(got, "terminal_output") || !strings.Contains(got, `meanwhile\n`) {
		t.Errorf("editor got %q, want the output written while hidden", got)
	}
}

// TestWrapProxyTellsZedOfAnEndWhileHidden: a terminal that ended while its
// tool call showed other content gets its last output and its exit to Zed
// once the tool call shows it again, also after other messages passed.
func TestWrapProxyTellsZedOfAnEndWhileHidden(t *testing.T) {
	e := newFakeEngine(t)
	pp := startProxyWith(t, e.m)
	pp.rendersTerminalMeta()
	pp.newSession(t, "s")
	id := pp.createTerminal(t, ``)
	update := func(content string) string {
		return `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","content":` + content + `}}}` + "\n"
	}
	send(t, pp.toProxyFromAgent, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"terminal","terminalId":"`+id+`"}]}}}`+"\n")
	if got := recv(t, pp.editor); !strings.Contains(got, "terminal_info") {
		t.Fatalf("editor got %q, want terminal_info", got)
	}
	hides := update(`[]`)
	send(t, pp.toProxyFromAgent, hides)
	if got := recv(t, pp.editor); got != hides {
		t.Fatalf("editor got %q, want the update as sent", got)
	}
	e.Output <- []byte("last words\n")
	close(e.Output)
	waitExited(t, e, id)
	marker := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"next"}}}}` + "\n"
	send(t, pp.toProxyFromAgent, marker)
	if got := recv(t, pp.editor); got != marker {
		t.Fatalf("editor got %q while the terminal is hidden, want the agent's line", got)
	}
	shows := update(`[{"type":"terminal","terminalId":"` + id + `"}]`)
	send(t, pp.toProxyFromAgent, shows)
	if got := recv(t, pp.editor); got != shows {
		t.Fatalf("editor got %q, want the update as sent", got)
	}
	if got := recv(t, pp.editor); !strings.Contains(got, `last words\n`) || !strings.Contains(got, "terminal_exit") {
		t.Errorf("editor got %q, want the last output and the exit", got)
	}
}

// waitExited waits until the fake engine's terminal id of session s has
// ended.
func waitExited(t *testing.T, e *fakeEngine, id string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		s, err := e.m.Get(context.Background(), "test\x00s")
		if err != nil {
			t.Fatal(err)
		}
		if term, err := s.Terminal(id); err != nil || term.Exited() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the terminal did not end")
		}
	}
}
