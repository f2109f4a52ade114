package acp

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
	"github.com/sandboxd/sandboxd/sandbox"
)

const (
	// outputSlots bounds the terminal/output answers of one connection
	// that hold a copy of their terminal's output (up to 16 MiB), taken
	// just before it is written and held until the peer has read it.
	// Answers are written one at a time anyway.
	outputSlots = 1
	// maxInFlight bounds the requests of one connection waiting for
	// their answer (most of them terminal/wait_for_exit).
	maxInFlight = 1024
	// maxInFlightBytes bounds what those requests hold: their params and
	// ids as read, and what decoding them builds (charge). Sixteen of the
	// largest a connection reads.
	maxInFlightBytes = 16 * MaxRequestSize
)

// requestLimiter bounds what one connection's requests hold in sandboxd's
// memory, whatever the peer pipelines; with shared, also what the
// requests of all the instance's connections hold together.
type requestLimiter struct {
	output chan struct{}
	// bytes is what the connection's requests hold (maxInFlightBytes);
	// shared is the instance's bound (sandbox.Config.RequestMemory), nil
	// for none beyond the connection's.
	bytes, shared *sandbox.MemoryPool

	mu sync.Mutex
	n  int
}

func newRequestLimiter() *requestLimiter {
	return &requestLimiter{output: make(chan struct{}, outputSlots), bytes: sandbox.NewMemoryPool(maxInFlightBytes)}
}

// refused is the answer to a request that would hold more than a bound.
func refused(method, format string, args ...any) error {
	return &jsonrpc2.Error{Code: jsonrpc.RequestCancelled, Message: method + ": " + fmt.Sprintf(format, args...)}
}

// take counts size bytes against the connection's bound and the
// instance's, or fails; it never waits.
func (l *requestLimiter) take(method string, size int) error {
	if !l.bytes.Take(int64(size)) {
		return refused(method, "the requests of this connection waiting for their answer would hold more than %d MiB; wait for some", maxInFlightBytes>>20)
	}
	if l.shared != nil && !l.shared.Take(int64(size)) {
		l.bytes.Give(int64(size))
		return refused(method, "the requests of all of sandboxd's connections would hold more than %d MiB; wait for some", l.shared.Max()>>20)
	}
	return nil
}

// give gives back size bytes that take counted.
func (l *requestLimiter) give(size int) {
	l.bytes.Give(int64(size))
	if l.shared != nil {
		l.shared.Give(int64(size))
	}
}

// acquire takes a place for a request that holds size bytes, to be given
// back with release once its reply is written. It fails at once when too
// many are in flight, or too many bytes; it never waits.
func (l *requestLimiter) acquire(method string, size int) (release func(), err error) {
	// Failing rather than waiting: the connection's reader must go on
	// reading, or a peer that writes before it reads would wait for
	// sandboxd as sandboxd waits for it.
	l.mu.Lock()
	if l.n >= maxInFlight {
		l.mu.Unlock()
		return nil, refused(method, "%d requests are waiting for their answer; wait for some", maxInFlight)
	}
	l.n++
	l.mu.Unlock()
	if err := l.take(method, size); err != nil {
		l.mu.Lock()
		l.n--
		l.mu.Unlock()
		return nil, err
	}
	return func() {
		l.give(size)
		l.mu.Lock()
		l.n--
		l.mu.Unlock()
	}, nil
}

// account is what one request's handler charged, given back once its
// answer is written.
type account struct {
	l      *requestLimiter
	method string

	mu    sync.Mutex
	bytes int
}

type accountKey struct{}

// charge counts n bytes more that the request of ctx holds until its
// answer is written (what decoding its params builds), against the bounds
// of its connection and its instance; past them it fails, never waits. A
// request the limiter does not run (a test's) is not counted.
func charge(ctx context.Context, n int) error {
	a, _ := ctx.Value(accountKey{}).(*account)
	if a == nil {
		return nil
	}
	if err := a.l.take(a.method, n); err != nil {
		return err
	}
	a.mu.Lock()
	a.bytes += n
	a.mu.Unlock()
	return nil
}

// close gives back what the request charged.
func (a *account) close() {
	a.mu.Lock()
	n := a.bytes
	a.bytes = 0
	a.mu.Unlock()
	a.l.give(n)
}

// build waits, in the request's own goroutine, until a reply of method may
// be built: a terminal/output reply takes one of the output slots until it
// is written, others go at once.
func (l *requestLimiter) build(ctx context.Context, method string) (release func(), err error) {
	if method != MethodOutput {
		return func() {}, nil
	}
	select {
	case l.output <- struct{}{}:
		return func() { <-l.output }, nil
	case <-ctx.Done():
		return nil, &jsonrpc2.Error{Code: jsonrpc.RequestCancelled, Message: "request cancelled"}
	}
}

// lazyAnswer is an answer a handler leaves to be built once the limiter
// lets it (outputAnswer).
type lazyAnswer interface{ build() any }

// run has h answer a request, its charges counted (charge), and builds a
// lazy answer once the limiter lets it; done gives back what the request
// charged and what building its answer took, for after the answer is
// written.
func (l *requestLimiter) run(ctx context.Context, h RequestHandler, method string, params json.RawMessage) (res any, done func(), err error) {
	a := &account{l: l, method: method}
	res, err = h.Handle(context.WithValue(ctx, accountKey{}, a), method, params)
	lazy, ok := res.(lazyAnswer)
	if err != nil || !ok {
		return res, a.close, err
	}
	built, err := l.build(ctx, method)
	if err != nil {
		a.close()
		return nil, func() {}, err
	}
	return lazy.build(), func() {
		built()
		a.close()
	}, nil
}
