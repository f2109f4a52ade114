package sandbox

import (
	"sync"
	"unicode/utf8"
)

// OutputBuffer keeps the last Limit bytes written to it. Writes never block
// on readers and never fail, so a command is never slowed by a slow agent,
// and memory stays O(limit) however much is written.
type OutputBuffer struct {
	limit int

	mu        sync.Mutex
	buf       []byte // ring once len(buf) == limit
	start     int    // index of the oldest byte when the ring is full
	total     int64  // bytes ever written
	head      []byte // the first headSize bytes ever written, limit or not
	truncated bool
	changed   chan struct{} // closed and replaced on every write
}

// NewOutputBuffer returns a buffer that keeps at most limit bytes.
func NewOutputBuffer(limit int) *OutputBuffer {
	if limit < 0 {
		limit = 0
	}
	return &OutputBuffer{limit: limit, changed: make(chan struct{})}
}

// Write appends p, dropping the oldest bytes beyond the limit. It always
// reports len(p) written.
func (b *OutputBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if n == 0 {
		return 0, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.head) < headSize {
		b.head = append(b.head, p[:min(len(p), headSize-len(b.head))]...)
	}
	b.total += int64(n)
	close(b.changed)
	b.changed = make(chan struct{})
	if b.limit == 0 {
		b.truncated = true
		return n, nil
	}
	if len(p) >= b.limit {
		if b.total > int64(b.limit) {
			b.truncated = true
		}
		if cap(b.buf) < b.limit {
			b.buf = make([]byte, b.limit)
		}
		b.buf = b.buf[:b.limit]
		copy(b.buf, p[len(p)-b.limit:])
		b.start = 0
		return n, nil
	}
	// Grow until the limit, so a short command never allocates the whole
	// limit up front.
	if room := b.limit - len(b.buf); room > 0 {
		k := min(room, len(p))
		if len(b.buf)+k > cap(b.buf) {
			// Grown by hand: append's growth would overshoot the limit,
			// which is what max_output_memory counts.
			grown := make([]byte, len(b.buf), min(b.limit, max(2*cap(b.buf), len(b.buf)+k)))
			copy(grown, b.buf)
			b.buf = grown
		}
		b.buf = append(b.buf, p[:k]...)
		p = p[k:]
	}
	if len(p) == 0 {
		return n, nil
	}
	b.truncated = true
	for len(p) > 0 {
		k := copy(b.buf[b.start:], p)
		p = p[k:]
		b.start = (b.start + k) % b.limit
	}
	return n, nil
}

// headSize is how much of the beginning Head keeps.
const headSize = 512

// Head returns the first bytes ever written, up to 512, even when the
// limit dropped them: where the engine says why a command did not start.
func (b *OutputBuffer) Head() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.head...)
}

// Limit returns how many bytes the buffer keeps.
func (b *OutputBuffer) Limit() int { return b.limit }

// Held returns the bytes of memory the buffer holds.
func (b *OutputBuffer) Held() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return cap(b.buf)
}

// Snapshot returns the retained output and whether anything was dropped.
// When bytes were dropped, the head is cut forward to the next UTF-8 boundary
// so a character is never split in half.
func (b *OutputBuffer) Snapshot() (out []byte, truncated bool) {
	b.mu.Lock()
	out = make([]byte, len(b.buf))
	k := copy(out, b.buf[b.start:])
	copy(out[k:], b.buf[:b.start])
	truncated = b.truncated
	b.mu.Unlock()
	if truncated {
		out = cutToRuneStart(out)
	}
	return out, truncated
}

// Since returns what was written after the first offset bytes, as far as
// the buffer still holds it, the offset to ask from next time, and how many
// bytes after offset it no longer holds. Watchers that stream output use it
// to send only what is new. After a gap the data starts at a character, so
// that it never opens with the tail of one whose head is gone.
func (b *OutputBuffer) Since(offset int64) (data []byte, next, dropped int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.total - offset
	if n <= 0 {
		return nil, b.total, 0
	}
	held := int64(len(b.buf))
	dropped = max(n-held, 0)
	n = min(n, held)
	data = make([]byte, n)
	// The newest n bytes end just before start (ring full) or at len(buf).
	end := int64(len(b.buf))
	if len(b.buf) == b.limit {
		end = int64(b.start)
	}
	from := end - n
	if from >= 0 {
		copy(data, b.buf[from:end])
	} else {
		k := copy(data, b.buf[int64(len(b.buf))+from:])
		copy(data[k:], b.buf[:end])
	}
	if dropped > 0 {
		cut := cutToRuneStart(data)
		dropped += int64(len(data) - len(cut))
		data = cut
	}
	return data, b.total, dropped
}

// Total returns the number of bytes ever written.
func (b *OutputBuffer) Total() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total
}

// Changed returns a channel closed at the next write, for watchers that
// stream output live without polling.
func (b *OutputBuffer) Changed() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.changed
}

// cutToRuneStart drops leading continuation bytes, at most utf8.UTFMax-1 of
// them, which are what is left of a character whose head was dropped.
func cutToRuneStart(p []byte) []byte {
	for i := 0; i < len(p) && i < utf8.UTFMax; i++ {
		if utf8.RuneStart(p[i]) {
			return p[i:]
		}
	}
	if len(p) < utf8.UTFMax {
		return p[len(p):] // all of it the tail of one character
	}
	return p
}

// IncompleteTail returns how many bytes at the end of p begin a UTF-8
// character that is not complete yet, for streams that must not split a
// character between two messages.
func IncompleteTail(p []byte) int {
	for i := 1; i <= utf8.UTFMax-1 && i <= len(p); i++ {
		if !utf8.RuneStart(p[len(p)-i]) {
			continue
		}
		if !utf8.FullRune(p[len(p)-i:]) {
			return i
		}
		return 0
	}
	return 0
}
