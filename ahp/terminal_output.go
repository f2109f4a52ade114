package ahp

import (
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/ahp/osc633"
	"github.com/sandboxd/sandboxd/sandbox"
)

// ptyOutput turns the exec's output into actions: data with the shell
// integration's sequences stripped, and the command, cwd and title events
// they carried.
type ptyOutput struct{ t *terminal }

func (o ptyOutput) Write(p []byte) (int, error) {
	<-o.t.ready
	o.t.process(p, false)
	return len(p), nil
}

// process feeds output to the parser and emits what comes out. Unless the
// output is final, a character cut in half at its end waits for the rest.
func (t *terminal) process(data []byte, final bool) {
	data = append(t.carry, data...)
	t.carry = nil
	if cut := sandbox.IncompleteTail(data); cut > 0 && !final {
		t.carry = append([]byte(nil), data[len(data)-cut:]...)
		data = data[:len(data)-cut]
	}
	out, events := t.parser.Feed(data)
	from := 0
	for _, ev := range events {
		// The data goes out in two parts only around an event that may
		// be an action of its own, and never with a character cut in
		// two: clients would each get half a character (replaced, in
		// JSON), while the state joined the halves.
		if strings.IndexByte("ABE", ev.Kind) < 0 && ev.Offset > from {
			cut := ev.Offset - sandbox.IncompleteTail(out[from:ev.Offset])
			if cut > from {
				t.emit(Action{Type: "terminal/data", Data: string(out[from:cut])})
				from = cut
			}
		}
		t.event(ev)
	}
	if from < len(out) {
		t.emit(Action{Type: "terminal/data", Data: string(out[from:])})
	}
}

// event acts on one event. A, B and E make no action of their own but
// for the first commandDetectionAvailable, which does not mind the data
// around it (process splits the data only at the others).
func (t *terminal) event(ev osc633.Event) {
	if ev.Kind == 'R' {
		t.launch(ev.Value)
		return
	}
	// Announced on the first event only the shell integration can send:
	// a shell without the nonce (no stty) still marks its prompts.
	if strings.IndexByte("CDEP", ev.Kind) >= 0 && !t.detecting {
		t.detecting = true
		t.emit(Action{Type: "terminal/commandDetectionAvailable"})
	}
	switch ev.Kind {
	case 'E':
		t.line = ev.CommandLine
		t.armed = true
	case 'C':
		if !t.armed {
			return
		}
		t.armed = false
		// A command whose end never came (its D lost) ends here, its code
		// unknown: clients would show it running for ever.
		t.finishCommand(nil)
		t.cmdID++
		t.started = time.Now()
		t.running = true
		t.emit(Action{Type: "terminal/commandExecuted", CommandID: "cmd-" + strconv.Itoa(t.cmdID), CommandLine: t.line, Timestamp: t.started.UnixMilli()})
		t.line = ""
	case 'D':
		t.finishCommand(ev.ExitCode)
	case 'P':
		if ev.Key == "Cwd" && len(ev.Value) > 0 && ev.Value[0] == '/' {
			uri := fileURI(ev.Value)
			if !t.stateIs(func(st TerminalState) bool { return st.Cwd == uri }) {
				t.emit(Action{Type: "terminal/cwdChanged", Cwd: uri})
			}
		}
	case 'T':
		// Bounded as a client's title is, cut at a character: each one
		// goes to every client with the list of the terminals.
		title := ev.Title
		if len(title) > maxTitle {
			title = title[:maxTitle]
			title = title[:len(title)-sandbox.IncompleteTail([]byte(title))]
		}
		// A program that sets its title in a loop (a progress display)
		// costs each client a list of the terminals per change; the same
		// title again changes nothing.
		if !t.stateIs(func(st TerminalState) bool { return st.Title == title }) {
			t.emitListed(Action{Type: "terminal/titleChanged", Title: title}, false)
		}
	}
}

// wait reports the terminal's exit once its output is all processed.
func (t *terminal) wait() {
	s := t.s
	select {
	case <-t.t.Done():
	case <-s.ctx.Done():
		return
	}
	if len(t.carry) > 0 {
		t.process(nil, true)
	}
	// The shell ended during a command (exit, exec, a kill): so did the
	// command, its code unknown; clients would show it running for ever.
	t.finishCommand(nil)
	_, _, st := t.t.Output()
	a := Action{Type: "terminal/exited"}
	if st != nil {
		// A terminal's exitCode is what tells clients it exited: one
		// killed by a signal gets the shell's 128+n, not none.
		code := sandbox.ExitCode(*st)
		a.ExitCode = &code
	}
	t.emitListed(a, true)
}

// finishCommand reports the end of the command that runs, if one does.
func (t *terminal) finishCommand(exitCode *int) {
	if !t.running {
		return
	}
	t.running = false
	d := time.Since(t.started).Milliseconds()
	t.emit(Action{Type: "terminal/commandFinished", CommandID: "cmd-" + strconv.Itoa(t.cmdID), ExitCode: exitCode, DurationMs: &d})
}

// emit emits an action of the terminal's own while it is served: the
// output of one disposed, still read while its processes are killed, must
// not reach a terminal made again under its URI.
func (t *terminal) emit(a Action) {
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.terms[t.uri] == t {
		s.emitLocked(t.uri, a, nil)
	}
}

// emitListed emits an action that changes what the root channel lists of
// the terminal, and the new list with it: at once, or within listInterval.
func (t *terminal) emitListed(a Action, now bool) {
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.terms[t.uri] != t {
		return
	}
	s.emitLocked(t.uri, a, nil)
	if now {
		s.terminalsChangedLocked()
	} else {
		s.listedChangedLocked()
	}
}

// stateIs reports whether the terminal is still served and its state
// satisfies is, for events that change nothing when it already does.
func (t *terminal) stateIs(is func(TerminalState) bool) bool {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	return t.s.terms[t.uri] == t && is(t.state)
}

// appendData adds terminal data to the state, keeping at most max bytes of
// content. s.mu must be held.
func (t *terminal) appendData(data string, max int) {
	t.unfolded = append(t.unfolded, data...)
	if len(t.unfolded) >= max {
		t.fold(max)
	}
}

// fold reduces the gathered data into the state. s.mu must be held.
func (t *terminal) fold(max int) {
	if len(t.unfolded) == 0 {
		return
	}
	data := t.unfolded
	if len(data) > max {
		// All older content goes anyway; only the last max bytes matter.
		cut := len(data) - max
		for cut < len(data) && !utf8.RuneStart(data[cut]) {
			cut++
		}
		data = data[cut:]
	}
	reduceTerminal(&t.state, Action{Type: "terminal/data", Data: string(data)})
	TrimContent(&t.state, max)
	t.unfolded = t.unfolded[:0]
}
