package osc633

import (
	"bytes"
	"reflect"
	"testing"
)

func ptr(n int) *int { return &n }

func TestParser(t *testing.T) {
	const nonce = "n0nce"
	tests := []struct {
		name   string
		in     string
		out    string
		events []Event
	}{
		{"plain text", "hello\r\n", "hello\r\n", nil},
		{"prompt markers", "\x1b]633;A\x07$ \x1b]633;B\x07", "$ ", []Event{{Kind: 'A'}, {Kind: 'B', Offset: 2}}},
		{"ST terminator", "a\x1b]633;C;n0nce\x1b\\b", "ab", []Event{{Kind: 'C', Offset: 1}}},
		{"C without the nonce is stripped, no event", "a\x1b]633;C\x07b", "ab", nil},
		{"C with another nonce", "\x1b]633;C;guess\x07", "", nil},
		{"C with more", "\x1b]633;C;x;n0nce\x07", "", nil},
		{"exit code", "\x1b]633;D;3;n0nce\x07", "", []Event{{Kind: 'D', ExitCode: ptr(3)}}},
		{"D without code", "\x1b]633;D;n0nce\x07", "", []Event{{Kind: 'D'}}},
		{"D with garbage code", "\x1b]633;D;x;n0nce\x07", "", nil},
		{"D without the nonce", "\x1b]633;D;0\x07", "", nil},
		{"nonce as a prefix is no nonce", "\x1b]633;D;0;n0nce1\x07", "", nil},
		{"command line with nonce", "\x1b]633;E;cd /tmp \\x3b echo hi\\\\;n0nce\x07", "", []Event{{Kind: 'E', CommandLine: `cd /tmp ; echo hi\`}}},
		{"UTF-8 command line", "\x1b]633;E;echo héllo ✓;n0nce\x07", "", []Event{{Kind: 'E', CommandLine: "echo héllo ✓"}}},
		{"wrong nonce is ignored and stripped", "x\x1b]633;E;rm -rf /;evil\x07y", "xy", nil},
		{"missing nonce is ignored", "\x1b]633;E;ls\x07", "", nil},
		{"cwd property", "\x1b]633;P;Cwd=/tmp;n0nce\x07", "", []Event{{Kind: 'P', Key: "Cwd", Value: "/tmp"}}},
		{"cwd with an escaped ;", "\x1b]633;P;Cwd=/a\\x3bb;n0nce\x07", "", []Event{{Kind: 'P', Key: "Cwd", Value: "/a;b"}}},
		{"cwd without the nonce", "\x1b]633;P;Cwd=/etc\x07", "", nil},
		{"launcher asks", "\x1b]633;R;nonce\x07", "", []Event{{Kind: 'R', Value: "nonce"}}},
		{"launcher has it", "\x1b]633;R;ready\x07", "", []Event{{Kind: 'R', Value: "ready"}}},
		{"launcher without bash", "\x1b]633;R;none\x07$ ", "$ ", []Event{{Kind: 'R', Value: "none"}}},
		{"launcher saying something else", "\x1b]633;R;x\x07", "", nil},
		{"unknown 633 command is stripped", "\x1b]633;Z;q\x07ok", "ok", nil},
		{"title passes through", "\x1b]0;my title\x07$ ", "\x1b]0;my title\x07$ ", []Event{{Kind: 'T', Title: "my title"}}},
		{"title 2", "\x1b]2;t2\x1b\\", "\x1b]2;t2\x1b\\", []Event{{Kind: 'T', Title: "t2"}}},
		{"other OSC passes through", "\x1b]7;file:///x\x07", "\x1b]7;file:///x\x07", nil},
		{"CSI passes through", "\x1b[31mred\x1b[0m", "\x1b[31mred\x1b[0m", nil},
		{"633 cut off by another sequence", "\x1b]633;A\x1b[0m", "\x1b[0m", nil},
		{"OSC cut off by a 633", "\x1b]0;ti\x1b]633;B\x07", "", []Event{{Kind: 'B'}}},
		{"lone ESC does not join text", "\x1b\x1b]633;\a]633;", "]633;", nil},
		{"cut-off sequence does not join text", "\x1b]\x1b]633;\a633;", "633;", nil},
		// The C1 forms (UTF-8 U+009D, U+009C), which xterm.js reads too.
		{"C1 OSC 633 is stripped", "a\u009d633;E;rm -rf /\u009cb\u009d633;C\ac", "abc", nil},
		{"C1 OSC with the nonce counts", "\u009d633;D;4;n0nce\u009c", "", []Event{{Kind: 'D', ExitCode: ptr(4)}}},
		{"C1 title passes through", "\u009d0;t\u009c$", "\u009d0;t\u009c$", []Event{{Kind: 'T', Title: "t"}}},
		{"C1 OSC cut off by ESC", "\u009d633;A\x1b[0m", "\x1b[0m", nil},
		{"OSC cut off by a C1 OSC", "\x1b]0;ti\u009d633;B\x07", "", []Event{{Kind: 'B'}}},
		{"other C1-page characters pass", "© ° \u0085 \u009b", "© ° \u0085 \u009b", nil},
		{"CAN cancels a sequence, and what follows shows", "\x1b]633;A\x18visible\x07", "visible\x07", nil},
		{"SUB cancels a sequence", "\x1b]633;A\x1avisible", "visible", nil},
		{"a lone C1 lead before an OSC", "\xc2\x1b]633;A\x07x", "\ufffdx", []Event{{Kind: 'A', Offset: 3}}},
		{"two C1 leads before a C1 OSC", "\xc2\xc2\x9d633;A\u009cx", "\ufffdx", []Event{{Kind: 'A', Offset: 3}}},
		{"ESC before a C1 OSC", "\x1b\xc2\x9d633;A\u009cx", "x", []Event{{Kind: 'A'}}},
		{"a C1 lead cannot join what follows a stripped sequence", "\xc2\x1b]633;A\x07\x9d633;B\x07", "\ufffd\x9d633;B\x07", []Event{{Kind: 'A', Offset: 3}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := NewParser(nonce)
			out, events := p.Feed([]byte(tc.in))
			if string(out) != tc.out {
				t.Errorf("out = %q, want %q", out, tc.out)
			}
			if !reflect.DeepEqual(events, tc.events) {
				t.Errorf("events = %+v, want %+v", events, tc.events)
			}
			// Split at every byte: the same result.
			for cut := 0; cut <= len(tc.in); cut++ {
				out, events := feedChunks(NewParser(nonce), []byte(tc.in), cut)
				if string(out) != tc.out || !reflect.DeepEqual(events, tc.events) {
					t.Errorf("split at %d: out %q events %+v", cut, out, events)
				}
			}
		})
	}
}

// feedChunks feeds in[:cut] then in[cut:], with offsets made absolute.
func feedChunks(p *Parser, in []byte, cut int) ([]byte, []Event) {
	var out []byte
	var events []Event
	for _, chunk := range [][]byte{in[:cut], in[cut:]} {
		o, ev := p.Feed(chunk)
		for _, e := range ev {
			e.Offset += len(out)
			events = append(events, e)
		}
		out = append(out, o...)
	}
	return out, events
}

func TestUnterminatedSequenceIsBounded(t *testing.T) {
	bounded := func() *Parser {
		p := NewParser("n")
		p.max = 16
		return p
	}
	p := bounded()
	// What lies beyond the bound is dropped too, up to the sequence's
	// end: an E sequence's nonce never reaches the data.
	long := "\x1b]633;E;" + string(bytes.Repeat([]byte("x"), 100)) + ";n\x07after"
	for cut := 0; cut <= len(long); cut++ {
		out, _ := feedChunks(bounded(), []byte(long), cut)
		if string(out) != "after" {
			t.Errorf("split at %d: out = %q, want %q", cut, out, "after")
		}
	}
	out, _ := p.Feed([]byte(long))
	if string(out) != "after" {
		t.Errorf("out = %q", out)
	}
	out, _ = p.Feed([]byte("\x1b]0;" + string(bytes.Repeat([]byte("y"), 100)) + "\x1b[0m"))
	if string(out) != "\x1b[0m" {
		t.Errorf("a sequence cut at the bound ends at the next ESC: out = %q", out)
	}
	if len(p.pending) != 0 {
		t.Errorf("pending = %d bytes", len(p.pending))
	}
	p.Feed([]byte("\x1b]0;" + string(bytes.Repeat([]byte("y"), 1000))))
	if len(p.pending) > 16+2 {
		t.Errorf("pending grew to %d bytes", len(p.pending))
	}
}

// A sequence arriving a byte at a time is scanned once, not again with
// every byte.
func TestPendingSequenceIsNotRescanned(t *testing.T) {
	p := NewParser("n")
	seq := append([]byte("\x1b]633;E;"), bytes.Repeat([]byte("x"), 1000)...)
	for i := range seq {
		p.Feed(seq[i : i+1])
		if i > 0 && p.scanned != len(p.pending) {
			t.Fatalf("after %d bytes: scanned %d of %d pending", i+1, p.scanned, len(p.pending))
		}
	}
	out, events := p.Feed([]byte(";n\x07"))
	if len(out) != 0 || len(events) != 1 || events[0].CommandLine != string(bytes.Repeat([]byte("x"), 1000)) {
		t.Errorf("out %q, %d events", out, len(events))
	}
}

func BenchmarkLongSequenceByteAtATime(b *testing.B) {
	seq := append([]byte("\x1b]633;E;"), bytes.Repeat([]byte("x"), DefaultMaxSequence-16)...)
	seq = append(seq, ";n\x07"...)
	for b.Loop() {
		p := NewParser("n")
		for i := range seq {
			p.Feed(seq[i : i+1])
		}
	}
}

func FuzzParser(f *testing.F) {
	for _, s := range []string{
		"\x1b]633;A\x07$ \x1b]633;B\x07", "\x1b]633;E;ls\\x3b;n\x07", "\x1b]0;t\x1b\\", "\x1b\x1b]633;C\x07",
		"\x1b]63\x1b]633;D;1\x07", "\x1b]633;P;Cwd=/\x07", "\x1b]", "\x1b", "plain",
		"\u009d633;A\u009c", "\u009d0;t\x18x", "\xc2", "é©\u009d",
		"\xc2\x1b]633;A\a", "\x1b\xc2\x9d633;A\a", "\xc2\xc2\x9d633;A\a",
	} {
		f.Add([]byte(s), uint16(3))
	}
	f.Fuzz(func(t *testing.T, in []byte, cut uint16) {
		c := int(cut) % (len(in) + 1)
		whole := NewParser("n")
		whole.max = 32
		out, events := whole.Feed(in)
		if bytes.Contains(out, []byte("\x1b]633;")) || bytes.Contains(out, []byte("\u009d633;")) {
			t.Fatalf("output keeps an OSC 633 sequence: %q", out)
		}
		split := NewParser("n")
		split.max = 32
		out2, events2 := feedChunks(split, in, c)
		if !bytes.Equal(out, out2) || !reflect.DeepEqual(events, events2) {
			t.Fatalf("split at %d differs:\n%q %+v\n%q %+v", c, out, events, out2, events2)
		}
	})
}
