package idlespin

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// HelperCommand is the first argument that makes the executable the
// helper process: its main calls RunHelper with the arguments after it.
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
	// began to spin: what tests watch.
	spinning atomic.Int32
	rounds   atomic.Uint64
}

// Spinner keeps CPUs awake while messages pass. A nil *Spinner does
// nothing.
type Spinner struct {
	shared *page
	helper *exec.Cmd
	once   sync.Once
}

// New starts a helper process of n threads that spin for window after
// each Touch, or returns why not: no Spinner and no error when n or window
// is 0, an error wrapping ErrCPUQuota under a CPU quota.
func New(n int, window time.Duration) (*Spinner, error) {
	if n <= 0 || window <= 0 {
		return nil, nil
	}
	if quota, err := cpuQuota(os.DirFS("/")); err != nil {
		return nil, fmt.Errorf("busy polling: %w", err)
	} else if quota != "" {
		return nil, fmt.Errorf("busy polling: off under the %w of cgroup %s, which spinning would use up", ErrCPUQuota, quota)
	}
	fd, err := unix.MemfdCreate("sandboxd-idlespin", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("busy polling: %w", err)
	}
	memfd := os.NewFile(uintptr(fd), "idlespin")
	defer memfd.Close() // the mapping keeps it
	mem, err := mapPage(memfd)
	if err != nil {
		return nil, fmt.Errorf("busy polling: %w", err)
	}
	// Never unmapped: a Touch racing Close must not write to memory gone.
	s := &Spinner{shared: (*page)(unsafe.Pointer(&mem[0]))}
	cmd := exec.Command("/proc/self/exe", HelperCommand, strconv.Itoa(n), window.String(), strconv.Itoa(os.Getpid()))
	cmd.Args[0] = "sandboxd"
	cmd.Dir = "/"
	cmd.Env = []string{}
	cmd.ExtraFiles = []*os.File{memfd}
	// Its own process group, out of the reach of the terminal's signals:
	// it ends with Close, or when its parent is gone.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("busy polling: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("busy polling: start helper: %w", err)
	}
	s.helper = cmd
	// The helper says "ready" once its threads run at SCHED_IDLE, or why
	// they cannot.
	said := make(chan string, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if line = strings.TrimSpace(line); line == "" {
			line = fmt.Sprint("helper ended: ", err)
		}
		said <- line
	}()
	var line string
	select {
	case line = <-said:
	case <-time.After(helperTimeout):
		line = "helper did not start within " + helperTimeout.String()
	}
	if line != "ready" {
		s.Close()
		return nil, fmt.Errorf("busy polling: %s", line)
	}
	return s, nil
}

func mapPage(f *os.File) ([]byte, error) {
	size := os.Getpagesize()
	if err := f.Truncate(int64(size)); err != nil {
		return nil, err
	}
	return unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}

// Touch notes a message: the helper's threads spin until window after
// the last one.
func (s *Spinner) Touch() {
	if s == nil {
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
		s.helper.Process.Kill()
		s.helper.Wait()
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
