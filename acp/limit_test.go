package acp

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestRequestLimiter(t *testing.T) {
	l := newRequestLimiter()
	ctx := context.Background()
	var outputs []func()
	for range outputSlots {
		release, err := l.acquire(ctx, MethodOutput)
		if err != nil {
			t.Fatal(err)
		}
		outputs = append(outputs, release)
	}
	// One more output waits (here until its context ends).
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if _, err := l.acquire(short, MethodOutput); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("output beyond the slots: err = %v, want it to wait", err)
	}
	// Other requests are not held up by outputs, and are refused beyond
	// the bound.
	var others []func()
	for range maxInFlight {
		release, err := l.acquire(ctx, MethodWaitForExit)
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, release)
	}
	if _, err := l.acquire(ctx, MethodKill); err == nil {
		t.Fatal("request beyond maxInFlight was taken")
	}
	others[0]()
	if _, err := l.acquire(ctx, MethodKill); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	outputs[0]()
	if _, err := l.acquire(ctx, MethodOutput); err != nil {
		t.Fatalf("output after a release: %v", err)
	}
}
