package acp

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
)

const (
	// outputSlots bounds the terminal/output replies of one connection
	// built and waiting to be written at once: each can be as large as a
	// terminal's buffer, several times over once encoded.
	outputSlots = 2
	// maxInFlight bounds the requests of one connection waiting for
	// their answer (most of them terminal/wait_for_exit).
	maxInFlight = 1024
	// maxInFlightBytes bounds what the params and ids of those requests
	// hold: sixteen of the largest a connection reads.
	maxInFlightBytes = 16 * MaxRequestSize
)

// requestLimiter bounds what one connection's requests hold in sandboxd's
// memory, whatever the peer pipelines.
type requestLimiter struct {
	output chan struct{}

	mu    sync.Mutex
	n     int
	bytes int
}

func newRequestLimiter() *requestLimiter {
	return &requestLimiter{output: make(chan struct{}, outputSlots)}
}

// acquire takes a place for a request that holds size bytes, to be given
// back with release once its reply is written. It fails at once when too
// many are in flight, or too many bytes; it never waits.
func (l *requestLimiter) acquire(method string, size int) (release func(), err error) {
	// Failing rather than waiting: the connection's reader must go on
	// reading, or a peer that writes before it reads would wait for
	// sandboxd as sandboxd waits for it.
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n >= maxInFlight {
		return nil, &jsonrpc2.Error{Code: jsonrpc.RequestCancelled, Message: fmt.Sprintf("%s: %d requests are waiting for their answer; wait for some", method, maxInFlight)}
	}
	if l.bytes+size > maxInFlightBytes {
		return nil, &jsonrpc2.Error{Code: jsonrpc.RequestCancelled, Message: fmt.Sprintf("%s: the requests waiting for their answer hold more than %d MiB; wait for some", method, maxInFlightBytes>>20)}
	}
	l.n++
	l.bytes += size
	return func() {
		l.mu.Lock()
		l.n--
		l.bytes -= size
		l.mu.Unlock()
	}, nil
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

// run has h answer a request, and builds a lazy answer once the limiter
// lets it; done gives back what building it took, for after the answer
// is written.
func (l *requestLimiter) run(ctx context.Context, h RequestHandler, method string, params json.RawMessage) (res any, done func(), err error) {
	res, err = h.Handle(ctx, method, params)
	lazy, ok := res.(lazyAnswer)
	if err != nil || !ok {
		return res, func() {}, err
	}
	built, err := l.build(ctx, method)
	if err != nil {
		return nil, func() {}, err
	}
	return lazy.build(), built, nil
}
