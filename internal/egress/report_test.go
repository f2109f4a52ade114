package egress

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestRefusalsAreBounded(t *testing.T) {
	var evs []Event
	var logged bytes.Buffer
	p := &Proxy{
		Report: func(ev Event) { evs = append(evs, ev) },
		Log:    slog.New(slog.NewTextHandler(&logged, nil)),
	}
	host := strings.Repeat("a", 64<<10)
	for range 20 {
		p.report(Event{Method: "CONNECT", Host: host, Reason: "CONNECT wants HOST:PORT"})
	}
	// The 20 calls take far less than a second.
	if len(evs) != maxReportedRefusals {
		t.Fatalf("%d of 20 refusals reported, want %d", len(evs), maxReportedRefusals)
	}
	for _, ev := range evs {
		if len(ev.Host) > 255 {
			t.Fatalf("event host of %d bytes, want at most 255", len(ev.Host))
		}
	}
	if n := strings.Count(logged.String(), "\n"); n != 1 || len(logged.String()) > 1024 {
		t.Errorf("%d log lines of %d bytes for 20 refusals, want 1 short one", n, logged.Len())
	}
	p.flushReport()
	if last := evs[len(evs)-1]; last.LeftOut != 20-maxReportedRefusals {
		t.Errorf("closing event %+v, want LeftOut %d", last, 20-maxReportedRefusals)
	}
	// What is let through is reported as before.
	p.report(Event{Method: "CONNECT", Host: "example.com", Port: 443, Allowed: true})
	if last := evs[len(evs)-1]; !last.Allowed || last.Host != "example.com" {
		t.Errorf("allowed event %+v", last)
	}
}

func TestBurst(t *testing.T) {
	var b burst
	t0 := time.Unix(1000, 0)
	for i := range maxReportedRefusals {
		if _, ok := b.allow(t0.Add(time.Duration(i) * time.Millisecond)); !ok {
			t.Fatalf("event %d of the first second refused", i)
		}
	}
	for range 3 {
		if _, ok := b.allow(t0.Add(500 * time.Millisecond)); ok {
			t.Fatal("an event past the bound let through")
		}
	}
	if dropped, ok := b.allow(t0.Add(time.Second)); !ok || dropped != 3 {
		t.Errorf("next second: allow = %d, %v; want 3, true", dropped, ok)
	}
	if n := b.flush(); n != 0 {
		t.Errorf("flush = %d after the count was reported, want 0", n)
	}
}
