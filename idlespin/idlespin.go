package idlespin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// HelperCommand is the first argument that makes the executable the
// helper process: its main must call RunHelper with the arguments after
// it, before anything else. New starts /proc/self/exe so, which in an
// executable that does not dispatch it would run that executable again.
const HelperCommand = "__idlespin_helper"

// ErrCPUQuota is returned by New where the process's cgroup, or one above
// it, has a CPU quota: the spinning would use it up.
var ErrCPUQuota = errors.New("CPU quota")

// page is the memory the relay and the helper share.
type page struct {
	// seq is bumped by each Touch; the helper's waiting threads wait on
	// it (a futex word).
	seq atomic.Uint32
	// sleepers counts the helper's threads waiting on seq: Touch wakes
	// them only when there are some.
	sleepers atomic.Int32
	// spinning counts the threads spinning now, rounds the times one
	// began to: nothing but tests reads them.
	spinning atomic.Int32
	rounds   atomic.Uint64
}

// seals keep the shared page one page long for the helper's life.
const seals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// Spinner keeps CPUs awake while messages pass. A nil *Spinner does
// nothing.
type Spinner struct {
	shared *page
	helper *exec.Cmd
	// gone is set once the helper has ended, exited closed when it has
	// been waited for.
	gone    atomic.Bool
	exited  chan struct{}
	closing atomic.Bool
	once    sync.Once
}

// New starts a helper process of n threads that spin for window after
// each Touch, or returns why not: no Spinner and no error when n or window
// is 0, an error wrapping ErrCPUQuota under a CPU quota. log is told if
// the helper ends before Close. It waits for the helper to start, for at
// most helperTimeout or until ctx is done.
func New(ctx context.Context, n int, window time.Duration, log *slog.Logger) (*Spinner, error) {
	if n <= 0 || window <= 0 {
		return nil, nil
	}
	if quota, err := cpuQuota(os.DirFS("/")); err != nil {
		return nil, fmt.Errorf("busy polling: %w", err)
	} else if quota != "" {
		return nil, fmt.Errorf("busy polling: off under the %w of cgroup %s, which spinning would use up", ErrCPUQuota, quota)
	}
	memfd, mem, err := sharedPage()
	if err != nil {
		return nil, fmt.Errorf("busy polling: %w", err)
	}
	defer memfd.Close() // the mapping keeps it
	// Never unmapped: a Touch racing Close must not write to memory gone.
	s := &Spinner{shared: (*page)(unsafe.Pointer(&mem[0])), exited: make(chan struct{})}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("busy polling: %w", err)
	}
	cmd := exec.Command("/proc/self/exe", HelperCommand, strconv.Itoa(n), window.String(), strconv.Itoa(os.Getpid()))
	cmd.Args[0] = "sandboxd"
	cmd.Dir = "/"
	cmd.Env = []string{}
	cmd.ExtraFiles = []*os.File{memfd}
	// Its word ("ready" or why not), then anything it says before it
	// dies (a panic), on one pipe.
	cmd.Stdout, cmd.Stderr = w, w
	// Its own process group, out of the reach of the terminal's signals:
	// it ends with Close, or when its parent is gone.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("busy polling: start helper: %w", err)
	}
	s.helper = cmd
	said := make(chan string, 1)
	go s.watch(r, said, log)
	var word string
	select {
	case word = <-said:
	case <-time.After(helperTimeout):
		word = "helper did not start within " + helperTimeout.String()
	case <-ctx.Done():
		word = "helper not started: " + ctx.Err().Error()
	}
	if word != "ready" {
		s.Close()
		return nil, fmt.Errorf("busy polling: %s", word)
	}
	return s, nil
}

// watch reads what the helper says: its first line goes to said; what it
// says later, its first 4 KiB, is logged if it ends before Close.
func (s *Spinner) watch(r io.ReadCloser, said chan<- string, log *slog.Logger) {
	defer close(s.exited)
	// Read for as long as the helper lives: closed, the pipe would kill
	// it with SIGPIPE when it has something to say.
	defer r.Close()
	var out []byte
	buf := make([]byte, 4096)
	told := false
	for {
		n, err := r.Read(buf)
		out = append(out, buf[:n]...)
		if !told {
			if i := bytes.IndexByte(out, '\n'); i >= 0 {
				said <- string(out[:i])
				out, told = out[i+1:], true
			}
		}
		if len(out) > 4096 {
			out = out[:4096] // a crash's report begins with what matters
		}
		if err != nil {
			break
		}
	}
	err := s.helper.Wait()
	s.gone.Store(true)
	if !told {
		said <- fmt.Sprintf("helper ended (%v): %s", err, bytes.TrimSpace(out))
		return
	}
	if !s.closing.Load() {
		log.Warn("busy polling stopped: its helper ended", "err", err, "said", string(bytes.TrimSpace(out)))
	}
}

// sharedPage makes the page the relay and the helper share: a sealed
// memfd of one page, and its mapping.
func sharedPage() (*os.File, []byte, error) {
	fd, err := unix.MemfdCreate("sandboxd-idlespin", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "idlespin")
	size := os.Getpagesize()
	if err := f.Truncate(int64(size)); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("size the shared page: %w", err)
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("seal the shared page: %w", err)
	}
	mem, err := mapPage(f)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, mem, nil
}

func mapPage(f *os.File) ([]byte, error) {
	mem, err := unix.Mmap(int(f.Fd()), 0, os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map the shared page: %w", err)
	}
	return mem, nil
}

// Touch notes a message: the helper's threads spin until window after
// the last one.
func (s *Spinner) Touch() {
	if s == nil || s.gone.Load() {
		return
	}
	s.shared.seq.Add(1)
	if s.shared.sleepers.Load() > 0 {
		futex(&s.shared.seq, futexWake, 1<<30, nil)
	}
}

// Close ends the helper process.
func (s *Spinner) Close() {
	if s == nil {
		return
	}
	s.once.Do(func() {
		s.closing.Store(true)
		s.helper.Process.Kill()
		<-s.exited
	})
}

// helperTimeout bounds the helper's start.
const helperTimeout = 10 * time.Second

const (
	futexWait = 0
	futexWake = 1
)

// futex is futex(2) on a word the relay and the helper share (no
// FUTEX_PRIVATE_FLAG).
func futex(word *atomic.Uint32, op int, val uint32, timeout *unix.Timespec) error {
	_, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), uintptr(op), uintptr(val), uintptr(unsafe.Pointer(timeout)), 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}
