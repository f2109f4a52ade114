package ahp

import "time"

// open lets the input flow.
func (t *terminal) open() {
	t.openOnce.Do(func() {
		t.s.mu.Lock()
		t.opened = true
		t.s.mu.Unlock()
		close(t.gate)
	})
}

// launchTimeout is how long input waits for a launcher that says nothing
// (an image whose sh cannot print), before it goes in all the same.
const launchTimeout = 10 * time.Second

// launch answers the launcher, the first thing to run in the terminal:
// with the nonce when it asks (echo is off then), and lets input flow once
// it has read it (or wants none). Only its first request counts; a
// program that prints one later gets nothing. A launcher that asks only
// after launchTimeout (a container short of CPU) still gets the nonce,
// unless input went in first: it reads that line instead, finds no nonce
// in it and starts the shell without command detection.
func (t *terminal) launch(say string) {
	if t.t == nil || t.launched {
		return // the server closed while the exec started, or launched
	}
	switch {
	case say == "nonce" && !t.asked:
		t.asked = true
		t.typing.Lock()
		defer t.typing.Unlock()
		if t.wroteInput {
			t.s.log.Warn("ahp terminal: the shell's launcher asked for the nonce after input went in; no command detection", "terminal", t.uri)
			return
		}
		if err := t.t.Input([]byte(t.nonce + "\n")); err != nil {
			t.s.log.Debug("ahp terminal: nonce not typed", "terminal", t.uri, "err", err)
		}
	case say == "ready" && t.asked, say == "none":
		t.launched = true
		t.open()
	}
}

// writeInput writes queued input to the PTY until the terminal ends,
// once the launcher has had the nonce.
func (t *terminal) writeInput() {
	select {
	case <-t.gate:
	case <-t.t.Done():
		return
	case <-t.s.ctx.Done():
		return
	}
	for {
		select {
		case p := <-t.input:
			t.typing.Lock()
			t.wroteInput = true
			err := t.t.Input(p)
			t.typing.Unlock()
			t.s.mu.Lock()
			t.inputBytes -= len(p)
			t.s.mu.Unlock()
			if err != nil {
				t.s.log.Debug("ahp terminal input lost", "terminal", t.uri, "err", err)
			}
		case <-t.t.Done():
			return
		case <-t.s.ctx.Done():
			return
		}
	}
}
