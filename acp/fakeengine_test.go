package acp

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd"
	"github.com/sandboxd/sandboxd/sandbox"
)

// fakeEngine answers the Docker Engine API in memory, for tests that need
// sessions but no containers: containers are created and started at once,
// a terminal's exec streams what the test sends to output and exits 0
// once it is closed, the exec that verifies mounts fails as in an image
// without stat (so they go unverified), and the calls named in hold ("create", "remove") wait until
// release is called or the test ends.
type fakeEngine struct {
	m       *sandbox.Manager
	output  chan []byte
	release func()

	hold     []string
	released chan struct{}
	conns    chan net.Conn
	done     chan struct{}
	execs    atomic.Int64
	// failRemoves is how many container removals still fail; removes
	// counts those asked for. failCreates is how many creates still make
	// their container but answer with an error (a timeout); made names
	// the last container a create made, removedNames those removed.
	failRemoves, removes, failCreates atomic.Int32
	mu                                sync.Mutex
	made                              string
	removedNames                      []string
}

func newFakeEngine(t *testing.T, hold ...string) *fakeEngine {
	t.Helper()
	e := &fakeEngine{output: make(chan []byte), hold: hold, released: make(chan struct{}),
		conns: make(chan net.Conn), done: make(chan struct{})}
	var once sync.Once
	e.release = func() { once.Do(func() { close(e.released) }) }
	srv := &http.Server{Handler: e}
	go srv.Serve(e)
	cli, err := client.New(client.WithHTTPClient(&http.Client{Transport: &http.Transport{DialContext: e.dial}}),
		client.WithAPIVersion(client.MaxAPIVersion))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := sandbox.LoadConfig(sandboxd.DefaultConfig, "", 2)
	if err != nil {
		t.Fatal(err)
	}
	e.m, err = sandbox.NewManager(context.Background(), cli, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.release()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		e.m.Close(ctx)
		close(e.done)
		srv.Close()
	})
	return e
}

// Accept, Close, Addr and dial make the engine a listener of in-memory
// connections.
func (e *fakeEngine) Accept() (net.Conn, error) {
	select {
	case c := <-e.conns:
		return c, nil
	case <-e.done:
		return nil, net.ErrClosed
	}
}

func (e *fakeEngine) Close() error { return nil }

func (e *fakeEngine) Addr() net.Addr { return &net.UnixAddr{Name: "fake-engine", Net: "unix"} }

func (e *fakeEngine) dial(ctx context.Context, _, _ string) (net.Conn, error) {
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

func (e *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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
			answer(201, fmt.Sprintf(`{"Id":"nostat%d"}`, e.execs.Add(1)))
			return
		}
		if len(req.Cmd) > 0 && req.Cmd[0] == "cat" {
			// sandboxd's own read of the mount table: no terminal's.
			answer(201, fmt.Sprintf(`{"Id":"cat%d"}`, e.execs.Add(1)))
			return
		}
		answer(201, fmt.Sprintf(`{"Id":"exec%d"}`, e.execs.Add(1)))
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
		e.removes.Add(1)
		e.mu.Lock()
		e.removedNames = append(e.removedNames, path[strings.LastIndex(path, "/")+1:])
		e.mu.Unlock()
		if n := e.failRemoves.Load(); n > 0 && e.failRemoves.CompareAndSwap(n, n-1) {
			answer(500, `{"message":"could not kill container: tried to kill container, but did not receive an exit event"}`)
			return
		}
	}
	if op == "create" {
		e.mu.Lock()
		e.made = r.URL.Query().Get("name")
		e.mu.Unlock()
		if n := e.failCreates.Load(); n > 0 && e.failCreates.CompareAndSwap(n, n-1) {
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
func (e *fakeEngine) streamOnce(w http.ResponseWriter, b []byte) {
	if conn := hijack(w); conn != nil {
		frame(conn, b)
		conn.Close()
	}
}

// stream is a terminal's exec: what the test sends to output, as stdout.
func (e *fakeEngine) stream(w http.ResponseWriter) {
	conn := hijack(w)
	if conn == nil {
		return
	}
	defer conn.Close()
	for {
		select {
		case b, ok := <-e.output:
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
