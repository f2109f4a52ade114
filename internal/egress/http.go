package egress

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// forward serves a plain HTTP request in absolute form ("GET
// http://host/path"). Each request is checked by itself, also the second
// of a connection the client keeps alive, and goes out on a connection of
// its own, to the address its check found.
func (s *server) forward(w http.ResponseWriter, r *http.Request) {
	p := s.p
	start := time.Now()
	ev := Event{Method: r.Method, Host: r.URL.Hostname()}
	fail := func(rf *refusal) {
		refuse(w, rf)
		ev.Allowed = rf.code != http.StatusForbidden && rf.code != http.StatusBadRequest
		ev.Reason, ev.Duration = rf.reason, time.Since(start)
		p.report(ev)
	}
	if r.URL.Scheme != "http" || r.URL.Host == "" || r.URL.User != nil {
		fail(&refusal{http.StatusBadRequest, "want a proxy request: an absolute http:// URL without user info, or CONNECT for https"})
		return
	}
	ev.Port = 80
	if pt := r.URL.Port(); pt != "" {
		n, err := strconv.Atoi(pt)
		if err != nil || n < 1 || n > 65535 {
			fail(&refusal{http.StatusBadRequest, "port " + strconv.Quote(truncate(pt, 50)) + " is not a number from 1 to 65535"})
			return
		}
		ev.Port = n
	}
	addrs, rf := p.check(r.Context(), ev.Host, ev.Port)
	if rf != nil {
		fail(rf)
		return
	}
	ev.Allowed = true
	// A destination that sends nothing for idle ends the request: the
	// timer is reset by every read of the response (copyFlushing).
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	quiet := time.AfterFunc(p.idle(), cancel)
	defer quiet.Stop()
	out := r.Clone(ctx)
	out.RequestURI = ""
	// The URL's host, not the Host header the client chose: the server
	// is told where the request was checked to go.
	out.Host = ""
	dropHopByHop(out.Header)
	var sent counter
	if r.Body != nil && r.Body != http.NoBody {
		sent.r = r.Body
		out.Body = &sent
	}
	t := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return p.dial(ctx, ev.Host, addrs, ev.Port)
		},
		// One request per connection: no later request rides on one
		// this request's check opened.
		DisableKeepAlives:      true,
		DisableCompression:     true,
		MaxResponseHeaderBytes: maxHeaderBytes,
		ResponseHeaderTimeout:  p.idle(),
	}
	defer t.CloseIdleConnections()
	resp, err := t.RoundTrip(out)
	if err != nil {
		rf, ok := err.(*refusal)
		if !ok {
			rf = &refusal{http.StatusBadGateway, "request to " + net.JoinHostPort(ev.Host, strconv.Itoa(ev.Port)) + ": " + oneLine(err)}
		}
		fail(rf)
		return
	}
	defer resp.Body.Close()
	dropHopByHop(resp.Header)
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	ev.Received = copyFlushing(w, resp.Body, quiet, p.idle())
	ev.Sent, ev.Duration = sent.n.Load(), time.Since(start)
	p.report(ev)
}

// hopByHop are the headers of one connection, which a proxy does not pass
// on; so are those a Connection header names.
var hopByHop = [...]string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func dropHopByHop(h http.Header) {
	for _, v := range h.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopByHop {
		h.Del(name)
	}
}

// copyFlushing copies a response body to w, flushing as it goes (a stream
// of events must not wait in a buffer), and returns the bytes copied. Each
// read resets quiet to idle, and each write may take that long.
func copyFlushing(w http.ResponseWriter, body io.Reader, quiet *time.Timer, idle time.Duration) int64 {
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	var n int64
	for {
		k, err := body.Read(buf)
		quiet.Reset(idle)
		if k > 0 {
			rc.SetWriteDeadline(time.Now().Add(idle))
			if _, werr := w.Write(buf[:k]); werr != nil {
				return n
			}
			n += int64(k)
			rc.Flush()
		}
		if err != nil {
			return n
		}
	}
}

// counter counts what is read through it.
type counter struct {
	r io.ReadCloser
	n atomic.Int64 // read after the transport is done with it, from another goroutine
}

func (c *counter) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n.Add(int64(k))
	return k, err
}

func (c *counter) Close() error { return c.r.Close() }
