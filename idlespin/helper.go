package idlespin

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// parentCheck is how often a waiting thread of the helper looks whether
// its parent is still there (should the kernel's death signal miss: it
// follows the thread that started the helper, not the process).
const parentCheck = 10 * time.Second

// maxThreads bounds the helper's threads.
const maxThreads = 64

// RunHelper is the helper process, started by New: args are the number of
// threads, the window and the parent's pid; the shared page is fd 3. It
// returns an exit code when it cannot start, else runs until killed.
func RunHelper(args []string) int {
	// Named for ps and top, which show it spinning: the process's own
	// name (its main thread's), whichever thread this runs on.
	os.WriteFile("/proc/self/comm", []byte("sandboxd-spin"), 0)
	// It allocates nothing once started: no collection need ever run.
	debug.SetGCPercent(-1)
	if err := runHelper(args); err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println("ready")
	select {} // the threads do the work until the parent ends this process
}

// runHelper starts the spinning threads.
func runHelper(args []string) error {
	if len(args) != 3 {
		return errors.New("helper: want threads, window and parent pid")
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n <= 0 || n > maxThreads {
		return fmt.Errorf("helper: bad thread count %q", args[0])
	}
	window, err := time.ParseDuration(args[1])
	if err != nil || window <= 0 {
		return fmt.Errorf("helper: bad window %q", args[1])
	}
	parent, err := strconv.Atoi(args[2])
	if err != nil || os.Getppid() != parent {
		// Started by another, or its parent is gone already.
		return fmt.Errorf("helper: parent %q is not this process's", args[2])
	}
	// Only the page New made: sealed, which a file given in its place is
	// not, and which this process then does not write to.
	f := os.NewFile(3, "idlespin")
	if got, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0); err != nil || got != seals {
		return fmt.Errorf("helper: fd 3 is not the shared page (seals %#x, %v)", got, err)
	}
	mem, err := mapPage(f)
	if err != nil {
		return fmt.Errorf("helper: %w", err)
	}
	shared := (*page)(unsafe.Pointer(&mem[0]))
	var cpus unix.CPUSet
	if err := unix.SchedGetaffinity(0, &cpus); err != nil {
		return fmt.Errorf("helper: sched_getaffinity: %w", err)
	}
	var allowed []int
	for cpu := range len(cpus) * 64 {
		if cpus.IsSet(cpu) {
			allowed = append(allowed, cpu)
		}
	}
	started := make(chan started, n)
	for i := range n {
		// With a thread for each CPU, each keeps its own: unpinned, two
		// could share one and leave the other to sleep.
		pin := -1
		if n == len(allowed) {
			pin = allowed[i]
		}
		go spin(shared, window, parent, pin, started)
	}
	for range n {
		st := <-started
		if st.err != nil {
			return st.err
		}
		// Set here, at this thread's priority: at SCHED_IDLE, a thread
		// on a busy CPU could take long to get to say it is ready. It
		// waits for a Touch, which comes only once New has returned.
		if err := unix.SchedSetAttr(st.tid, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}, 0); err != nil {
			// Spinning in the normal class would take CPU from real
			// work (a seccomp profile may refuse the call).
			return fmt.Errorf("helper: set SCHED_IDLE: %w", err)
		}
	}
	return nil
}

// started is what a spinning thread says when it is about to wait.
type started struct {
	tid int
	err error
}

// spin is one spinning thread: it waits for a Touch, then spins until no
// Touch came for window.
func spin(shared *page, window time.Duration, parent, pin int, said chan<- started) {
	// Never unlocked: the thread, whose class is changed, ends with the
	// process.
	runtime.LockOSThread()
	if pin >= 0 {
		var set unix.CPUSet
		set.Set(pin)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			said <- started{err: fmt.Errorf("helper: pin a thread to CPU %d: %w", pin, err)}
			return
		}
	}
	said <- started{tid: unix.Gettid()}
	timeout := unix.NsecToTimespec(int64(parentCheck))
	// The page starts zeroed: seq is 0 until the first Touch, which may
	// come before this thread gets here.
	var seen uint32
	for {
		if shared.seq.Load() == seen {
			shared.sleepers.Add(1)
			// Returns at once if a Touch came since the check.
			futex(&shared.seq, futexWait, seen, &timeout)
			shared.sleepers.Add(-1)
			if os.Getppid() != parent {
				os.Exit(0)
			}
			if shared.seq.Load() == seen {
				continue // timed out, or woken for nothing
			}
		}
		shared.spinning.Add(1)
		shared.rounds.Add(1)
		last, at := shared.seq.Load(), time.Now()
		for {
			if cur := shared.seq.Load(); cur != last {
				last, at = cur, time.Now()
			} else if time.Since(at) >= window {
				break
			}
		}
		seen = last
		shared.spinning.Add(-1)
	}
}
