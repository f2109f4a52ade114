package acp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"syscall"
	"time"
)

// drainTimeout is how long the proxy keeps relaying after the agent exited:
// what it wrote last is still in the pipe, or its children hold the pipe
// open.
const drainTimeout = time.Second

// lastLinesTimeout is how long the relay may still take, once the agent and
// its group are gone, to hand its last lines to an editor slow to read them.
const lastLinesTimeout = 10 * time.Second

// Wrap starts the agent and relays between it and the editor through a
// Proxy until one side ends. Sessions get their image, network and limits
// from the terminal service's defaults. It returns the agent's exit code
// (128+n for a signal) when the agent ended, and 0 when the editor did;
// the agent has exited either way. The caller then closes the manager,
// which removes every container of the wrap.
func Wrap(ctx context.Context, terms *Terminals, editor io.ReadWriteCloser, agent Agent, log *slog.Logger) (int, error) {
	if len(agent.Argv) == 0 {
		return 0, errors.New("start agent: no agent command given")
	}
	// Pipes of our own rather than cmd.StdoutPipe: Wait closes those as
	// soon as the agent exits, losing what it wrote last. They are
	// blocking, not pollable: a reader blocked in read(2) is woken by the
	// kernel itself, without the poller's hand-off to another thread.
	toAgent, agentIn, err := blockingPipe()
	if err != nil {
		return 0, fmt.Errorf("start agent %q: %w", agent.Argv[0], err)
	}
	agentOut, fromAgent, err := blockingPipe()
	if err != nil {
		toAgent.Close()
		agentIn.Close()
		return 0, fmt.Errorf("start agent %q: %w", agent.Argv[0], err)
	}
	cmd := exec.Command(agent.Argv[0], agent.Argv[1:]...)
	cmd.Dir = agent.Dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = toAgent, fromAgent, agent.Stderr
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
		return 0, fmt.Errorf("start agent %q: %w", agent.Argv[0], err)
	}
	pid := cmd.Process.Pid
	reaped := func() {}
	if agent.Started != nil {
		reaped = agent.Started(pid)
	}
	log = log.With("agent", agent.Argv[0], "agent_pid", pid)
	log.Info("agent started")
	// Told of the agent's exit without reaping it: its zombie keeps its
	// pid, which is its process group's id, from being taken by another
	// process until stopAgent is done with the group.
	exited := make(chan struct{})
	go func() {
		waitUnreaped(pid)
		close(exited)
	}()

	// Editors start the agent in the project they then open a session for:
	// have a container for it running before it is asked for.
	terms.scope.KeepSpare()
	p := NewProxy(terms, editor, pipe{agentOut, agentIn}, log)
	pctx, stopProxy := context.WithCancel(ctx)
	defer stopProxy()
	ended := make(chan error, 1)
	go func() { ended <- p.Run(pctx) }()
	var hangup <-chan struct{}
	if h, ok := editor.(interface{ Hangup() <-chan struct{} }); ok {
		hangup = h.Hangup()
	}
	var why error
	relayed := false // Run has returned
	agentExited, drain := exited, (<-chan time.Time)(nil)
	// groupStopped is closed once what the agent left in its group has
	// been stopped, after the agent exited and the relay did not end.
	var groupStopped chan struct{}
	var groupDone <-chan struct{}
	editorGone := false
	for why == nil {
		select {
		case why = <-ended:
			relayed = true
			if why == nil {
				why = ErrEditorClosed
			}
		case <-agentExited:
			// What it wrote last may still be in the pipe.
			agentExited, drain = nil, time.After(drainTimeout)
		case <-hangup:
			// The relay reads what the editor left and ends; unless it
			// cannot, for it waits to write to an agent that reads
			// nothing, when the editor is gone all the same.
			hangup, editorGone = nil, true
			if drain == nil {
				drain = time.After(drainTimeout)
			}
		case <-drain:
			if agentExited == nil && !editorGone && groupStopped == nil {
				// The agent exited, the editor is there, and the relay
				// goes on: children of the agent hold the pipe, or the
				// editor is slow to read its last lines. Once the group
				// is stopped the pipe ends when what is in it has been
				// relayed, which a slow editor then still gets.
				groupStopped = make(chan struct{})
				go func() {
					stopAgent(pid, exited, agent.Grace)
					close(groupStopped)
				}()
				drain, groupDone = nil, groupStopped
				continue
			}
			why = ErrEditorClosed
			if agentExited == nil {
				why = ErrAgentClosed
			}
		case <-groupDone:
			groupDone = nil
			if !editorGone {
				drain = time.After(lastLinesTimeout)
			}
		}
	}
	if groupStopped != nil {
		<-groupStopped
	}
	if errors.Is(why, ErrEditorClosed) && agentExited == nil {
		// The agent had exited when the editor closed: its code is what
		// the wrap ends with, whichever end the relay saw first.
		why = ErrAgentClosed
	}
	agentIn.Close()
	if errors.Is(why, ErrAgentClosed) && !waitExit(exited, agent.Grace) {
		// It closed its stdout; it may still be exiting.
		log.Warn("agent closed its output but did not exit; stopping it")
	} else if !errors.Is(why, ErrAgentClosed) {
		// The editor is gone, or sandboxd was told to stop: so is the
		// agent.
		log.Info("stopping the agent", "why", why)
	}
	// Also when the agent exited by itself: what it started in its
	// group (a launcher's real agent, its tool servers) must not stay
	// on the host, unsandboxed, once sandboxd is gone.
	stopAgent(pid, exited, agent.Grace)
	// Before the reap: until then the zombie holds the pid and its group.
	reaped()
	cmd.Wait()
	stopProxy()
	if !relayed {
		// Run ends within stopTimeout of its cancellation; should it not,
		// the containers must still go and sandboxd exit.
		select {
		case <-ended:
		case <-time.After(2 * stopTimeout):
			log.Warn("the relay did not end; leaving it")
		}
	}
	agentOut.Close()
	if !errors.Is(why, ErrAgentClosed) {
		return 0, nil
	}
	code := exitCode(cmd.ProcessState)
	log.Info("agent exited", "code", code)
	return code, nil
}
