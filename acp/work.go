package acp

import (
	"sync"
	"time"
)

// workGroup runs work in goroutines that a stop waits for, for a bounded
// time. Once stopping it starts no more: a sync.WaitGroup must not be
// added to while it is waited on from zero, and work started after the
// stop would run on past it unwaited.
type workGroup struct {
	mu       sync.Mutex
	stopping bool
	wg       sync.WaitGroup
}

// Go runs f in a goroutine of its own, unless the group is stopping; it
// reports whether it did.
func (g *workGroup) Go(f func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopping {
		return false
	}
	g.wg.Go(f)
	return true
}

// Stop refuses new work and waits for the work running to end, at most
// timeout: work blocked writing to a peer that stopped reading may never
// end, and the caller must still get on with its shutdown. It reports
// whether all work ended.
func (g *workGroup) Stop(timeout time.Duration) bool {
	g.mu.Lock()
	g.stopping = true
	g.mu.Unlock()
	done := make(chan struct{})
	go func() {
		g.wg.Wait()
		close(done)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
