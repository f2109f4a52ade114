package enginetest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/engine"
)

// Engine answers the Docker Engine API in memory, for tests that need
// sessions but no containers: containers are created and started at once,
// a terminal's exec streams what the test sends to Output and exits 0
// once Output is closed, the exec that verifies mounts fails as in an
// image without stat (so they go unverified), and the calls named in hold
// ("create", "remove") wait until Release is called or the test ends.
type Engine struct {
	// API is a client of the engine.
	API engine.API
	// Output takes what a terminal's exec writes, as stdout.
	Output chan []byte
	// Release lets held calls go on (they fail).
	Release func()
	// Execs counts the execs created.
	Execs atomic.Int64
	// FailRemoves is how many container removals still fail; Removes
	// counts those asked for. FailCreates is how many creates still make
	// their container but answer with an error (a timeout).
	FailRemoves, Removes, FailCreates atomic.Int32

	hold     []string
	released chan struct{}
	conns    chan net.Conn
	done     chan struct{}
	mu       sync.Mutex
	// made names the last container a create made, removedNames those
	// removed.
	made         string
	removedNames []string
}

// New starts an engine that lives until the test ends.
func New(t testing.TB, hold ...string) *Engine {
	t.Helper()
	e := &Engine{Output: make(chan []byte), hold: hold, released: make(chan struct{}),
		conns: make(chan net.Conn), done: make(chan struct{})}
	var once sync.Once
	e.Release = func() { once.Do(func() { close(e.released) }) }
	srv := &http.Server{Handler: e}
	go srv.Serve(e)
	cli, err := client.New(client.WithHTTPClient(&http.Client{Transport: &http.Transport{DialContext: e.dial}}),
		client.WithAPIVersion(client.MaxAPIVersion))
	if err != nil {
		t.Fatal(err)
	}
	e.API = cli
	t.Cleanup(func() {
		e.Release()
		close(e.done)
		srv.Close()
	})
	return e
}

// CloseAtEnd has closeFn (a manager's Close) run when the test ends,
// after held calls are released and before the engine stops.
func (e *Engine) CloseAtEnd(t testing.TB, closeFn func(context.Context) error) {
	t.Cleanup(func() {
		e.Release()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		closeFn(ctx)
	})
}

// Made returns the name of the last container a create made.
func (e *Engine) Made() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.made
}

// Removed reports whether a removal of the named container was asked for.
func (e *Engine) Removed(name string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Contains(e.removedNames, name)
}

func (e *Engine) Accept() (net.Conn, error) {
	select {
	case c := <-e.conns:
		return c, nil
	case <-e.done:
		return nil, net.ErrClosed
	}
}

func (e *Engine) Close() error { return nil }

func (e *Engine) Addr() net.Addr { return &net.UnixAddr{Name: "fake-engine", Net: "unix"} }

func (e *Engine) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	c, s := net.Pipe()
	select {
	case e.conns <- s:
		return c, nil
	case <-e.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (e *Engine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	answer := func(code int, body string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		io.WriteString(w, body)
	}
	path := r.URL.Path
	op := ""
	switch {
	case strings.HasSuffix(path, "/info"):
		answer(200, `{"NCPU":2}`)
	case strings.HasSuffix(path, "/containers/json"):
		answer(200, `[]`)
	case strings.HasSuffix(path, "/containers/create"):
		op = "create"
	case strings.Contains(path, "/containers/") && strings.HasSuffix(path, "/start"):
		w.WriteHeader(204)
	case strings.Contains(path, "/containers/") && r.Method == http.MethodDelete:
		op = "remove"
	case strings.HasSuffix(path, "/exec"):
		var req struct{ Cmd []string }
		json.NewDecoder(r.Body).Decode(&req)
		if len(req.Cmd) > 0 && req.Cmd[0] == "stat" {
			// As the engine runs an image without stat: 126, and why.
			answer(201, fmt.Sprintf(`{"Id":"nostat%d"}`, e.Execs.Add(1)))
			return
		}
		if len(req.Cmd) > 0 && req.Cmd[0] == "cat" {
			// sandboxd's own read of the mount table: no terminal's.
			answer(201, fmt.Sprintf(`{"Id":"cat%d"}`, e.Execs.Add(1)))
			return
		}
		answer(201, fmt.Sprintf(`{"Id":"exec%d"}`, e.Execs.Add(1)))
	case strings.Contains(path, "/exec/nostat") && strings.HasSuffix(path, "/start"):
		io.Copy(io.Discard, r.Body)
		e.streamOnce(w, []byte(`OCI runtime exec failed: exec failed: unable to start container process: exec: "stat": executable file not found in $PATH: unknown`+"\r\n"))
	case strings.Contains(path, "/exec/nostat") && strings.HasSuffix(path, "/json"):
		answer(200, `{"Running":false,"ExitCode":126}`)
	case strings.Contains(path, "/exec/cat") && strings.HasSuffix(path, "/start"):
		io.Copy(io.Discard, r.Body)
		e.streamOnce(w, []byte("1 0 0:1 / / rw - overlay overlay rw\n"))
	case strings.Contains(path, "/exec/") && strings.HasSuffix(path, "/start"):
		// Read before the hijack: a pipe has no buffer to leave it in.
		io.Copy(io.Discard, r.Body)
		e.stream(w)
	case strings.Contains(path, "/exec/") && strings.HasSuffix(path, "/json"):
		answer(200, `{"Running":false,"ExitCode":0}`)
	default:
		answer(500, `{"message":"not in the fake engine"}`)
	}
	if op == "" {
		return
	}
	if slices.Contains(e.hold, op) {
		select {
		case <-e.released:
			answer(500, `{"message":"released"}`)
		case <-r.Context().Done():
		}
		return
	}
	if op == "remove" {
		e.Removes.Add(1)
		e.mu.Lock()
		e.removedNames = append(e.removedNames, path[strings.LastIndex(path, "/")+1:])
		e.mu.Unlock()
		if n := e.FailRemoves.Load(); n > 0 && e.FailRemoves.CompareAndSwap(n, n-1) {
			answer(500, `{"message":"could not kill container: tried to kill container, but did not receive an exit event"}`)
			return
		}
	}
	if op == "create" {
		e.mu.Lock()
		e.made = r.URL.Query().Get("name")
		e.mu.Unlock()
		if n := e.FailCreates.Load(); n > 0 && e.FailCreates.CompareAndSwap(n, n-1) {
			answer(500, `{"message":"context deadline exceeded"}`)
			return
		}
		answer(201, `{"Id":"0123456789abcdef0123456789abcdef","Warnings":[]}`)
	} else {
		w.WriteHeader(204)
	}
}

// hijack answers an exec start with the raw stream, for frames to follow.
func hijack(w http.ResponseWriter) net.Conn {
	conn, buf, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return nil
	}
	buf.WriteString("HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.multiplexed-stream\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n")
	buf.Flush()
	return conn
}

// frame writes b as one stdout frame of the multiplexed stream.
func frame(conn net.Conn, b []byte) error {
	head := []byte{1, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(head[4:], uint32(len(b)))
	_, err := conn.Write(append(head, b...))
	return err
}

// streamOnce is an exec that writes b and ends.
func (e *Engine) streamOnce(w http.ResponseWriter, b []byte) {
	if conn := hijack(w); conn != nil {
		frame(conn, b)
		conn.Close()
	}
}

// stream is a terminal's exec: what the test sends to output, as stdout.
func (e *Engine) stream(w http.ResponseWriter) {
	conn := hijack(w)
	if conn == nil {
		return
	}
	defer conn.Close()
	for {
		select {
		case b, ok := <-e.Output:
			if !ok {
				return
			}
			if err := frame(conn, b); err != nil {
				return
			}
		case <-e.done:
			return
		}
	}
}
