package acp

import (
	"context"
	"testing"
	"time"
)

func TestRequestLimiter(t *testing.T) {
	l := newRequestLimiter()
	ctx := context.Background()
	// Taking a place never waits; beyond the bound it is refused.
	var places []func()
	for range maxInFlight {
		release, err := l.acquire(MethodOutput, 10)
		if err != nil {
			t.Fatal(err)
		}
		places = append(places, release)
	}
	if _, err := l.acquire(MethodKill, 10); err == nil {
		t.Fatal("request beyond maxInFlight was taken")
	}
	places[0]()
	if _, err := l.acquire(MethodKill, 10); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	// So are requests beyond the bytes the connection may hold.
	l = newRequestLimiter()
	big, err := l.acquire(MethodCreate, maxInFlightBytes-100)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.acquire(MethodCreate, 101); err == nil || rpcError(ctx, err).Code != CodeCancelled {
		t.Fatalf("request beyond maxInFlightBytes: err = %v, want it refused", err)
	}
	if _, err := l.acquire(MethodCreate, 100); err != nil {
		t.Fatalf("request within maxInFlightBytes: %v", err)
	}
	big()
	if _, err := l.acquire(MethodCreate, MaxRequestSize); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	// Output replies are built outputSlots at a time; a further one
	// waits in its own goroutine (here until its context ends).
	var slots []func()
	for range outputSlots {
		release, err := l.build(ctx, MethodOutput)
		if err != nil {
			t.Fatal(err)
		}
		slots = append(slots, release)
	}
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if _, err := l.build(short, MethodOutput); err == nil || rpcError(short, err).Code != CodeCancelled {
		t.Fatalf("output beyond the slots: err = %v, want it to wait and then be cancelled", err)
	}
	// Other replies are not held up by outputs.
	if _, err := l.build(short, MethodWaitForExit); err != nil {
		t.Fatalf("wait_for_exit: %v", err)
	}
	slots[0]()
	if _, err := l.build(ctx, MethodOutput); err != nil {
		t.Fatalf("output after a release: %v", err)
	}
}
