package egress

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// failingListener fails its first fails Accepts with err.
type failingListener struct {
	net.Listener
	fails atomic.Int32
	err   error
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, l.err
	}
	return l.Listener.Accept()
}

func TestTemporaryAcceptErrorsPass(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "egress.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	fl := &failingListener{Listener: ul, err: &net.OpError{Op: "accept", Net: "unix", Err: os.NewSyscallError("accept4", unix.EMFILE)}}
	fl.fails.Store(3)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&Proxy{}).Serve(ctx, fl) }()
	// Nothing is allowed: a 403 shows the proxy still serves.
	if code, _, _ := connect(t, sock, "example.com:443"); code != http.StatusForbidden {
		t.Errorf("CONNECT after temporary Accept failures: %d, want 403", code)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}

	// Any other failure ends Serve.
	ul2, err := net.Listen("unix", filepath.Join(t.TempDir(), "egress2.sock"))
	if err != nil {
		t.Fatal(err)
	}
	fl2 := &failingListener{Listener: ul2, err: os.ErrPermission}
	fl2.fails.Store(1)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if err := (&Proxy{}).Serve(ctx2, fl2); err == nil || ctx2.Err() != nil {
		t.Errorf("Serve after a lasting Accept failure: %v, want the failure at once", err)
	}
}
