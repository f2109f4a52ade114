package acp

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/loglimit"
	"github.com/sandboxd/sandboxd/sandbox"
)

// ListenUnix listens on a unix socket that only the owner may connect to:
// the socket has mode 0600 from its creation, and every connection's peer
// is checked. log takes the refusals.
func ListenUnix(path string, log *slog.Logger) (net.Listener, error) {
	ln, err := bindUnix(path)
	if err != nil {
		return nil, err
	}
	// Peers are checked also where the mode keeps others out: an abstract
	// socket (@name) has no mode at all.
	return &ownerListener{Listener: ln, uids: []uint32{uint32(os.Geteuid()), 0}, log: log}, nil
}

func bindUnix(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		// A socket left by a crashed instance; a live one would still
		// accept connections.
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("listen %s: another sandboxd is serving there", path)
		}
		os.Remove(path)
	}
	if strings.HasPrefix(path, "@") {
		// An abstract socket: no file, nothing to see before it listens.
		ln, err := net.Listen("unix", path)
		if err != nil {
			return nil, fmt.Errorf("listen %s: %w", path, err)
		}
		return ln, nil
	}
	// Bound under another name and linked into place once it listens:
	// between bind and listen the file is there but refuses connections,
	// and a client that waits for the file to appear would be refused. A
	// link, unlike a rename, fails when something took the name meanwhile
	// (another sandboxd starting on the same path), rather than replace it.
	suffix := make([]byte, 6)
	rand.Read(suffix)
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".%s.%x", filepath.Base(path), suffix))
	// Mode 0600 from the start, not chmod-ed after: no other user can
	// connect in between.
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", tmp)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	err = os.Link(tmp, path)
	os.Remove(tmp)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	return ln, nil
}

// ownerListener accepts connections from processes of the given users
// only; others are closed at once.
type ownerListener struct {
	net.Listener
	uids     []uint32
	log      *slog.Logger
	refusals loglimit.Limit
}

func (l *ownerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uid, pid, err := peerCred(c)
		if err == nil && slices.Contains(l.uids, uid) {
			return c, nil
		}
		if n, ok := l.refusals.Allow(time.Now()); ok {
			if err == nil {
				err = fmt.Errorf("uid %d is not sandboxd's", uid)
			}
			l.log.Warn("connection from another user refused", "pid", pid, "err", err, "not_logged", n)
		}
		c.Close()
	}
}

// peerCred returns the user and process of a unix connection's peer, as
// the kernel recorded them when it connected.
func peerCred(c net.Conn) (uid uint32, pid int32, err error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0, 0, fmt.Errorf("peer credentials: %T is no unix connection", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, 0, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, 0, fmt.Errorf("peer credentials: %w", err)
	}
	if cerr != nil {
		return 0, 0, fmt.Errorf("peer credentials: %w", cerr)
	}
	return cred.Uid, cred.Pid, nil
}

// ServeListener accepts connections until ctx ends and serves each with its
// own Terminals, so connections never see each other's sessions.
func ServeListener(ctx context.Context, ln net.Listener, m *sandbox.Manager, workspace string, log *slog.Logger) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	var delay time.Duration
	for n := 1; ; n++ {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("accept: %w", err)
			}
			// Out of descriptors, say: the connections being served
			// must go on, and new ones are taken again once some end.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			log.Warn("accept failed; retrying", "err", err, "in", delay)
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return nil
			}
			n--
			continue
		}
		delay = 0
		wg.Add(1)
		go func() {
			defer wg.Done()
			clog := log.With("conn", n)
			clog.Info("connection opened")
			t := NewTerminals(m.NewScope(fmt.Sprintf("conn%d", n), workspace, sandbox.SessionSpec{}))
			if err := Serve(ctx, c, t, clog); err != nil {
				clog.Warn("connection closed with errors", "err", err)
			}
			clog.Info("connection closed")
		}()
	}
}
