package acp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/audit"
	"github.com/sandboxd/sandboxd/sandbox"
)

// Agent says how to start the agent a wrap relays.
type Agent struct {
	Argv   []string
	Dir    string
	Stderr io.Writer // the agent's stderr goes here
	// Grace is how long the agent has between SIGTERM and SIGKILL when the
	// editor goes away.
	Grace time.Duration
	// Started, if set, is given the agent's pid, which is its process
	// group's id too, once it runs on the host: what sandboxd kills should
	// it have to stop at once, with no time for the orderly stop. What it
	// returns is called just before the agent is reaped, after which the
	// pid may be another process's.
	Started func(pid int) (reaped func())
	// Session, when set, is the container the agent runs in (wrap
	// --contain), with Env added to its environment and its stdin and
	// stdout a connection to Stdio; Argv[0] is then looked up on the
	// image's PATH. Without it the agent runs on the host.
	Session *sandbox.Session
	Env     []sandbox.EnvVar
	Stdio   net.Listener
	// Audit, when set, records the agent's start and end.
	Audit *audit.Log
}

// process is a started agent, on the host or in a container.
type process interface {
	// exited is closed once the agent has exited.
	exited() <-chan struct{}
	// stop ends the agent and what it started (SIGTERM, then SIGKILL
	// after grace), and returns once they are gone.
	stop(grace time.Duration)
	// wait, called once after stop, reaps the agent and returns its
	// exit code, 128+n for signal n.
	wait() int
}

// start starts the agent and returns it with its stdout to read and its
// stdin to write.
func (a Agent) start(ctx context.Context) (process, pipe, error) {
	if len(a.Argv) == 0 {
		return nil, pipe{}, errors.New("start agent: no agent command given")
	}
	if a.Session != nil {
		return a.startContained(ctx)
	}
	return a.startHost()
}

// hostProcess is an agent on the host, in a process group of its own.
type hostProcess struct {
	cmd    *exec.Cmd
	pid    int
	done   chan struct{}
	reaped func()
}

// startHost starts the agent on the host.
func (a Agent) startHost() (process, pipe, error) {
	// Pipes of our own rather than cmd.StdoutPipe: Wait closes those as
	// soon as the agent exits, losing what it wrote last. They are
	// blocking, not pollable: a reader blocked in read(2) is woken by the
	// kernel itself, without the poller's hand-off to another thread.
	toAgent, agentIn, err := blockingPipe()
	if err != nil {
		return nil, pipe{}, fmt.Errorf("start agent %q: %w", a.Argv[0], err)
	}
	agentOut, fromAgent, err := blockingPipe()
	if err != nil {
		toAgent.Close()
		agentIn.Close()
		return nil, pipe{}, fmt.Errorf("start agent %q: %w", a.Argv[0], err)
	}
	cmd := exec.Command(a.Argv[0], a.Argv[1:]...)
	cmd.Dir = a.Dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = toAgent, fromAgent, a.Stderr
	// Its own process group, so the signals reach whatever it started (a
	// launcher script's real agent) too. Should sandboxd die without
	// stopping it (SIGKILL, the OOM killer), it must not run on, unsandboxed:
	// the kernel kills it then. (Pdeathsig is of the thread that starts it,
	// and no thread of sandboxd's ends before sandboxd does.)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// Children that keep a stderr that is not a file open must not hold
	// Wait up.
	cmd.WaitDelay = drainTimeout
	err = cmd.Start()
	toAgent.Close()
	fromAgent.Close()
	if err != nil {
		agentIn.Close()
		agentOut.Close()
		return nil, pipe{}, fmt.Errorf("start agent %q: %w", a.Argv[0], err)
	}
	h := &hostProcess{cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{}), reaped: func() {}}
	if a.Started != nil {
		h.reaped = a.Started(h.pid)
	}
	// Told of the agent's exit without reaping it: its zombie keeps its
	// pid, which is its process group's id, from being taken by another
	// process until stop is done with the group.
	go func() {
		waitUnreaped(h.pid)
		close(h.done)
	}()
	return h, pipe{agentOut, agentIn}, nil
}

func (h *hostProcess) exited() <-chan struct{} { return h.done }

// stop also ends what the agent left in its group when it exited by
// itself: a launcher's real agent, its tool servers, must not stay on the
// host, unsandboxed, once sandboxd is gone.
func (h *hostProcess) stop(grace time.Duration) { stopAgent(h.pid, h.done, grace) }

func (h *hostProcess) wait() int {
	// Before the reap: until then the zombie holds the pid and its group.
	h.reaped()
	h.cmd.Wait()
	return exitCode(h.cmd.ProcessState)
}

// containedProcess is an agent in its container.
type containedProcess struct{ a *sandbox.Agent }

// startContained starts the agent in its container, its stdin and stdout
// a unix socket of sandboxd's.
func (a Agent) startContained(ctx context.Context) (process, pipe, error) {
	sa, conn, err := a.Session.StartAgent(ctx, a.Stdio, a.Argv, a.Env, a.Dir, a.Stderr)
	if err != nil {
		return nil, pipe{}, err
	}
	return &containedProcess{a: sa}, pipe{endOnReset{conn}, halfCloser{conn}}, nil
}

func (c *containedProcess) exited() <-chan struct{} { return c.a.Done() }

func (c *containedProcess) stop(grace time.Duration) { c.a.Stop(context.Background(), grace) }

func (c *containedProcess) wait() int {
	select {
	case <-c.a.Done():
		return c.a.ExitCode()
	default:
		return 255 // its end was never seen: the engine did not tell
	}
}

// endOnReset reads a socket whose reset is its end, as a pipe's would be:
// an agent stopped with input it had not read resets the connection.
type endOnReset struct{ f *os.File }

func (e endOnReset) Read(b []byte) (int, error) {
	n, err := e.f.Read(b)
	if errors.Is(err, syscall.ECONNRESET) {
		err = io.EOF
	}
	return n, err
}

func (e endOnReset) Close() error { return e.f.Close() }

// halfCloser writes to a socket, and its Close ends only what is sent:
// the agent sees the end of its input, and can still answer.
type halfCloser struct{ f *os.File }

func (h halfCloser) Write(b []byte) (int, error) { return h.f.Write(b) }

func (h halfCloser) Close() error { return syscall.Shutdown(int(h.f.Fd()), syscall.SHUT_WR) }

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
