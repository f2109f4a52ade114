package acp

import (
	"errors"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Stdio is a peer's connection over sandboxd's standard input and output.
type Stdio struct {
	io.Reader
	io.Writer

	hangup    chan struct{}
	stopWatch func()
}

// NewStdio joins in and out into one connection. When in is a pipe or a
// socket, the connection also tells when the peer has closed its end of
// in (Hangup), also while nobody reads in: a wrap blocked writing to an
// agent that reads nothing would otherwise never see the editor go.
func NewStdio(in io.Reader, out io.Writer) *Stdio {
	s := &Stdio{Reader: in, Writer: out, stopWatch: func() {}}
	if f, ok := in.(*os.File); ok {
		s.hangup = make(chan struct{})
		s.stopWatch = watchHangup(f, s.hangup)
	}
	return s
}

// Hangup is closed once the peer closed its end of the input. It is nil
// (never ready) when that cannot be told.
func (s *Stdio) Hangup() <-chan struct{} { return s.hangup }

// Close stops watching for the hangup; the standard streams stay open.
func (s *Stdio) Close() error {
	s.stopWatch()
	return nil
}

// watchHangup closes hangup once f's peer has hung up, until stop is
// called. poll reports a hangup of a pipe's writers (POLLHUP) or a
// socket's peer shutting down its writing (POLLRDHUP) without reading any
// of what waits to be read; a regular file or a terminal never reports
// one. A second pipe wakes the watcher when it is to stop.
func watchHangup(f *os.File, hangup chan<- struct{}) (stop func()) {
	// A duplicate, so that the watch never polls a descriptor that was
	// closed and reused meanwhile.
	// Through SyscallConn, not Fd, which would make a pollable input
	// blocking.
	rc, err := f.SyscallConn()
	if err != nil {
		return func() {}
	}
	fd := -1
	if err := rc.Control(func(orig uintptr) { fd, err = unix.FcntlInt(orig, unix.F_DUPFD_CLOEXEC, 0) }); err != nil || fd < 0 {
		return func() {}
	}
	var wake [2]int
	if err := unix.Pipe2(wake[:], unix.O_CLOEXEC); err != nil {
		unix.Close(fd)
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer unix.Close(fd)
		defer unix.Close(wake[0])
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}, {Fd: int32(wake[0]), Events: unix.POLLIN}}
		for {
			_, err := unix.Poll(fds, -1)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil || fds[1].Revents != 0 {
				return
			}
			if fds[0].Revents&(unix.POLLHUP|unix.POLLRDHUP|unix.POLLERR) != 0 {
				close(hangup)
				return
			}
			if fds[0].Revents&unix.POLLNVAL != 0 {
				return
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			unix.Write(wake[1], []byte{0})
			<-done
			unix.Close(wake[1])
		})
	}
}
