package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// served is a Proxy serving on a unix socket of the test's.
type served struct {
	sock string
	mu   sync.Mutex
	evs  []Event
	cond chan struct{}
}

// serve starts p on a unix socket; cleanup stops it.
func serve(t *testing.T, p *Proxy) *served {
	t.Helper()
	s := &served{sock: filepath.Join(t.TempDir(), "egress.sock"), cond: make(chan struct{}, 100)}
	l, err := net.Listen("unix", s.sock)
	if err != nil {
		t.Fatal(err)
	}
	p.Report = func(ev Event) {
		s.mu.Lock()
		s.evs = append(s.evs, ev)
		s.mu.Unlock()
		s.cond <- struct{}{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Serve did not end")
		}
	})
	return s
}

// event waits for the next event reported.
func (s *served) event(t *testing.T) Event {
	t.Helper()
	select {
	case <-s.cond:
	case <-time.After(10 * time.Second):
		t.Fatal("no event reported")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ev := s.evs[0]
	s.evs = s.evs[1:]
	return ev
}

func allow(t *testing.T, entries ...string) Allowlist {
	t.Helper()
	l, err := ParseAllowlist(entries)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// echoServer listens on 127.0.0.1 and echoes what each connection sends,
// upper-cased by nothing: as it is.
func echoServer(t *testing.T) (addr string, port int) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	return l.Addr().String(), l.Addr().(*net.TCPAddr).Port
}

// freePort is a port of 127.0.0.1 nothing listens on.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}

// connect sends a CONNECT for dest and returns the status line, the body
// of a refusal, and the connection.
func connect(t *testing.T, sock, dest string) (int, string, net.Conn) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", dest, dest)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("CONNECT %s: %v", dest, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), c
	}
	return resp.StatusCode, "", c
}

func TestConnectAllowed(t *testing.T) {
	addr, port := echoServer(t)
	s := serve(t, &Proxy{Allow: allow(t, addr)})
	code, body, c := connect(t, s.sock, addr)
	if code != http.StatusOK {
		t.Fatalf("CONNECT %s: %d %s", addr, code, body)
	}
	io.WriteString(c, "hello")
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("through the tunnel: %q, %v", buf, err)
	}
	c.(*net.UnixConn).CloseWrite()
	if rest, _ := io.ReadAll(c); len(rest) != 0 {
		t.Errorf("more after the echo: %q", rest)
	}
	ev := s.event(t)
	if !ev.Allowed || ev.Reason != "" || ev.Method != "CONNECT" || ev.Host != "127.0.0.1" || ev.Port != port || ev.Sent != 5 || ev.Received != 5 || ev.Duration <= 0 {
		t.Errorf("event %+v", ev)
	}
}

func TestConnectRefused(t *testing.T) {
	addr, port := echoServer(t)
	other := freePort(t)
	s := serve(t, &Proxy{Allow: allow(t, fmt.Sprintf("127.0.0.1:%d", other))})
	code, body, _ := connect(t, s.sock, addr)
	want := fmt.Sprintf("sandboxd egress: 127.0.0.1:%d is not allowed (--allow-host, [egress] allow)\n", port)
	if code != http.StatusForbidden || body != want {
		t.Errorf("CONNECT %s: %d %q, want 403 %q", addr, code, body, want)
	}
	if ev := s.event(t); ev.Allowed || !strings.Contains(ev.Reason, "is not allowed") || ev.Port != port {
		t.Errorf("event %+v", ev)
	}
	// Allowed, but nothing listens: 502, and the event says why.
	code, body, _ = connect(t, s.sock, fmt.Sprintf("127.0.0.1:%d", other))
	if code != http.StatusBadGateway || !strings.Contains(body, "cannot connect") || strings.Count(body, "\n") != 1 {
		t.Errorf("CONNECT to a closed port: %d %q", code, body)
	}
	if ev := s.event(t); !ev.Allowed || !strings.Contains(ev.Reason, "cannot connect") {
		t.Errorf("event %+v", ev)
	}
	for _, dest := range []string{"127.0.0.1", "127.0.0.1:0", "[fe80::1%25lo]:80"} {
		if code, _, _ := connect(t, s.sock, dest); code != http.StatusBadRequest && code != http.StatusForbidden {
			t.Errorf("CONNECT %s: %d, want a refusal", dest, code)
		}
		s.event(t)
	}
}

// fakeDNS answers every name with addrs and counts the lookups.
type fakeDNS struct {
	mu    sync.Mutex
	addrs map[string][]netip.Addr
	n     int
}

func (f *fakeDNS) resolve(_ context.Context, host string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	a, ok := f.addrs[host]
	if !ok {
		return nil, errors.New("no such host")
	}
	return a, nil
}

func TestNameThatLeadsInside(t *testing.T) {
	addr, port := echoServer(t)
	dns := &fakeDNS{addrs: map[string][]netip.Addr{
		"evil.example.com":  {netip.MustParseAddr("127.0.0.1")},
		"mixed.example.com": {netip.MustParseAddr("93.184.215.14"), netip.MustParseAddr("::ffff:127.0.0.1")},
		"ok.example.org":    {netip.MustParseAddr("127.0.0.1")},
	}}
	s := serve(t, &Proxy{Allow: allow(t, fmt.Sprintf("*.example.com:%d", port), fmt.Sprintf("ok.example.org:%d", port)), Resolve: dns.resolve})
	for _, host := range []string{"evil.example.com", "mixed.example.com"} {
		code, body, _ := connect(t, s.sock, fmt.Sprintf("%s:%d", host, port))
		if code != http.StatusForbidden || !strings.Contains(body, "resolves to 127.0.0.1, a loopback, private, link-local or the host's own address") {
			t.Errorf("CONNECT %s by a wildcard: %d %q", host, code, body)
		}
		if ev := s.event(t); ev.Allowed || ev.Host != host {
			t.Errorf("event %+v", ev)
		}
	}
	// Listed exactly, the same address is let through: once resolved,
	// and connected to as resolved.
	dns.n = 0
	code, body, c := connect(t, s.sock, fmt.Sprintf("ok.example.org:%d", port))
	if code != http.StatusOK {
		t.Fatalf("CONNECT to an exact entry: %d %q", code, body)
	}
	io.WriteString(c, "x")
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	s.event(t)
	if dns.n != 1 {
		t.Errorf("%d lookups for one CONNECT, want 1 (no second lookup to rebind)", dns.n)
	}
	if code, body, _ := connect(t, s.sock, fmt.Sprintf("gone.example.com:%d", port)); code != http.StatusBadGateway || !strings.Contains(body, "cannot resolve gone.example.com") {
		t.Errorf("an unknown name: %d %q", code, body)
	}
	s.event(t)
	_ = addr
}

// A name that resolves to one of the host's own addresses, public or not,
// is refused unless listed exactly.
func TestNameThatLeadsToTheHost(t *testing.T) {
	own := netip.MustParseAddr("93.184.215.14")
	dns := &fakeDNS{addrs: map[string][]netip.Addr{"me.example.com": {own}}}
	hostAddrs := func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("127.0.0.1"), own}, nil }
	s := serve(t, &Proxy{Allow: allow(t, "*.example.com:443"), Resolve: dns.resolve, HostAddrs: hostAddrs})
	code, body, _ := connect(t, s.sock, "me.example.com:443")
	if code != http.StatusForbidden || !strings.Contains(body, "resolves to 93.184.215.14, a loopback, private, link-local or the host's own address") {
		t.Errorf("CONNECT to a name of the host's address: %d %q", code, body)
	}
	if ev := s.event(t); ev.Allowed {
		t.Errorf("event %+v", ev)
	}
	// The real interface addresses include loopback's.
	addrs, err := interfaceAddrs()
	if err != nil || !slices.Contains(addrs, netip.MustParseAddr("127.0.0.1")) {
		t.Errorf("interfaceAddrs = %v, %v; want 127.0.0.1 among them", addrs, err)
	}
}

// A rooted lookup still finds the names of /etc/hosts.
func TestLookupRooted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addrs, err := lookupRooted(ctx, "localhost")
	if err != nil || len(addrs) == 0 {
		t.Errorf("lookupRooted(localhost) = %v, %v", addrs, err)
	}
}

// proxyClient is an HTTP client whose proxy is the unix socket sock.
func proxyClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "egress"}),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
}

func TestPlainHTTP(t *testing.T) {
	var mu sync.Mutex
	var seen http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = r.Header.Clone()
		mu.Unlock()
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Keep-Alive", "timeout=5")
		fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.Path, b)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	s := serve(t, &Proxy{Allow: allow(t, host)})
	req, _ := http.NewRequest("POST", srv.URL+"/x", strings.NewReader("body"))
	req.Header.Set("Connection", "X-Secret")
	req.Header.Set("X-Secret", "1")
	req.Header.Set("Proxy-Authorization", "Basic eA==")
	resp, err := proxyClient(s.sock).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "POST /x body" {
		t.Fatalf("through the proxy: %d %q", resp.StatusCode, b)
	}
	if resp.Header.Get("Keep-Alive") != "" {
		t.Error("a hop-by-hop header of the response was passed on")
	}
	mu.Lock()
	if seen.Get("X-Secret") != "" || seen.Get("Proxy-Authorization") != "" {
		t.Errorf("hop-by-hop headers reached the server: %v", seen)
	}
	mu.Unlock()
	ev := s.event(t)
	if !ev.Allowed || ev.Method != "POST" || ev.Sent != 4 || ev.Received != int64(len(b)) {
		t.Errorf("event %+v", ev)
	}
}

// TestEachRequestIsChecked sends, on one connection the client keeps
// alive, a request that is allowed and then one that is not.
func TestEachRequestIsChecked(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	s := serve(t, &Proxy{Allow: allow(t, host)})
	c, err := net.Dial("unix", s.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	other := freePort(t)
	fmt.Fprintf(c, "GET %s/a HTTP/1.1\r\nHost: %s\r\n\r\nGET http://127.0.0.1:%d/b HTTP/1.1\r\nHost: %s\r\n\r\n", srv.URL, host, other, host)
	br := bufio.NewReader(c)
	for i, want := range []int{200, 403} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			t.Errorf("response %d: %d %q, want %d", i, resp.StatusCode, b, want)
		}
	}
	s.event(t)
	if ev := s.event(t); ev.Allowed || ev.Port != other {
		t.Errorf("second request's event %+v", ev)
	}
	// A request that is no proxy request (origin form) is refused too.
	c2, _ := net.Dial("unix", s.sock)
	defer c2.Close()
	fmt.Fprintf(c2, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host)
	resp, err := http.ReadResponse(bufio.NewReader(c2), nil)
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Errorf("origin-form request: %v %v", resp, err)
	}
	s.event(t)
}

func TestHeaderIsBounded(t *testing.T) {
	s := serve(t, &Proxy{})
	c, err := net.Dial("unix", s.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() {
		fmt.Fprintf(c, "GET http://x/ HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 1<<20))
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a 1 MiB header: %v %v", resp, err)
	}
}

func TestConnectionsAreBounded(t *testing.T) {
	addr, _ := echoServer(t)
	s := serve(t, &Proxy{Allow: allow(t, addr), MaxConns: 1})
	code, _, first := connect(t, s.sock, addr)
	if code != 200 {
		t.Fatal(code)
	}
	second, err := net.Dial("unix", s.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	fmt.Fprintf(second, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", addr, addr)
	second.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := second.Read(make([]byte, 1)); !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(fmt.Sprint(err), "timeout") {
		t.Fatalf("a second connection beyond MaxConns was served: %v", err)
	}
	first.Close()
	s.event(t)
	second.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(second), &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Errorf("the second connection once the first ended: %v %v", resp, err)
	}
}

// TestIdleTunnelEnds: a tunnel that carries nothing for IdleTimeout is
// closed; one that carries something is not.
func TestIdleTunnelEnds(t *testing.T) {
	addr, _ := echoServer(t)
	s := serve(t, &Proxy{Allow: allow(t, addr), IdleTimeout: 300 * time.Millisecond})
	_, _, c := connect(t, s.sock, addr)
	// Busy for longer than the timeout first.
	for range 8 {
		io.WriteString(c, "x")
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			t.Fatalf("a busy tunnel ended: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // traffic, not synchronisation
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil || strings.Contains(err.Error(), "timeout") {
		t.Errorf("an idle tunnel: read %d, %v; want its end", n, err)
	}
	if ev := s.event(t); !ev.Allowed || ev.Sent != 8 || ev.Received != 8 {
		t.Errorf("event %+v", ev)
	}
}

// TestHandoffTakesOnlyTCP: a descriptor sent with the first byte that is
// no TCP socket (here a pipe's end) is refused, and the connection closed.
func TestHandoffTakesOnlyTCP(t *testing.T) {
	s := serve(t, &Proxy{})
	c, err := net.Dial("unix", s.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var p [2]int
	if err := syscall.Pipe(p[:]); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	if _, _, err := c.(*net.UnixConn).WriteMsgUnix([]byte{0}, syscall.UnixRights(p[1]), nil); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Errorf("after a pipe was sent: read %d, %v; want the connection closed", n, err)
	}
}
