package console

import (
	"errors"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Input reads f until stop is closed: a read that waits for input then
// ends with io.EOF, and what was not read yet (keys typed once the program
// ended) is left to whoever reads f next, the user's shell say. A read
// blocked in read(2) could not be called off, and would take them.
type Input struct {
	fd      int
	wake    [2]int // written when stop is closed or Close is called
	closing chan struct{}
	once    sync.Once
	done    chan struct{}
}

// NewInput returns an Input of f, which must stay open until Close.
func NewInput(f *os.File, stop <-chan struct{}) (*Input, error) {
	in := &Input{fd: int(f.Fd()), closing: make(chan struct{}), done: make(chan struct{})}
	if err := unix.Pipe2(in.wake[:], unix.O_CLOEXEC); err != nil {
		return nil, err
	}
	go func() {
		defer close(in.done)
		select {
		case <-stop:
		case <-in.closing:
		}
		unix.Write(in.wake[1], []byte{0})
	}()
	return in, nil
}

// Read reads what f has, waiting for it until stop is closed.
func (in *Input) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		fds := []unix.PollFd{{Fd: int32(in.fd), Events: unix.POLLIN}, {Fd: int32(in.wake[0]), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return 0, err
		}
		if fds[1].Revents != 0 {
			return 0, io.EOF
		}
		if fds[0].Revents&unix.POLLNVAL != 0 {
			return 0, os.ErrClosed
		}
		if fds[0].Revents == 0 {
			continue
		}
		// Only what is there: another reader of the same terminal (a
		// program that opened /dev/tty) may have taken it meanwhile, and
		// a read that blocks could not be called off.
		if avail, err := unix.IoctlGetInt(in.fd, unix.TIOCINQ); err == nil {
			if avail == 0 && fds[0].Revents&(unix.POLLHUP|unix.POLLERR) == 0 && !stillReadable(in.fd) {
				// Taken meanwhile. (Still readable with nothing in
				// the queue is an end of input, Ctrl-D on a terminal,
				// which the read returns at once.)
				continue
			}
			if avail > 0 && avail < len(p) {
				p = p[:avail]
			}
		}
		n, err := unix.Read(in.fd, p)
		switch {
		case errors.Is(err, unix.EINTR), errors.Is(err, unix.EAGAIN):
			continue
		case err != nil:
			return 0, err
		case n == 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// stillReadable polls fd once more, without waiting.
func stillReadable(fd int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0 && fds[0].Revents&unix.POLLIN != 0
}

// Close ends reading; f itself stays open.
func (in *Input) Close() error {
	in.once.Do(func() {
		close(in.closing)
		<-in.done
		unix.Close(in.wake[0])
		unix.Close(in.wake[1])
	})
	return nil
}
