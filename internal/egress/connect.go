package egress

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// connect serves a CONNECT request: a tunnel to an allowed destination.
// The destination is connected to before the client is answered, so that
// a failure is a status, not a closed tunnel.
func (s *server) connect(w http.ResponseWriter, r *http.Request) {
	p := s.p
	start := time.Now()
	ev := Event{Method: http.MethodConnect, Host: r.Host}
	host, portText, err := net.SplitHostPort(r.Host)
	port, perr := strconv.Atoi(portText)
	if err != nil || perr != nil || port < 1 || port > 65535 {
		rf := &refusal{http.StatusBadRequest, "CONNECT wants HOST:PORT, not " + strconv.Quote(truncate(r.Host, 200))}
		refuse(w, rf)
		ev.Reason = rf.reason
		p.report(ev)
		return
	}
	ev.Host, ev.Port = host, port
	fail := func(rf *refusal) {
		refuse(w, rf)
		ev.Allowed = rf.code != http.StatusForbidden && rf.code != http.StatusBadRequest
		ev.Reason, ev.Duration = rf.reason, time.Since(start)
		p.report(ev)
	}
	addrs, rf := p.check(r.Context(), host, port)
	if rf != nil {
		fail(rf)
		return
	}
	up, err := p.dial(r.Context(), host, addrs, port)
	if err != nil {
		fail(err.(*refusal))
		return
	}
	defer up.Close()
	ev.Allowed = true
	hj, ok := w.(http.Hijacker)
	if !ok {
		fail(&refusal{http.StatusInternalServerError, "the connection cannot be taken over"})
		return
	}
	client, brw, err := hj.Hijack()
	if err != nil {
		ev.Reason, ev.Duration = "take over the connection: "+oneLine(err), time.Since(start)
		p.report(ev)
		return
	}
	// The slot taken for the connection is given back with it, as the
	// server would for one it closes.
	defer func() { <-s.slots }()
	defer client.Close()
	if !s.track(client) {
		return
	}
	defer s.untrack(client)
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		ev.Reason, ev.Duration = "answer the client: "+oneLine(err), time.Since(start)
		p.report(ev)
		return
	}
	// What the client sent past its request (a TLS hello that did not
	// wait for the answer) is in the server's buffer.
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		if _, err := up.Write(b); err != nil {
			ev.Reason, ev.Duration = "write to the destination: "+oneLine(err), time.Since(start)
			p.report(ev)
			return
		}
		ev.Sent += int64(n)
	}
	sent, received := relay(client, up, p.idle())
	ev.Sent += sent
	ev.Received, ev.Duration = received, time.Since(start)
	p.report(ev)
}

// relay copies between client and up both ways until both ended, or one
// failed, or neither carried anything for idle, and returns the bytes
// copied from client to up and from up to client. An end of one way is
// passed on as such (a half-close), for protocols that read to the end
// before they answer. Between a unix and a TCP connection the kernel
// moves the bytes (splice), which no wrapper of the connections may keep
// from it: the idle watch reads the TCP connection's own counters.
func relay(client, up net.Conn, idle time.Duration) (sent, received int64) {
	done := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(done)
		received = half(client, up)
	}()
	go watchIdle(up, []net.Conn{client, up}, idle, stop)
	sent = half(up, client)
	<-done
	close(stop)
	return sent, received
}

// half copies src to dst until src ends, which it passes on to dst as a
// half-close, or fails, which closes both.
func half(dst, src net.Conn) int64 {
	var n int64
	var err error
	if rf, ok := dst.(io.ReaderFrom); ok {
		// Not io.Copy, which asks src first: a TCP connection's WriteTo
		// splices only to a unix one, its ReadFrom from either.
		n, err = rf.ReadFrom(src)
	} else {
		n, err = io.Copy(dst, src)
	}
	if err == nil {
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			return n
		}
	}
	src.Close()
	dst.Close()
	return n
}

// watchIdle closes conns once the TCP connection up has neither sent nor
// received anything for idle, until stop is closed.
func watchIdle(up net.Conn, conns []net.Conn, idle time.Duration, stop <-chan struct{}) {
	tick := time.NewTicker(max(idle/8, 10*time.Millisecond))
	defer tick.Stop()
	last, moved := progress(up), time.Now()
	for {
		select {
		case <-stop:
			return
		case now := <-tick.C:
			if p := progress(up); p != last {
				last, moved = p, now
			} else if now.Sub(moved) >= idle {
				for _, c := range conns {
					c.Close()
				}
				return
			}
		}
	}
}

// progress is what a TCP connection has sent (and had acknowledged) and
// received, as the kernel counts; 0 when it cannot tell, when only the
// clock ends the connection.
func progress(c net.Conn) uint64 {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0
	}
	var n uint64
	rc.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			n = info.Bytes_acked + info.Bytes_received
		}
	})
	return n
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
