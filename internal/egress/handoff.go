package egress

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// handoffTimeout bounds the wait for the first byte of a connection to the
// proxy's socket.
const handoffTimeout = 10 * time.Second

// listener accepts on the proxy's unix socket, taking a slot first (at
// most cap(slots) connections are served at once, the rest wait in the
// socket's backlog), and hands on each connection as the one it stands
// for: the forwarder sends, with one byte, the TCP connection it accepted
// in the container (SCM_RIGHTS), which the proxy then serves itself, with
// no program between; a client of the socket itself is served as it is.
type listener struct {
	l     net.Listener
	slots chan struct{}
	done  <-chan struct{}

	once  sync.Once
	conns chan net.Conn
	errc  chan error
	wg    sync.WaitGroup // the handoffs under way
}

func newListener(l net.Listener, slots chan struct{}, done <-chan struct{}) *listener {
	return &listener{l: l, slots: slots, done: done, conns: make(chan net.Conn), errc: make(chan error, 1)}
}

func (l *listener) Accept() (net.Conn, error) {
	l.once.Do(func() { go l.acceptLoop() })
	select {
	case c := <-l.conns:
		return c, nil
	case err := <-l.errc:
		return nil, err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *listener) Close() error { return l.l.Close() }

func (l *listener) Addr() net.Addr { return l.l.Addr() }

// acceptLoop accepts until the socket fails or is closed, each connection
// handed on (handoff) by a goroutine of its own: a client slow to send its
// first byte holds up no other. A temporary failure (out of descriptors,
// a connection aborted) is waited out, longer each time in a row.
func (l *listener) acceptLoop() {
	var backoff time.Duration
	for {
		select {
		case l.slots <- struct{}{}:
		case <-l.done:
			return
		}
		c, err := l.l.Accept()
		if err != nil {
			<-l.slots
			if !temporary(err) {
				l.errc <- err
				return
			}
			backoff = min(max(2*backoff, minAcceptBackoff), maxAcceptBackoff)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-l.done:
				t.Stop()
				return
			}
			continue
		}
		backoff = 0
		l.wg.Go(func() {
			hc, err := handoff(c)
			if err != nil {
				c.Close()
				<-l.slots
				return
			}
			select {
			case l.conns <- hc:
			case <-l.done:
				hc.Close()
				<-l.slots
			}
		})
	}
}

// Bounds of the wait after a temporary Accept failure.
const (
	minAcceptBackoff = 5 * time.Millisecond
	maxAcceptBackoff = time.Second
)

// temporary reports whether an Accept failure may pass: the process or
// the system out of descriptors or memory, a connection that went away
// before it was accepted, an interrupted call.
func temporary(err error) bool {
	for _, e := range []error{unix.EMFILE, unix.ENFILE, unix.ENOBUFS, unix.ENOMEM, unix.ECONNABORTED, unix.EINTR, unix.EAGAIN, unix.EPROTO} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// handoff reads the first byte of c, and the connection that came with it:
// that connection, when it is a TCP one; c itself, the byte put back, when
// none came.
func handoff(c net.Conn) (net.Conn, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return c, nil
	}
	uc.SetReadDeadline(time.Now().Add(handoffTimeout))
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if got, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	if len(fds) == 0 {
		if n == 0 {
			return nil, errors.New("nothing sent")
		}
		uc.SetReadDeadline(time.Time{})
		return &prefixed{UnixConn: uc, head: buf[:n]}, nil
	}
	for _, fd := range fds[1:] {
		unix.Close(fd)
	}
	if flags&unix.MSG_CTRUNC != 0 {
		unix.Close(fds[0])
		return nil, errors.New("more descriptors than one")
	}
	tc, err := tcpConn(fds[0])
	if err != nil {
		return nil, err
	}
	c.Close()
	return tc, nil
}

// tcpConn makes fd, which a process of the container sent, a connection
// of the proxy's, if it is a TCP socket: anything else (a file, a pipe, a
// socket of another kind) is refused.
func tcpConn(fd int) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), "client")
	defer f.Close()
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil || typ != unix.SOCK_STREAM {
		return nil, errors.New("not a stream socket")
	}
	if proto, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL); err != nil || proto != unix.IPPROTO_TCP {
		return nil, errors.New("not a TCP socket")
	}
	if listening, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || listening != 0 {
		return nil, errors.New("a listening socket")
	}
	c, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("not a TCP connection: %T", c)
	}
	return tc, nil
}

// prefixed is a client of the socket itself, its first byte read already.
type prefixed struct {
	*net.UnixConn
	mu   sync.Mutex
	head []byte
}

func (p *prefixed) Read(b []byte) (int, error) {
	p.mu.Lock()
	if len(p.head) > 0 {
		n := copy(b, p.head)
		p.head = p.head[n:]
		p.mu.Unlock()
		return n, nil
	}
	p.mu.Unlock()
	return p.UnixConn.Read(b)
}
