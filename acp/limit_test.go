package acp

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
	"github.com/sandboxd/sandboxd/sandbox"
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
	if _, err := l.acquire(MethodCreate, 101); err == nil || rpcError(ctx, err).Code != jsonrpc.RequestCancelled {
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
	if _, err := l.build(short, MethodOutput); err == nil || rpcError(short, err).Code != jsonrpc.RequestCancelled {
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

// slowLookup answers terminal/output lazily, after waiting for wait (a
// session still starting) when the params say "slow".
type slowLookup struct{ wait chan struct{} }

type builtAnswer string

func (a builtAnswer) build() any { return string(a) }

func (h slowLookup) Handle(ctx context.Context, method string, params json.RawMessage) (any, error) {
	if string(params) == `"slow"` {
		<-h.wait
	}
	return builtAnswer("out"), nil
}

// TestOutputsWaitingForTheirSessionHoldNoSlot: terminal/output requests
// whose terminal is still being found (their session starting) take none
// of the slots of answers being built, so others are answered meanwhile.
func TestOutputsWaitingForTheirSessionHoldNoSlot(t *testing.T) {
	l := newRequestLimiter()
	h := slowLookup{wait: make(chan struct{})}
	ctx := context.Background()
	slow := make(chan any, outputSlots)
	for range outputSlots {
		go func() {
			res, done, _ := l.run(ctx, h, MethodOutput, json.RawMessage(`"slow"`))
			done()
			slow <- res
		}()
	}
	short, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, done, err := l.run(short, h, MethodOutput, json.RawMessage(`"quick"`))
	if err != nil || res != "out" {
		t.Fatalf("output while others wait for their session: %v, %v", res, err)
	}
	done()
	close(h.wait)
	for range outputSlots {
		if res := <-slow; res != "out" {
			t.Errorf("slow output = %v", res)
		}
	}
}

// TestConnectionsShareTheInstanceBound: what the requests of several
// connections hold, read or decoded, is bounded together (the instance's
// sandbox.Config.RequestMemory), not each connection's apart.
func TestConnectionsShareTheInstanceBound(t *testing.T) {
	shared := sandbox.NewMemoryPool(3 * MaxRequestSize)
	one, two := newRequestLimiter(), newRequestLimiter()
	one.shared, two.shared = shared, shared
	r1, err := one.acquire(MethodCreate, 2*MaxRequestSize)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := two.acquire(MethodCreate, 2*MaxRequestSize); err == nil || !strings.Contains(err.Error(), "all of sandboxd's connections") {
		t.Fatalf("a second connection past the instance's bound: %v, want it refused", err)
	}
	if two.n != 0 || two.bytes.Used() != 0 {
		t.Errorf("a refused request left %d, %d counted", two.n, two.bytes.Used())
	}
	// What a handler charges counts too, and goes with the answer.
	res, done, err := two.run(context.Background(), chargeHandler(MaxRequestSize), MethodCreate, nil)
	if err != nil || res != "ok" {
		t.Fatalf("charge within the bound: %v, %v", res, err)
	}
	if _, _, err := one.run(context.Background(), chargeHandler(1), MethodCreate, nil); err == nil {
		t.Error("a charge past the instance's bound was taken")
	}
	done()
	r1()
	if r, err := two.acquire(MethodCreate, 3*MaxRequestSize); err != nil {
		t.Errorf("after the answers: %v", err)
	} else {
		r()
	}
}

// chargeHandler charges its size for every request.
type chargeHandler int

func (h chargeHandler) Handle(ctx context.Context, method string, params json.RawMessage) (any, error) {
	if err := charge(ctx, int(h)); err != nil {
		return nil, err
	}
	return "ok", nil
}
