package egress

import (
	"sync"
	"time"
)

// Bounds of what refusals report and log: a command can cause them as
// fast as it can connect.
const (
	// maxEventHost is the most of a host an event, or a log line, keeps:
	// with the "..." that marks a cut, 255 bytes.
	maxEventHost = 252
	// maxReportedRefusals is how many refusals a Proxy reports a second;
	// the next one reported counts those left out.
	maxReportedRefusals = 5
)

// report tells Report of a request that ended, and logs it. Refusals and
// failures are reported at most maxReportedRefusals a second and logged
// at most once a second; each counts those left out before it.
func (p *Proxy) report(ev Event) {
	ev.Host = truncate(ev.Host, maxEventHost)
	if ev.Allowed && ev.Reason == "" {
		p.log().Debug("egress", "method", ev.Method, "host", ev.Host, "port", ev.Port, "sent", ev.Sent, "received", ev.Received, "duration", ev.Duration)
		if p.Report != nil {
			p.Report(ev)
		}
		return
	}
	now := time.Now()
	if dropped, ok := p.refusedLog.Allow(now); ok {
		p.log().Info("egress refused or failed", "method", ev.Method, "host", ev.Host, "port", ev.Port, "reason", ev.Reason, "dropped", dropped)
	}
	leftOut, ok := p.refusedReport.allow(now)
	if !ok || p.Report == nil {
		return
	}
	ev.LeftOut = leftOut
	p.Report(ev)
}

// flushReport reports, as one event, the refusals left out since the last
// one reported, if any.
func (p *Proxy) flushReport() {
	if n := p.refusedReport.flush(); n > 0 && p.Report != nil {
		p.Report(Event{Reason: "refusals left out of the report", LeftOut: n})
	}
}

// burst lets maxReportedRefusals events through in each second. The zero
// burst is ready to use.
type burst struct {
	mu      sync.Mutex
	start   time.Time // of the current second
	n       int       // let through in it
	dropped int       // since the last let through
}

// allow reports whether an event may be let through at now, and how many
// were not since the last one that was.
func (b *burst) allow(now time.Time) (dropped int, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Sub(b.start) >= time.Second {
		b.start, b.n = now, 0
	}
	if b.n >= maxReportedRefusals {
		b.dropped++
		return 0, false
	}
	b.n++
	dropped, b.dropped = b.dropped, 0
	return dropped, true
}

// flush returns how many were left out since the last let through, and
// forgets them.
func (b *burst) flush() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.dropped
	b.dropped = 0
	return n
}
