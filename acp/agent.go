package acp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Agent says how to start the agent a wrap contains.
type Agent struct {
	Argv   []string
	Dir    string
	Stderr io.Writer // the agent's stderr goes here
	// Grace is how long the agent has between SIGTERM and SIGKILL when the
	// editor goes away.
	Grace time.Duration
	// Started, if set, is given the agent's pid, which is its process
	// group's id too, once it runs: what sandboxd kills should it have to
	// stop at once, with no time for the orderly stop. What it returns is
	// called just before the agent is reaped, after which the pid may be
	// another process's.
	Started func(pid int) (reaped func())
}

// blockingPipe returns a pipe whose ends are blocking files.
func blockingPipe() (r, w *os.File, err error) {
	var fds [2]int
	if err := syscall.Pipe2(fds[:], syscall.O_CLOEXEC); err != nil {
		return nil, nil, fmt.Errorf("pipe: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "pipe"), os.NewFile(uintptr(fds[1]), "pipe"), nil
}

func waitExit(exited <-chan struct{}, d time.Duration) bool {
	select {
	case <-exited:
		return true
	case <-time.After(d):
		return false
	}
}

// stopAgent sends the agent's process group SIGTERM, waits for the agent
// to exit and for the rest of the group to go, and sends SIGKILL to what
// is left after grace. The agent must not be reaped before it returns
// (waitUnreaped). An agent that left its group is signalled by itself.
func stopAgent(pid int, exited <-chan struct{}, grace time.Duration) {
	deadline := time.Now().Add(grace)
	if syscall.Kill(-pid, syscall.SIGTERM) != nil {
		syscall.Kill(pid, syscall.SIGTERM)
	}
	if waitExit(exited, grace) && waitGroupGone(pid, deadline) {
		return
	}
	syscall.Kill(-pid, syscall.SIGKILL)
	syscall.Kill(pid, syscall.SIGKILL)
	<-exited
}

// waitUnreaped waits for child pid to exit and leaves it a zombie, for
// exec.Cmd.Wait to reap.
func waitUnreaped(pid int) {
	var info unix.Siginfo
	for {
		if err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil); !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// waitGroupGone polls until process group pgid has no live member but its
// leader, pgid itself, or deadline passes; it reports whether the group is
// gone. There is no event for the end of processes that are not one's
// children.
func waitGroupGone(pgid int, deadline time.Time) bool {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if !groupHasMembers(pgid) {
			return true
		}
		if !time.Now().Before(deadline) {
			return false
		}
		<-tick.C
	}
}

// groupHasMembers reports whether a live process other than pgid itself is
// in process group pgid, as /proc shows.
func groupHasMembers(pgid int) bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return true // cannot tell: what is left gets SIGKILL
	}
	want := strconv.Itoa(pgid)
	for _, e := range entries {
		if e.Name() == want || e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// The command name, in parentheses, may hold anything; the
		// state, parent and group follow the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) >= 3 && f[0] != "Z" && f[2] == want {
			return true
		}
	}
	return false
}

func exitCode(st *os.ProcessState) int {
	if st == nil {
		return 1
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return st.ExitCode()
}

// pipe joins the agent's stdout and stdin into one connection.
type pipe struct {
	io.ReadCloser
	w io.WriteCloser
}

func (p pipe) Write(b []byte) (int, error) { return p.w.Write(b) }

func (p pipe) Close() error {
	p.w.Close()
	return p.ReadCloser.Close()
}
