package egress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestForwarder builds the forwarder from the embedded source, checks that
// it is static, and runs it in front of a proxy: a connection to its port
// reaches the proxy and, through a CONNECT, an echo server.
func TestForwarder(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to build the forwarder with")
	}
	ctx := context.Background()
	cache := t.TempDir()
	bin, err := Forwarder(ctx, cache)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := Forwarder(ctx, cache); err != nil || again != bin {
		t.Errorf("second Forwarder: %q, %v; want the first build %q", again, err, bin)
	}
	addr, _ := echoServer(t)
	s := serve(t, &Proxy{Allow: allow(t, addr)})
	port := freePort(t)
	cmd := exec.Command(bin, "serve", fmt.Sprint(port), s.sock)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	var c net.Conn
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if c, err = net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the forwarder does not listen: %v", err)
		}
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", addr, addr)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT through the forwarder: %v %v", resp, err)
	}
	payload := strings.Repeat("x", 1<<20)
	go io.WriteString(c, payload)
	got := make([]byte, len(payload))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != payload {
		t.Fatalf("echo through the forwarder: %d bytes, %v", len(got), err)
	}
	c.(*net.TCPConn).CloseWrite()
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Errorf("after the half-close: %q, %v", rest, err)
	}
	if ev := s.event(t); !ev.Allowed || ev.Sent != int64(len(payload)) || ev.Received != int64(len(payload)) {
		t.Errorf("event %+v", ev)
	}
}

func TestCheckForwarderRefusesDynamic(t *testing.T) {
	// The test binary itself is a program of the user's; whether it is
	// static depends on how it was built, so look at one surely dynamic.
	for _, p := range []string{"/bin/sh", "/usr/bin/env"} {
		if err := checkForwarder(p); err != nil && strings.Contains(err.Error(), "dynamically") {
			return
		}
	}
	t.Skip("no dynamically linked program found to check")
}

// TestForwarderStdio: in its stdio mode the forwarder runs a program with
// a unix socket as its stdin and stdout.
func TestForwarderStdio(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to build the forwarder with")
	}
	bin, err := Forwarder(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sock := t.TempDir() + "/agent.sock"
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cmd := exec.Command(bin, "stdio", sock, "0", "--", "tr", "a-z", "A-Z")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "hello\n")
	c.(*net.UnixConn).CloseWrite()
	out, _ := io.ReadAll(c)
	if err := cmd.Wait(); err != nil || string(out) != "HELLO\n" {
		t.Errorf("through the socket: %q, %v, %s", out, err, stderr.String())
	}
	missing := exec.Command(bin, "stdio", sock, "0", "--", "no-such-agent-anywhere")
	b, err := missing.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 127 || !strings.Contains(string(b), "no-such-agent-anywhere") {
		t.Errorf("a missing program: %v, %q", err, b)
	}
}
