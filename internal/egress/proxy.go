package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/loglimit"
)

// Defaults of Proxy's limits.
const (
	defaultMaxConns    = 128
	defaultIdleTimeout = 5 * time.Minute
	defaultDialTimeout = 10 * time.Second
	// maxHeaderBytes bounds a request's header, and a response's.
	maxHeaderBytes = 64 << 10
	// headerTimeout bounds the wait for a request's header.
	headerTimeout = 30 * time.Second
)

// Event is what the proxy reports of one request once it ended, allowed
// or refused.
type Event struct {
	// Method is CONNECT, or a plain HTTP request's method.
	Method string
	Host   string
	Port   int
	// Allowed says the request was let through; Reason says why not,
	// or why it failed all the same (no address, no connection).
	Allowed bool
	Reason  string
	// Sent and Received are the bytes to and from the destination: a
	// tunnel's, or a request's and its response's bodies.
	Sent, Received int64
	Duration       time.Duration
	// LeftOut counts the refusals not reported before this one, to keep
	// a flood of them down (see maxReportedRefusals).
	LeftOut int
}

// Proxy is the egress proxy of one container. The zero value with an
// Allowlist set is ready to Serve; the other fields tune it.
type Proxy struct {
	Allow Allowlist
	// Resolve looks a host name up; nil is the host's resolver.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// HostAddrs returns the host's own addresses, which a name is
	// refused to lead to as internal ones are; nil is the addresses of
	// the host's interfaces, looked up at each check.
	HostAddrs func() ([]netip.Addr, error)
	// Report, when set, is told of each request once it ended.
	Report func(Event)
	Log    *slog.Logger
	// MaxConns bounds the connections served at once; more wait to be
	// accepted. IdleTimeout ends a connection (a tunnel: both ways) that
	// carried nothing for that long; DialTimeout bounds a name lookup
	// and a connection to a destination. Zero takes the defaults.
	MaxConns    int
	IdleTimeout time.Duration
	DialTimeout time.Duration

	// refusedLog and refusedReport bound what refusals log and report.
	refusedLog    loglimit.Limit
	refusedReport burst
}

func (p *Proxy) idle() time.Duration { return orDefault(p.IdleTimeout, defaultIdleTimeout) }

func (p *Proxy) dialTimeout() time.Duration { return orDefault(p.DialTimeout, defaultDialTimeout) }

func orDefault(v, def time.Duration) time.Duration {
	if v > 0 {
		return v
	}
	return def
}

func (p *Proxy) log() *slog.Logger {
	if p.Log != nil {
		return p.Log
	}
	return slog.New(slog.DiscardHandler)
}

// Serve serves the connections l accepts until ctx ends, then closes l
// and every connection and returns once their handlers did.
func (p *Proxy) Serve(ctx context.Context, l net.Listener) error {
	max := p.MaxConns
	if max <= 0 {
		max = defaultMaxConns
	}
	s := &server{p: p, slots: make(chan struct{}, max), tunnels: make(map[net.Conn]struct{})}
	srv := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       p.idle(),
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          log.New(io.Discard, "", 0),
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ConnState: func(_ net.Conn, st http.ConnState) {
			// A hijacked connection keeps its slot until its tunnel ends.
			if st == http.StateClosed {
				<-s.slots
			}
		},
	}
	stop := context.AfterFunc(ctx, func() {
		srv.Close()
		s.closeTunnels()
	})
	defer stop()
	hl := newListener(l, s.slots, ctx.Done())
	err := srv.Serve(hl)
	srv.Close()
	s.closeTunnels()
	hl.wg.Wait()
	s.wg.Wait()
	p.flushReport()
	if ctx.Err() != nil || errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("egress proxy: %w", err)
}

// server is one Serve's handler and what it tracks.
type server struct {
	p     *Proxy
	slots chan struct{}
	wg    sync.WaitGroup

	mu      sync.Mutex
	tunnels map[net.Conn]struct{}
	closed  bool
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.enter() {
		return
	}
	defer s.wg.Done()
	if r.Method == http.MethodConnect {
		s.connect(w, r)
		return
	}
	s.forward(w, r)
}

// refusal is why a request is not let through, and the status it gets.
type refusal struct {
	code   int
	reason string
}

func (e *refusal) Error() string { return e.reason }

// check decides whether host:port may be reached and returns the
// addresses to connect to: the ones it checked, so that no second lookup
// (DNS rebinding) can lead elsewhere.
func (p *Proxy) check(ctx context.Context, host string, port int) ([]netip.Addr, *refusal) {
	dest := net.JoinHostPort(host, strconv.Itoa(port))
	addr, err := netip.ParseAddr(host)
	if err == nil {
		if addr.Zone() != "" {
			return nil, &refusal{http.StatusForbidden, dest + " has a zone, which cannot be allowed"}
		}
		addr = addr.Unmap()
	} else if host, err = hostName(host); err != nil {
		return nil, &refusal{http.StatusBadRequest, err.Error()}
	}
	allowed, exact := p.Allow.match(host, addr, port)
	if !allowed {
		return nil, &refusal{http.StatusForbidden, dest + " is not allowed (--allow-host, [egress] allow)"}
	}
	if addr.IsValid() {
		return []netip.Addr{addr}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.dialTimeout())
	defer cancel()
	resolve := p.Resolve
	if resolve == nil {
		resolve = lookupRooted
	}
	addrs, err := resolve(ctx, host)
	if err == nil && len(addrs) == 0 {
		err = errors.New("no address")
	}
	if err != nil {
		return nil, &refusal{http.StatusBadGateway, fmt.Sprintf("cannot resolve %s: %v", host, oneLine(err))}
	}
	for i, a := range addrs {
		addrs[i] = a.Unmap()
	}
	if exact {
		return addrs, nil
	}
	hostAddrs := p.HostAddrs
	if hostAddrs == nil {
		hostAddrs = interfaceAddrs
	}
	own, err := hostAddrs()
	if err != nil {
		return nil, &refusal{http.StatusInternalServerError, oneLine(err)}
	}
	for _, a := range addrs {
		// Any one: a name that also leads inside could be answered
		// that way at the connection's retry.
		if internal(a) || slices.Contains(own, a) {
			return nil, &refusal{http.StatusForbidden, fmt.Sprintf("%s resolves to %s, a loopback, private, link-local or the host's own address: allowed only when %s is listed exactly", host, a, dest)}
		}
	}
	return addrs, nil
}

// lookupRooted looks host up with the host's resolver as the whole name it
// is: rooted, so that no search domain of resolv.conf is tried after it.
// A name of one label is looked up as it is: only an exact entry allows
// one, and Go's resolver finds such a name in /etc/hosts only unrooted.
func lookupRooted(ctx context.Context, host string) ([]netip.Addr, error) {
	if strings.Contains(host, ".") {
		host += "."
	}
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// dial connects to the first of addrs that answers on port.
func (p *Proxy) dial(ctx context.Context, host string, addrs []netip.Addr, port int) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, p.dialTimeout())
	defer cancel()
	var d net.Dialer
	var errs []error
	for _, a := range addrs {
		c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(a, uint16(port)).String())
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, &refusal{http.StatusBadGateway, fmt.Sprintf("cannot connect to %s: %v", net.JoinHostPort(host, strconv.Itoa(port)), oneLine(errors.Join(errs...)))}
}

// oneLine is an error's message on one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// refuse answers a request that is not let through with code and a
// one-line reason, and closes the connection.
func refuse(w http.ResponseWriter, r *refusal) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Connection", "close")
	w.WriteHeader(r.code)
	io.WriteString(w, "sandboxd egress: "+r.reason+"\n")
}

// enter counts a handler that Serve waits for as it ends; it reports
// false when Serve is ending already.
func (s *server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

// track adds a hijacked connection to those Serve closes as it ends; it
// reports false when Serve is ending already.
func (s *server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.tunnels[c] = struct{}{}
	return true
}

func (s *server) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.tunnels, c)
	s.mu.Unlock()
}

func (s *server) closeTunnels() {
	s.mu.Lock()
	s.closed = true
	for c := range s.tunnels {
		c.Close()
	}
	s.mu.Unlock()
}
