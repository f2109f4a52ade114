// Package osc633 strips shell-integration escape sequences (OSC 633) from a
// terminal's output stream and reports them, with window titles (OSC 0 and
// 2), as events.
package osc633

import (
	"bytes"
	"strconv"
	"strings"
)

// DefaultMaxSequence bounds how long an escape sequence may grow before the
// parser stops waiting for its end, so a stray ESC ] never holds output back
// without limit.
const DefaultMaxSequence = 64 << 10

// Event is one sequence found in the stream.
type Event struct {
	// Kind is the OSC 633 command: 'A' prompt start, 'B' prompt end, 'C'
	// command output start, 'D' command finished, 'E' command line, 'P'
	// property; 'R' sandboxd's own launcher saying it waits for the nonce
	// (Value "nonce"), has it ("ready") or wants none ("none"); or 'T'
	// for a window title (OSC 0 or 2).
	Kind byte
	// ExitCode is D's exit code, nil when the shell gave none.
	ExitCode *int
	// CommandLine is E's command line, unescaped.
	CommandLine string
	// Key and Value are P's property, e.g. "Cwd" and "/tmp".
	Key, Value string
	// Title is a window title.
	Title string
	// Offset is where in Feed's output the sequence was.
	Offset int
}

// Parser filters one terminal's output. It is not safe for concurrent use.
type Parser struct {
	nonce   string
	max     int
	pending []byte // an escape sequence whose end has not arrived yet
	// scanned is how much of pending is known to hold no end, so that a
	// sequence arriving a byte at a time is not scanned over and over.
	scanned int
	// skipping is set while the rest of a sequence cut at the length
	// bound goes by: it is dropped up to its end, as a terminal drops it,
	// so that none of it (an E sequence's nonce) reaches the data.
	skipping bool
	// skippedC1 says the skipped data ended in the first byte of a C1
	// control, whose second comes with the next chunk.
	skippedC1 bool
}

// NewParser returns a parser that trusts the C, D, E and P sequences that
// end with ";" and nonce, which only the shell integration knows: those a
// program's output forges are stripped and reported as nothing.
func NewParser(nonce string) *Parser {
	return &Parser{nonce: nonce, max: DefaultMaxSequence}
}

const (
	esc = 0x1b
	bel = 0x07
	can = 0x18
	sub = 0x1a
	// c1 is the first byte of the UTF-8 form of the C1 controls a
	// terminal reads as ESC ] (U+009D, OSC) and ESC \ (U+009C, ST):
	// terminals such as xterm.js take them, so a sequence written that
	// way must be stripped too.
	c1  = 0xc2
	osc = 0x9d
	st  = 0x9c
)

// Feed filters the next chunk of output. It returns the output without any
// OSC 633 sequence, also one split across chunks, and the events found.
// Other sequences pass through unchanged.
func (p *Parser) Feed(data []byte) (out []byte, events []Event) {
	if p.skipping {
		data = p.skip(data)
	}
	buf, resume, held := data, 0, false
	if len(p.pending) > 0 {
		// Grown in place: a long sequence arriving in small pieces is
		// neither copied nor scanned again with each.
		buf, resume, held = append(p.pending, data...), p.scanned, true
		p.pending, p.scanned = nil, 0
	}
	out = make([]byte, 0, len(data))
	i := 0
	// nextEsc is where the next ESC is, at or after i (len(buf): none),
	// kept across the C1 bytes found before it, each of which would
	// otherwise have the rest searched again.
	nextEsc := -1
	for i < len(buf) {
		if nextEsc < i {
			nextEsc = len(buf)
			if j := bytes.IndexByte(buf[i:], esc); j >= 0 {
				nextEsc = i + j
			}
		}
		j := nextEsc
		if k := bytes.IndexByte(buf[i:nextEsc], c1); k >= 0 {
			j = i + k
		}
		out = append(out, buf[i:j]...)
		i = j
		if i == len(buf) {
			break
		}
		if i+1 >= len(buf) {
			p.pending = append([]byte(nil), buf[i:]...)
			break
		}
		switch {
		case buf[i] == c1 && buf[i+1] == osc, buf[i] == esc && buf[i+1] == ']':
		case buf[i] == esc && (buf[i+1] == esc || buf[i+1] == c1):
			// ESC ESC: the second one starts over, as in a terminal; so
			// does a C1 control after an ESC.
			i++
			continue
		case buf[i] == c1 && (buf[i+1] < 0x80 || buf[i+1] > 0xbf):
			// No character: what a client's JSON would make of it, and
			// nothing that a byte left after a stripped sequence could
			// join into an OSC.
			out = append(out, "\ufffd"...)
			i++
			continue
		default:
			// A character, or another kind of sequence: it goes out with
			// the byte after it, so nothing stripped later can join the
			// two.
			out = append(out, buf[i:i+2]...)
			i += 2
			continue
		}
		at := i + 2
		if i == 0 {
			at = max(at, resume)
		}
		body, end, state := p.scan(buf, i+2, at)
		switch state {
		case incomplete:
			if held && i == 0 {
				p.pending = buf
			} else {
				p.pending = append([]byte(nil), buf[i:]...)
			}
			p.scanned = end - i
			i = len(buf)
			continue
		case complete:
			if ev, ok := p.event(body); ok {
				ev.Offset = len(out)
				events = append(events, ev)
			}
		}
		// A sequence cut short is malformed; terminals drop it, and so
		// does the parser, so that no part of one can join what follows
		// into something that looks like OSC 633.
		if state == complete && !bytes.HasPrefix(body, []byte("633;")) {
			out = append(out, buf[i:end]...)
		}
		i = end
		if state == tooLong {
			p.skipping = true
			rest := p.skip(buf[i:])
			i = len(buf) - len(rest)
		}
	}
	return out, events
}

// skip drops the rest of a sequence cut at the length bound: up to and
// with its end (BEL, ST, or the CAN or SUB that cancels it), or up to an
// ESC or OSC, which starts something new.
func (p *Parser) skip(data []byte) []byte {
	if p.skippedC1 && len(data) > 0 {
		// The chunk before ended in the first byte of a C1 control.
		p.skippedC1 = false
		switch data[0] {
		case st:
			p.skipping = false
			return data[1:]
		case osc:
			p.skipping = false
			return append([]byte{c1}, data...)
		}
	}
	for k, b := range data {
		switch b {
		case bel, can, sub:
			p.skipping = false
			return data[k+1:]
		case esc:
			p.skipping = false
			return data[k:]
		case c1:
			if k+1 == len(data) {
				p.skippedC1 = true
				return nil
			}
			switch data[k+1] {
			case st:
				p.skipping = false
				return data[k+2:]
			case osc:
				p.skipping = false
				return data[k:]
			}
		}
	}
	return nil
}

type scanState int

const (
	incomplete scanState = iota // the end has not arrived yet
	complete                    // ended by BEL or ST (ESC \, or C1)
	aborted                     // cut short by another ESC or OSC, or cancelled by CAN or SUB
	tooLong                     // cut at the length bound
)

// scan finds the end of an OSC body starting at from, looking from at on
// (what lies between is known to hold no end). It returns the body, the
// index just past the sequence, and how it ended; when the end has not
// arrived, the index to look from next time.
func (p *Parser) scan(buf []byte, from, at int) ([]byte, int, scanState) {
	limit := from + p.max
	for k := at; k < len(buf); k++ {
		if k >= limit {
			return buf[from:k], k, tooLong
		}
		switch buf[k] {
		case bel:
			return buf[from:k], k + 1, complete
		case can, sub:
			// A terminal cancels the sequence and shows neither.
			return buf[from:k], k + 1, aborted
		case esc:
			if k+1 >= len(buf) {
				return nil, k, incomplete
			}
			if buf[k+1] == '\\' {
				return buf[from:k], k + 2, complete
			}
			// Another sequence starts: this one is cut off there.
			return buf[from:k], k, aborted
		case c1:
			if k+1 >= len(buf) {
				return nil, k, incomplete
			}
			switch buf[k+1] {
			case st:
				return buf[from:k], k + 2, complete
			case osc:
				return buf[from:k], k, aborted
			}
		}
	}
	if len(buf) >= limit {
		return buf[from:limit], limit, tooLong
	}
	return nil, len(buf), incomplete
}

// event decodes a complete OSC body.
func (p *Parser) event(body []byte) (Event, bool) {
	s := string(body)
	if t, ok := strings.CutPrefix(s, "0;"); ok {
		return Event{Kind: 'T', Title: t}, true
	}
	if t, ok := strings.CutPrefix(s, "2;"); ok {
		return Event{Kind: 'T', Title: t}, true
	}
	rest, ok := strings.CutPrefix(s, "633;")
	if !ok || rest == "" {
		return Event{}, false
	}
	kind, args := rest[0], ""
	if len(rest) > 1 {
		if rest[1] != ';' {
			return Event{}, false
		}
		args = rest[2:]
	}
	switch kind {
	case 'A', 'B':
		return Event{Kind: kind}, true
	case 'R':
		if args != "nonce" && args != "ready" && args != "none" {
			return Event{}, false
		}
		return Event{Kind: 'R', Value: args}, true
	}
	// The rest change what clients are told about commands: only with
	// the nonce, as the last argument (values escape ';').
	args, ok = p.signed(args)
	if !ok {
		return Event{}, false
	}
	switch kind {
	case 'C':
		if args != "" {
			return Event{}, false
		}
		return Event{Kind: 'C'}, true
	case 'D':
		ev := Event{Kind: 'D'}
		if args != "" {
			n, err := strconv.Atoi(args)
			if err != nil {
				return Event{}, false
			}
			ev.ExitCode = &n
		}
		return ev, true
	case 'E':
		return Event{Kind: 'E', CommandLine: unescape(args)}, true
	case 'P':
		k, v, ok := strings.Cut(args, "=")
		if !ok || k == "" {
			return Event{}, false
		}
		return Event{Kind: 'P', Key: k, Value: unescape(v)}, true
	}
	return Event{}, false
}

// signed returns args without their last argument when that is the
// parser's nonce, and whether it was.
func (p *Parser) signed(args string) (string, bool) {
	if p.nonce == "" {
		return "", false
	}
	if args == p.nonce {
		return "", true
	}
	rest, ok := strings.CutSuffix(args, ";"+p.nonce)
	return rest, ok
}

// unescape undoes the shell integration's escaping: \\ for a backslash and
// \xHH for a byte (\x3b for ';').
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			if s[i+1] == '\\' {
				b.WriteByte('\\')
				i++
				continue
			}
			if s[i+1] == 'x' && i+3 < len(s) {
				if n, err := strconv.ParseUint(s[i+2:i+4], 16, 8); err == nil {
					b.WriteByte(byte(n))
					i += 3
					continue
				}
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
