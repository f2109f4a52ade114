package acp

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/sandboxd/sandboxd/internal/audit"
	"github.com/sandboxd/sandboxd/sandbox"
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
	started := time.Now()
	proc, conn, err := agent.start(ctx)
	if err != nil {
		return 0, err
	}
	if h, ok := proc.(*hostProcess); ok {
		log = log.With("agent", agent.Argv[0], "agent_pid", h.pid)
	} else {
		log = log.With("agent", agent.Argv[0], "contained", true)
	}
	log.Info("agent started")
	agentEvent(agent, audit.AgentStart, started, nil)

	// Editors start the agent in the project they then open a session for:
	// have a container for it running before it is asked for.
	terms.scope.KeepSpare()
	p := NewProxy(terms, editor, conn, log)
	p.contained = agent.Session != nil
	pctx, stopProxy := context.WithCancel(ctx)
	defer stopProxy()
	ended := make(chan error, 1)
	go func() { ended <- p.Run(pctx) }()
	var hangup <-chan struct{}
	if h, ok := editor.(interface{ Hangup() <-chan struct{} }); ok {
		hangup = h.Hangup()
	}
	exited := proc.exited()
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
					proc.stop(agent.Grace)
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
	conn.w.Close()
	if errors.Is(why, ErrAgentClosed) && !waitExit(exited, agent.Grace) {
		// It closed its output; it may still be exiting.
		log.Warn("agent closed its output but did not exit; stopping it")
	} else if !errors.Is(why, ErrAgentClosed) {
		// The editor is gone, or sandboxd was told to stop: so is the
		// agent.
		log.Info("stopping the agent", "why", why)
	}
	// Also when the agent exited by itself: what it started must not stay
	// on once sandboxd is gone.
	proc.stop(agent.Grace)
	code := proc.wait()
	agentEvent(agent, audit.AgentEnd, started, &code)
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
	conn.ReadCloser.Close()
	if !errors.Is(why, ErrAgentClosed) {
		return 0, nil
	}
	log.Info("agent exited", "code", code)
	return code, nil
}

// agentEvent records the agent's start (code nil) or end in the audit log.
func agentEvent(agent Agent, kind string, started time.Time, code *int) {
	ev := audit.Event{Event: kind, Argv: agent.Argv, Cwd: agent.Dir, ExitCode: code}
	if agent.Session != nil {
		ev.Session = agent.Session.ID
	}
	if code != nil {
		ev.Duration(time.Since(started))
	}
	agent.Audit.Write(ev)
}

// SetAudit has every command started from now on recorded in l, at its
// start and its end.
func (t *Terminals) SetAudit(l *audit.Log) { t.audit = l }

// auditCommand records the start of a command the peer started in its
// session sid (s, in sandboxd), and its end once it has ended.
func (t *Terminals) auditCommand(sid string, s *sandbox.Session, term *sandbox.Terminal) {
	if t.audit == nil {
		return
	}
	started := time.Now()
	cmd := term.Command()
	cwd := cmd.Cwd
	if cwd == "" {
		cwd = s.Dir()
	}
	ev := audit.Event{Event: audit.CommandStart, Session: sid, Terminal: term.ID, Argv: cmd.Argv(), Cwd: cwd, Time: started}
	t.audit.Write(ev)
	t.auditing.Go(func() {
		<-term.Done()
		st, _ := term.Wait(context.Background())
		total := term.Buffer().Total()
		ev.Event, ev.Time, ev.ExitCode, ev.Signal, ev.OutputBytes = audit.CommandEnd, time.Time{}, st.ExitCode, st.Signal, &total
		ev.Duration(time.Since(started))
		t.audit.Write(ev)
	})
}

// WaitAudit waits, up to d, for the ends of the commands started so far to
// be recorded: once their sessions are closed, each has ended.
func (t *Terminals) WaitAudit(d time.Duration) {
	done := make(chan struct{})
	go func() {
		t.auditing.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
	}
}
