package loglimit

import (
	"sync"
	"time"
)

// Limit lets one line through per second. The zero Limit is ready to use.
type Limit struct {
	mu      sync.Mutex
	last    time.Time
	dropped int
}

// Allow reports whether a line may be logged at now, and how many were not
// since the last one that was.
func (l *Limit) Allow(now time.Time) (dropped int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.last) < time.Second {
		l.dropped++
		return 0, false
	}
	dropped, l.dropped, l.last = l.dropped, 0, now
	return dropped, true
}
