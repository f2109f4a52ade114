package idlespin

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Spinner keeps CPUs awake while messages pass. A nil *Spinner does
// nothing.
type Spinner struct {
	window time.Duration
	epoch  time.Time
	// until is when spinning stops, in nanoseconds since epoch.
	until atomic.Int64
	// spinning counts the threads spinning now: a Touch while one
	// spins only moves until.
	spinning atomic.Int32
	closed   atomic.Bool
	wake     chan struct{}
	done     chan struct{}
	wg       sync.WaitGroup
	once     sync.Once
}

// New starts n threads that spin for window after each Touch. Each holds
// a Go P while it spins, so the caller raises GOMAXPROCS by n. It returns
// an error saying why not, and no Spinner, where the process's cgroup has
// a CPU quota, and neither when n or window is 0.
func New(n int, window time.Duration) (*Spinner, error) {
	if n <= 0 || window <= 0 {
		return nil, nil
	}
	if quota, err := cpuQuota(os.DirFS("/"), "/proc/self/cgroup"); err != nil {
		return nil, fmt.Errorf("busy polling: %w", err)
	} else if quota != "" {
		return nil, fmt.Errorf("busy polling: off under the CPU quota of cgroup %s, which spinning would use up", quota)
	}
	s := &Spinner{
		window: window,
		epoch:  time.Now(),
		wake:   make(chan struct{}, n),
		done:   make(chan struct{}),
	}
	for range n {
		s.wg.Add(1)
		go s.run()
	}
	return s, nil
}

// Touch notes a message: the threads spin until window after now.
func (s *Spinner) Touch() {
	if s == nil {
		return
	}
	s.until.Store(int64(time.Since(s.epoch) + s.window))
	if s.spinning.Load() < int32(cap(s.wake)) {
		for range cap(s.wake) {
			select {
			case s.wake <- struct{}{}:
			default:
			}
		}
	}
}

// Close stops the threads, spinning or not, and waits for them to end.
func (s *Spinner) Close() {
	if s == nil {
		return
	}
	s.once.Do(func() {
		s.closed.Store(true)
		close(s.done)
	})
	s.wg.Wait()
}

func (s *Spinner) due() bool {
	return !s.closed.Load() && int64(time.Since(s.epoch)) < s.until.Load()
}

func (s *Spinner) run() {
	defer s.wg.Done()
	// Never unlocked: the thread, whose class is changed below, ends
	// with this goroutine instead of running others.
	runtime.LockOSThread()
	// A signal to the process goes to a thread that does not block it,
	// the main thread first, which this may be: at SCHED_IDLE on a busy
	// machine it would wait long to run the handler (Ctrl-C, SIGTERM
	// from an editor). Only the runtime's own preemption signal and the
	// faults, which are this thread's, stay.
	var mask unix.Sigset_t
	for sig := unix.Signal(1); sig <= 64; sig++ {
		switch sig {
		case unix.SIGURG, unix.SIGPROF, unix.SIGSEGV, unix.SIGBUS, unix.SIGFPE, unix.SIGILL, unix.SIGTRAP, unix.SIGSYS:
			continue
		}
		mask.Val[(sig-1)/64] |= 1 << ((sig - 1) % 64)
	}
	if err := unix.PthreadSigmask(unix.SIG_BLOCK, &mask, nil); err != nil {
		<-s.done
		return
	}
	if err := unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}, 0); err != nil {
		// Spinning in the normal class would take CPU from real work
		// (a seccomp profile may refuse the call).
		<-s.done
		return
	}
	for {
		select {
		case <-s.wake:
		case <-s.done:
			return
		}
		for {
			s.spinning.Add(1)
			for s.due() {
			}
			s.spinning.Add(-1)
			// A Touch that came as this thread stopped may have seen
			// it still spinning, and not woken it.
			if !s.due() {
				break
			}
		}
	}
}

// cpuQuota returns the first cgroup, from the process's own up to the
// root, that has a CPU quota, or "" if none has. cgroupFile is the
// process's /proc/PID/cgroup, read from fsys with the cgroup filesystems
// mounted at sys/fs/cgroup (v2) and sys/fs/cgroup/cpu (v1).
func cpuQuota(fsys fs.FS, cgroupFile string) (string, error) {
	b, err := fs.ReadFile(fsys, strings.TrimPrefix(cgroupFile, "/"))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		// hierarchy-id:controllers:path
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var root, file string
		switch {
		case parts[0] == "0" && parts[1] == "":
			root, file = "sys/fs/cgroup", "cpu.max"
		case hasController(parts[1], "cpu"):
			root, file = "sys/fs/cgroup/cpu", "cpu.cfs_quota_us"
		default:
			continue
		}
		for dir := path.Clean("/" + parts[2]); ; dir = path.Dir(dir) {
			v, err := fs.ReadFile(fsys, path.Join(root, dir, file))
			// The root has no cpu.max, and a cgroup namespace may hide
			// the levels above its own.
			if err == nil && limited(strings.TrimSpace(string(v))) {
				return dir, nil
			}
			if dir == "/" {
				break
			}
		}
	}
	return "", nil
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// limited reads a cpu.max ("max 100000" or "50000 100000") or a
// cpu.cfs_quota_us ("-1" or "50000").
func limited(v string) bool {
	quota, _, _ := strings.Cut(v, " ")
	return quota != "" && quota != "max" && quota != "-1"
}
