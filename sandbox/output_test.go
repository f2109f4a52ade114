package sandbox

import (
	"bytes"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestOutputBuffer(t *testing.T) {
	tests := []struct {
		name      string
		limit     int
		writes    []string
		want      string
		truncated bool
	}{
		{"empty", 10, nil, "", false},
		{"under the limit", 10, []string{"abc", "def"}, "abcdef", false},
		{"exactly the limit", 6, []string{"abc", "def"}, "abcdef", false},
		{"one byte over", 5, []string{"abc", "def"}, "bcdef", true},
		{"many small writes wrap", 4, []string{"a", "b", "c", "d", "e", "f", "g"}, "defg", true},
		{"one write larger than the limit", 3, []string{"abcdefgh"}, "fgh", true},
		{"big write after small ones", 4, []string{"xy", "abcdefgh"}, "efgh", true},
		{"write of exactly the limit after others", 3, []string{"x", "abc"}, "abc", true},
		{"zero limit keeps nothing", 0, []string{"abc"}, "", true},
		{"cut lands inside a 2-byte rune", 4, []string{"aé", "bcd"}, "bcd", true},
		{"cut lands before a 2-byte rune", 5, []string{"aé", "bcd"}, "ébcd", true},
		{"cut lands inside a 3-byte rune", 5, []string{"✓✓"}, "✓", true},
		{"cut lands inside a 4-byte rune", 6, []string{"x😀y😀"}, "y😀", true},
		{"cut on a boundary keeps the rune", 4, []string{"ab", "✓x"}, "✓x", true},
		// A limit smaller than the character: nothing of it is kept.
		{"limit 1 inside a 2-byte rune", 1, []string{"é"}, "", true},
		{"limit 2 inside a 3-byte rune", 2, []string{"€"}, "", true},
		{"limit 3 inside a 4-byte rune", 3, []string{"😀"}, "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := NewOutputBuffer(tc.limit)
			for _, w := range tc.writes {
				if n, err := b.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", w, n, err)
				}
			}
			got, truncated := b.Snapshot()
			if string(got) != tc.want || truncated != tc.truncated {
				t.Errorf("Snapshot() = %q, %v; want %q, %v", got, truncated, tc.want, tc.truncated)
			}
		})
	}
}

func TestOutputBufferTailMatchesStream(t *testing.T) {
	const limit = 1000
	b := NewOutputBuffer(limit)
	var all bytes.Buffer
	runes := []rune("héllo wörld ✓ ")
	for i := range 5000 {
		// Whole characters, so that the stream itself is valid UTF-8.
		chunk := []byte(string(runes[:1+i%len(runes)]))
		b.Write(chunk)
		all.Write(chunk)
	}
	got, truncated := b.Snapshot()
	if !truncated {
		t.Fatal("not truncated")
	}
	if len(got) > limit || len(got) < limit-utf8.UTFMax+1 {
		t.Fatalf("len = %d", len(got))
	}
	if !bytes.HasSuffix(all.Bytes(), got) {
		t.Fatal("snapshot is not a tail of what was written")
	}
	if !utf8.Valid(got) {
		t.Fatalf("snapshot does not start on a rune: %q", got[:8])
	}
	if b.Total() != int64(all.Len()) {
		t.Fatalf("Total = %d, want %d", b.Total(), all.Len())
	}
}

func TestOutputBufferChanged(t *testing.T) {
	b := NewOutputBuffer(8)
	ch := b.Changed()
	select {
	case <-ch:
		t.Fatal("Changed fired before a write")
	default:
	}
	b.Write([]byte("x"))
	select {
	case <-ch:
	default:
		t.Fatal("Changed did not fire on a write")
	}
}

func TestOutputBufferMemoryIsBounded(t *testing.T) {
	const limit = 1 << 20
	b := NewOutputBuffer(limit)
	chunk := []byte(strings.Repeat("x", 32<<10))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range (256 << 20) / len(chunk) {
		b.Write(chunk)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 2*limit {
		t.Errorf("heap grew by %d bytes after 256 MiB through a %d limit", grew, limit)
	}
	if h := b.Held(); h != limit {
		t.Errorf("Held() = %d, want the limit, %d: max_output_memory counts that", h, limit)
	}
	// Grown in odd steps, it still never holds more than the limit.
	for _, limit := range []int{1000, 1 << 20, 3<<20 + 7} {
		b := NewOutputBuffer(limit)
		for i := 1; b.Total() < int64(3*limit); i++ {
			b.Write(make([]byte, i*i%(limit/3+1)+1))
			if h := b.Held(); h > limit {
				t.Fatalf("limit %d: Held() = %d after %d bytes", limit, h, b.Total())
			}
		}
	}
	if h := NewOutputBuffer(limit).Held(); h != 0 {
		t.Errorf("an empty buffer holds %d bytes", h)
	}
}

func BenchmarkOutputBufferWrite(b *testing.B) {
	buf := NewOutputBuffer(1 << 20)
	chunk := make([]byte, 32<<10)
	b.SetBytes(int64(len(chunk)))
	for b.Loop() {
		buf.Write(chunk)
	}
}

func TestOutputBufferSince(t *testing.T) {
	b := NewOutputBuffer(8)
	var all []byte
	var next int64
	var got []byte
	var drops []int64
	for i, w := range []string{"ab", "cdef", "", "ghijklmnop", "q", "rstuvwxyz0123", "✓✓✓✓"} {
		b.Write([]byte(w))
		all = append(all, w...)
		d, n, dropped := b.Since(next)
		got = append(got, d...)
		drops = append(drops, dropped)
		next = n
		if next != int64(len(all)) {
			t.Fatalf("step %d: next = %d, want %d", i, next, len(all))
		}
	}
	// What the buffer still held at each read arrives, in order, and
	// what it no longer held is counted; after a gap the data starts at
	// a character (the second ✓ lost its head).
	if want := "ab" + "cdef" + "ijklmnop" + "q" + "wxyz0123" + "✓✓"; string(got) != want {
		t.Errorf("Since stream = %q, want %q", got, want)
	}
	if want := []int64{0, 0, 0, 2, 0, 5, 6}; !slices.Equal(drops, want) {
		t.Errorf("dropped = %v, want %v", drops, want)
	}
	if d, n, dropped := b.Since(next); len(d) != 0 || n != next || dropped != 0 {
		t.Errorf("Since(now) = %q, %d, %d", d, n, dropped)
	}
	if d, _, _ := b.Since(int64(len(all)) - 3); string(d) != "✓" {
		t.Errorf("Since(the last character) = %q", d)
	}
}

func TestIncompleteTail(t *testing.T) {
	tests := []struct {
		in   string
		want int
	}{
		{"", 0},
		{"abc", 0},
		{"ab\xc3", 1},
		{"ab\xc3\xa9", 0},
		{"\xe2\x9c", 2},
		{"x\xf0\x9f\x98", 3},
		{"x\xf0\x9f\x98\x80", 0},
	}
	for _, tc := range tests {
		if got := IncompleteTail([]byte(tc.in)); got != tc.want {
			t.Errorf("IncompleteTail(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

// TestOutputHoldsBackAHalfCharacter: while the command runs, a character
// whose rest has not arrived is not shown; once it has exited, what it
// wrote is shown as it is.
func TestOutputHoldsBackAHalfCharacter(t *testing.T) {
	term := &Terminal{out: NewOutputBuffer(1024), done: make(chan struct{})}
	term.out.Write([]byte("caf\xc3"))
	if out, _, st := term.Output(); string(out) != "caf" || st != nil {
		t.Errorf("running, half a character written: %q, %v; want %q", out, st, "caf")
	}
	term.out.Write([]byte("\xa9"))
	if out, _, _ := term.Output(); string(out) != "café" {
		t.Errorf("running, the character complete: %q", out)
	}
	term.out.Write([]byte("\xe2\x9c"))
	code := 0
	term.status = ExitStatus{ExitCode: &code}
	close(term.done)
	if out, _, st := term.Output(); string(out) != "café\ufffd" || st == nil {
		t.Errorf("exited: %q, %v; want all it wrote, the half character as U+FFFD", out, st)
	}
}

// TestOutputOfBadBytesStaysWithinTheLimit: bytes that are no part of a
// character are shown as U+FFFD, and the text still holds no more bytes
// than the limit.
func TestOutputOfBadBytesStaysWithinTheLimit(t *testing.T) {
	tests := []struct {
		name      string
		limit     int
		write     string
		want      string
		truncated bool
	}{
		{"valid text as it is", 8, "abc", "abc", false},
		{"one bad byte", 8, "a\xffb", "a\ufffdb", false},
		{"a run of bad bytes is one character", 8, "\xff\xff\xff\xff\xff", "\ufffd", false},
		{"bad bytes that would outgrow the limit", 5, "\xffa\xffb\xff", "b\ufffd", true},
		{"the limit cuts into the replacement", 4, "ab\xffcd", "cd", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			term := &Terminal{out: NewOutputBuffer(tc.limit), done: make(chan struct{})}
			term.out.Write([]byte(tc.write))
			close(term.done)
			out, truncated, _ := term.Output()
			if string(out) != tc.want || truncated != tc.truncated {
				t.Errorf("Output() = %q, %v; want %q, %v", out, truncated, tc.want, tc.truncated)
			}
			if !utf8.Valid(out) || len(out) > tc.limit {
				t.Errorf("%q: not valid UTF-8 within %d bytes", out, tc.limit)
			}
		})
	}
}
