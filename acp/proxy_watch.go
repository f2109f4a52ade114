package acp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/sandbox"
)

const (
	// refreshInterval bounds how often a watch pushes live terminal
	// output to the editor.
	refreshInterval = 100 * time.Millisecond
	// displayLimit bounds the text shown for one terminal in a tool call:
	// the editor re-renders it on every refresh, and the agent reads the
	// whole output through terminal/output anyway.
	displayLimit = 64 << 10
)

// watch pushes the output of embedded terminals to the editor as
// tool_call_update notifications, at most every refreshInterval and once
// more when they exit. A text watch refreshes a tool call's content; a meta
// watch streams one announced terminal.
type watch struct {
	p          *Proxy
	sessionID  string
	toolCallID string
	wake       chan struct{} // the agent replaced the content
	forget     func()
	// shownAt is when the editor got the terminals' output last: from a
	// refresh, or from the rewritten tool call that started a text watch
	// or replaced its content. Guarded by p.updates.
	shownAt time.Time
	// closed says the session is closed: nothing more is sent. Guarded
	// by p.updates.
	closed bool

	// Text watches; guarded by p.updates.
	content []json.RawMessage   // as the agent sent it
	terms   []*sandbox.Terminal // the known terminals in it
	shown   []byte              // the content the editor has

	// Meta watches; guarded by p.updates.
	term *sandbox.Terminal
	// hidden says the tool call no longer shows the terminal: the
	// agent replaced its content.
	hidden bool
	sent   int64  // output offset sent so far
	tail   []byte // the start of a character whose rest has not come yet
}

// startWatch registers w in watches, a map of p guarded by p.mu, and runs
// it until its terminals exit.
func startWatch[K comparable](p *Proxy, watches map[K]*watch, key K, w *watch) {
	p.mu.Lock()
	watches[key] = w
	p.mu.Unlock()
	w.forget = func() {
		p.mu.Lock()
		if watches[key] == w {
			delete(watches, key)
		}
		p.mu.Unlock()
	}
	if !p.work.Go(func() { w.run(p.ctx) }) {
		w.forget()
	}
}

// setContent replaces a text watch's content and returns it rendered.
// p.updates is held.
func (w *watch) setContent(content []json.RawMessage, terms []*sandbox.Terminal) json.RawMessage {
	w.content, w.terms = content, terms
	shown, _ := marshal(w.render())
	return w.show(shown)
}

// show records that the editor gets shown, now, and wakes the watch to
// refresh from there. p.updates is held.
func (w *watch) show(shown json.RawMessage) json.RawMessage {
	w.shown, w.shownAt = shown, time.Now()
	w.wakeUp()
	return shown
}

// wakeUp has the watch look again at once, rather than when its terminals
// next write.
func (w *watch) wakeUp() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// due returns a text watch's content rendered when the editor should get
// it now: it changed, and a refresh is due or the last one is (a terminal
// ended, which the person watching is to see with the agent's update, not
// after it). The output is only rendered when one of those holds.
// p.updates is held.
func (w *watch) due() (json.RawMessage, bool) {
	if time.Since(w.shownAt) < refreshInterval && !slices.ContainsFunc(w.terms, (*sandbox.Terminal).Exited) {
		return nil, false
	}
	shown, err := marshal(w.render())
	if err != nil || bytes.Equal(shown, w.shown) {
		return nil, false
	}
	return shown, true
}

func (w *watch) terminals() []*sandbox.Terminal {
	if w.term != nil {
		return []*sandbox.Terminal{w.term}
	}
	return w.terms
}

func (w *watch) run(ctx context.Context) {
	for {
		w.p.updates.Lock()
		last, ended := w.shownAt, allEnded(w.terminals())
		w.p.updates.Unlock()
		// The last refresh goes at once: it is what the agent is about
		// to report on.
		if d := refreshInterval - time.Since(last); d > 0 && !ended {
			select {
			case <-ctx.Done():
				w.forget()
				return
			case <-time.After(d):
			}
		}
		w.p.updates.Lock()
		terms := w.terminals()
		changed := make([]<-chan struct{}, len(terms))
		final := true
		for i, t := range terms {
			// Taken before the output is read: a write after the
			// read closes it.
			changed[i] = t.Buffer().Changed()
			if !t.Exited() {
				final = false
			}
		}
		if final && w.hidden && !w.closed {
			// Its terminal ended while the tool call shows other
			// content: the rest of its output and its exit go to the
			// editor if it is shown again.
			w.p.updates.Unlock()
			select {
			case <-w.wake:
				continue
			case <-ctx.Done():
				w.forget()
				return
			}
		}
		sent, err := w.refresh(final)
		if sent {
			w.shownAt = time.Now()
		}
		if final || err != nil {
			// Forgotten before p.updates is released, so an update of
			// the agent either reaches this watch in time or starts a
			// new one.
			if err == nil {
				w.p.watchEnded(w)
			}
			w.forget()
		}
		w.p.updates.Unlock()
		if err != nil {
			w.p.log.Debug("refresh tool call", "toolCall", w.toolCallID, "err", err)
			return
		}
		if final {
			return
		}
		if !waitAny(ctx, w.wake, changed, terms) {
			w.forget()
			return
		}
	}
}

// waitAny waits until one of the terminals writes or exits, or wake.
func waitAny(ctx context.Context, wake <-chan struct{}, changed []<-chan struct{}, terms []*sandbox.Terminal) bool {
	if len(terms) == 1 {
		select {
		case <-changed[0]:
		case <-terms[0].Done():
		case <-wake:
		case <-ctx.Done():
			return false
		}
		return true
	}
	any := make(chan struct{}, 1)
	stop := make(chan struct{})
	defer close(stop)
	for i := range terms {
		go func() {
			select {
			case <-changed[i]:
			case <-terms[i].Done():
			case <-stop:
				return
			}
			select {
			case any <- struct{}{}:
			default:
			}
		}()
	}
	select {
	case <-any:
	case <-wake:
	case <-ctx.Done():
		return false
	}
	return true
}

// refresh sends the editor what changed, if anything. p.updates is held.
func (w *watch) refresh(final bool) (bool, error) {
	if w.closed || w.hidden {
		return false, nil
	}
	update := toolCallUpdate{SessionUpdate: "tool_call_update", ToolCallID: w.toolCallID}
	if w.term != nil {
		data, next, dropped := w.term.Buffer().Since(w.sent)
		w.sent = next
		if dropped > 0 {
			// The command wrote more between two refreshes than its
			// outputByteLimit keeps: the person watching is told what
			// is missing, and the head of a character held back last
			// time has lost its rest.
			w.tail = fmt.Appendf(nil, "\r\n[sandboxd: %d bytes of output not shown]\r\n", dropped+int64(len(w.tail)))
		}
		data = append(w.tail, data...)
		w.tail = nil
		if !final {
			// Hold back a character cut in half; its rest comes next.
			if cut := sandbox.IncompleteTail(data); cut > 0 {
				w.tail = append([]byte(nil), data[len(data)-cut:]...)
				data = data[:len(data)-cut]
			}
		}
		meta := terminalMeta{}
		if len(data) > 0 {
			meta.Output = &terminalOutput{TerminalID: w.term.ID, Data: string(data)}
		}
		if final {
			_, _, st := w.term.Output()
			meta.Exit = &terminalExit{TerminalID: w.term.ID}
			if st != nil {
				meta.Exit.ExitCode, meta.Exit.Signal = st.ExitCode, st.Signal
			}
		}
		if meta.Output == nil && meta.Exit == nil {
			return false, nil
		}
		update.Meta = &meta
	} else {
		items := w.render()
		shown, err := marshal(items)
		if err != nil || bytes.Equal(shown, w.shown) {
			return false, err
		}
		w.shown = shown
		update.Content = items
	}
	b, err := marshal(notification{JSONRPC: "2.0", Method: "session/update",
		Params: notificationParams{SessionID: w.sessionID, Update: update}})
	if err != nil {
		return false, err
	}
	return true, w.p.editor.WriteLine(b)
}

// render returns the content with every terminal item replaced by a text
// item with its output. A terminal the content names again gets a line
// that points up: an agent repeating one item must not make a line that
// grows with the square of the repeats.
func (w *watch) render() []json.RawMessage {
	items := make([]json.RawMessage, 0, len(w.content))
	shown := make(map[string]bool, len(w.terms))
	for _, item := range w.content {
		id, ok := terminalItem(item)
		if !ok || w.p.agentTerminal(w.sessionID, id) {
			items = append(items, item) // not a terminal, or the agent's own
			continue
		}
		text := fmt.Sprintf("(the output of terminal %s is not available)", id)
		if shown[id] {
			text = fmt.Sprintf("(the output of terminal %s is shown above)", id)
		} else if i := slices.IndexFunc(w.terms, func(t *sandbox.Terminal) bool { return t.ID == id }); i >= 0 {
			text = terminalText(w.terms[i])
			shown[id] = true
		}
		b, err := marshal(textContent{Type: "content", Content: textBlock{Type: "text", Text: text}})
		if err != nil {
			continue
		}
		items = append(items, b)
	}
	return items
}

// terminalText is a terminal's output for a text item, with its exit status
// once it has exited.
func terminalText(t *sandbox.Terminal) string {
	out, truncated, st := t.Output()
	if len(out) > displayLimit {
		out = out[len(out)-displayLimit:]
		for len(out) > 0 && !utf8.RuneStart(out[0]) {
			out = out[1:]
		}
		truncated = true
	}
	text := string(out)
	if truncated {
		text = "[earlier output truncated]\n" + text
	}
	if st != nil {
		switch {
		case st.Signal != nil:
			text += fmt.Sprintf("\n[killed by %s]", *st.Signal)
		case st.ExitCode != nil:
			text += fmt.Sprintf("\n[exit code %d]", *st.ExitCode)
		}
	}
	return text
}

type textContent struct {
	Type    string    `json:"type"`
	Content textBlock `json:"content"`
}

type textBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// Terminal _meta as Zed reads it (crates/agent_servers/src/acp.rs).
type (
	terminalInfo struct {
		TerminalID string `json:"terminal_id"`
		Cwd        string `json:"cwd,omitempty"`
	}
	terminalOutput struct {
		TerminalID string `json:"terminal_id"`
		Data       string `json:"data"`
	}
	terminalExit struct {
		TerminalID string  `json:"terminal_id"`
		ExitCode   *int    `json:"exit_code"`
		Signal     *string `json:"signal"`
	}
	terminalMeta struct {
		Output *terminalOutput `json:"terminal_output,omitempty"`
		Exit   *terminalExit   `json:"terminal_exit,omitempty"`
	}
)

// notification is a session/update the proxy sends the editor itself.
type notification struct {
	JSONRPC string             `json:"jsonrpc"`
	Method  string             `json:"method"`
	Params  notificationParams `json:"params"`
}

type notificationParams struct {
	SessionID string         `json:"sessionId"`
	Update    toolCallUpdate `json:"update"`
}

type toolCallUpdate struct {
	SessionUpdate string            `json:"sessionUpdate"`
	ToolCallID    string            `json:"toolCallId"`
	Content       []json.RawMessage `json:"content,omitempty"`
	Meta          *terminalMeta     `json:"_meta,omitempty"`
}

// flushEnded sends the editor, now, the last refresh of every watch whose
// terminals have all ended, ahead of whatever message of the agent's is
// about to be relayed. Those watches send nothing more.
func (p *Proxy) flushEnded() {
	// Most lines pass with no watch at all: they take no lock the
	// watches' refreshes hold.
	p.mu.Lock()
	none := len(p.textWatches)+len(p.metaWatches) == 0
	p.mu.Unlock()
	if none {
		return
	}
	p.updates.Lock()
	defer p.updates.Unlock()
	p.mu.Lock()
	var ended []*watch
	for _, w := range p.textWatches {
		ended = append(ended, w)
	}
	for _, w := range p.metaWatches {
		ended = append(ended, w)
	}
	p.mu.Unlock()
	// The agent has seen these terminals end (wait_for_exit): its next
	// update or its answer to the prompt must not reach the editor before
	// their final output.
	for _, w := range ended {
		if w.closed || w.hidden || !allEnded(w.terminals()) {
			continue // a hidden one waits to be shown again (run)
		}
		if _, err := w.refresh(true); err != nil {
			p.log.Debug("refresh tool call", "toolCall", w.toolCallID, "err", err)
		}
		p.watchEnded(w)
		w.closed = true
		w.forget()
	}
}

// allEnded reports whether every one of terms has exited.
func allEnded(terms []*sandbox.Terminal) bool {
	return !slices.ContainsFunc(terms, func(t *sandbox.Terminal) bool { return !t.Exited() })
}

// watchEnded keeps the content of a text watch whose terminals have all
// ended and whose final output the editor got, for showsEnded. A watch
// whose content the agent replaced with none of its terminals shows none.
// p.updates is held.
func (p *Proxy) watchEnded(w *watch) {
	if w.term != nil || w.closed || len(w.terms) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.endedWatches) >= maxEmbedded {
		for k := range p.endedWatches {
			delete(p.endedWatches, k)
			break
		}
	}
	p.endedWatches[toolCallKey{w.sessionID, w.toolCallID}] = w.content
}

// showsEnded reports whether an update of kind sets the content an ended
// watch of the tool call showed, which the editor has with the terminals'
// final output. Anything else replaces it: the ended watch is forgotten.
// p.updates is held.
func (p *Proxy) showsEnded(key toolCallKey, kind string, content []json.RawMessage) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	ended, ok := p.endedWatches[key]
	if !ok {
		return false
	}
	if kind == "tool_call_update" && sameItems(content, ended) {
		return true
	}
	delete(p.endedWatches, key)
	return false
}

// showAnnounced notes which of the terminals announced in a tool call
// its content still shows: output of one it no longer shows is not
// streamed while it is not, and what it wrote meanwhile follows once it
// is shown again. p.updates is held.
func (p *Proxy) showAnnounced(sessionID, callID string, ids []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.metaWatches {
		if w.sessionID == sessionID && w.toolCallID == callID {
			hidden := !slices.Contains(ids, w.term.ID)
			if w.hidden && !hidden {
				w.wakeUp()
			}
			w.hidden = hidden
		}
	}
}
