package acp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// flakyListener fails its first accepts, as a listener out of descriptors
// does, then hands out conns until closed.
type flakyListener struct {
	fails  int
	conns  chan net.Conn
	closed chan struct{}
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails > 0 {
		l.fails--
		return nil, errors.New("accept4: too many open files")
	}
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *flakyListener) Close() error {
	select {
	case <-l.closed:
	default:
		close(l.closed)
	}
	return nil
}

func (l *flakyListener) Addr() net.Addr { return &net.UnixAddr{Name: "flaky", Net: "unix"} }

func TestServeListenerOutlivesFailedAccepts(t *testing.T) {
	ln := &flakyListener{fails: 3, conns: make(chan net.Conn), closed: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- ServeListener(ctx, ln, nil, "/", slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	client, server := net.Pipe()
	defer client.Close()
	ln.conns <- server
	if _, err := io.WriteString(client, `{"jsonrpc":"2.0","id":1,"method":"nope"}`+"\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(client).ReadString('\n')
	if err != nil || !strings.Contains(line, `"code":-32601`) {
		t.Errorf("reply %q, %v: want method not found", line, err)
	}
	client.Close()
	cancel()
	if err := <-served; err != nil {
		t.Errorf("ServeListener: %v", err)
	}
}

// TestListenUnix: the socket appears under its name only once it listens
// (a client waiting for the file is never refused), with mode 0600 and no
// other file left beside it; a live one is not taken over, a stale one is.
func TestListenUnix(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	path := filepath.Join(dir, "sandboxd.sock")
	ln, err := ListenUnix(path, quiet)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket file: %v, %v; want a socket of mode 0600", fi, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("files beside the socket: %v", entries)
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c.Close()
	if _, err := ListenUnix(path, quiet); err == nil || !strings.Contains(err.Error(), "another sandboxd") {
		t.Errorf("a second listen on a live socket: %v", err)
	}
	ln.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the socket file went with the listener: %v (its owner removes it)", err)
	}
	ln, err = ListenUnix(path, quiet)
	if err != nil {
		t.Fatalf("listen over a stale socket: %v", err)
	}
	ln.Close()
	// What is no socket is never replaced.
	file := filepath.Join(dir, "a-file")
	if err := os.WriteFile(file, []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ListenUnix(file, quiet); err == nil {
		t.Error("listen on a regular file's path: no error")
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "mine" {
		t.Errorf("the file after a listen on its path: %q, %v", b, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("files left: %v, want the socket and the file", entries)
	}
}

// TestListenUnixServesTheOwnerOnly: a connection from another user is
// closed unanswered and logged, also on an abstract socket, which has no
// file mode to keep others out; the owner's is served.
func TestListenUnixServesTheOwnerOnly(t *testing.T) {
	for _, path := range []string{filepath.Join(t.TempDir(), "s.sock"), fmt.Sprintf("@sandboxd-test-%d", os.Getpid())} {
		t.Run(path, func(t *testing.T) {
			for _, owner := range []bool{false, true} {
				var logs syncBuffer
				ln, err := ListenUnix(path, slog.New(slog.NewTextHandler(&logs, nil)))
				if err != nil {
					t.Fatal(err)
				}
				if !owner {
					// As if another user connected.
					ln.(*ownerListener).uids = []uint32{uint32(os.Geteuid()) + 1}
				}
				accepted := make(chan net.Conn, 1)
				go func() {
					c, err := ln.Accept()
					if err == nil {
						accepted <- c
					}
				}()
				c, err := net.Dial("unix", path)
				if err != nil {
					t.Fatal(err)
				}
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				if owner {
					select {
					case s := <-accepted:
						s.Close()
					case <-time.After(10 * time.Second):
						t.Error("the owner's connection was not accepted")
					}
				} else {
					if n, err := c.Read(make([]byte, 1)); err != io.EOF {
						t.Errorf("another user's connection: read %d, %v; want it closed", n, err)
					}
					if !strings.Contains(logs.String(), "connection from another user refused") {
						t.Errorf("log %q, want the refusal", logs.String())
					}
				}
				c.Close()
				ln.Close()
			}
		})
	}
}
