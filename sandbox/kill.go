package sandbox

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/moby/moby/api/types/container"

	"github.com/sandboxd/sandboxd/internal/engine"
)

// Kill stops the command and every process it started: SIGTERM (SIGHUP for
// a TTY, a terminal being closed, which interactive shells obey and SIGTERM
// they ignore), then after the grace period SIGKILL. It returns once the
// command has exited. Killing a command that has exited does nothing.
func (t *Terminal) Kill(ctx context.Context) error {
	t.mu.Lock()
	if k := t.kill; k != nil {
		// Under way: the command may have exited, what it left that
		// ignores SIGTERM not yet.
		t.mu.Unlock()
		select {
		case <-k.done:
			return k.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if t.Exited() {
		t.mu.Unlock()
		return nil
	}
	k := &killing{done: make(chan struct{})}
	t.kill = k
	t.mu.Unlock()
	err := t.killOnce(ctx)
	k.err = err
	if err != nil {
		// The next kill tries again rather than take this one's word.
		t.mu.Lock()
		t.kill = nil
		t.mu.Unlock()
	}
	close(k.done)
	return err
}

// killing is a kill in progress, which concurrent kills wait for.
type killing struct {
	done chan struct{}
	err  error // set before done is closed
}

func (t *Terminal) killOnce(ctx context.Context) error {
	// The kill must finish even if the caller gives up: a half-killed
	// command is worse than a slow reply. An engine that hangs must not
	// hold the caller (and every kill waiting on this one) for ever.
	grace := time.Duration(t.session.m.cfg.Terminal.KillGrace)
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace+time.Minute)
	defer cancel()
	if grace > 0 {
		stop := syscall.SIGTERM
		if t.cmd.TTY {
			stop = syscall.SIGHUP
		}
		if err := t.signalAll(kctx, stop, false); err != nil {
			return fmt.Errorf("kill terminal %s: %w", t.ID, err)
		}
		select {
		case <-t.done:
		case <-time.After(grace):
		}
	}
	// Always finish with SIGKILL: children forked while SIGTERM was on its
	// way, or that ignore it, would otherwise outlive the command.
	if err := t.signalAll(kctx, syscall.SIGKILL, grace > 0); err != nil {
		return fmt.Errorf("kill terminal %s: %w", t.ID, err)
	}
	select {
	case <-t.done:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("kill terminal %s: still running after SIGKILL", t.ID)
	}
	return nil
}

// signalAll signals every process of the command. Those the kill found
// before are found again by pid and start time, so that one which removed
// the marker and whose parent then died of the first signal still gets the
// second.
// The start and groups the pass before printed (killScript) are passed on
// only when fresh, from this kill's own first pass: an older kill's would
// widen what the SIGKILL takes to all it started since.
func (t *Terminal) signalAll(ctx context.Context, sig syscall.Signal, fresh bool) error {
	t.markSent(sig)
	t.mu.Lock()
	if !fresh {
		// Also dropped where they are kept: a pass that fails leaves
		// none behind for the next.
		t.signalled = pairsOnly(t.signalled)
	}
	known := t.signalled
	t.mu.Unlock()
	found, err := t.session.signalMarked(ctx, sig, []string{t.ID}, known)
	if err == nil && found != "" {
		t.mu.Lock()
		t.signalled = found
		t.mu.Unlock()
	}
	if err != nil && (t.Exited() || t.session.isClosed()) {
		// Gone already, or going with its container.
		return nil
	}
	return err
}

// pairsOnly drops from a kill's known processes the start and groups of
// the pass that printed them.
func pairsOnly(known string) string {
	var b strings.Builder
	for f := range strings.FieldsSeq(known) {
		if f[0] != '@' && f[0] != '%' {
			b.WriteString(f + " ")
		}
	}
	return b.String()
}

// How kill.sh finds a terminal's processes. A process is one of theirs
// when its environment carries one of the markers given as grep -e
// arguments, when it is one of the pairs given (known, from an earlier kill
// of the same terminals), or when it descends from one of those: a process
// that removed the marker from its environment is still its parent's
// child, or, once orphaned while the command runs, the child of the
// command's own reaper (reaperPath), which carries the marker; or, adopted
// by the container's init with no marker in an environment it can read, it
// started after the kill's first signal and is in one of the process
// groups that signal reached (the "@start" and "%group" the SIGTERM pass
// prints ahead of its pairs; start times in clock ticks since boot, as
// /proc/PID/stat has them): forked by one that removed its marker as the
// command, and its reaper with it, ended on that signal. Another command's
// process that lost its reaper meanwhile is of another group (the reaper
// gives each command its own), and is left alone; with no reaper every
// command's group is 0, which scopes nothing, and the rule is off. Markers
// are plain regular expressions (letters, digits, '_' and '='): busybox
// grep -F stops at the first NUL of environ, its regex matcher does not. A
// reaper is not sent SIGTERM or SIGHUP: it passes them on to its child,
// which would get them twice, and some programs take a second one as "stop
// now".
//
// The first look runs grep, which costs a fork, and a fork that fails
// ends the shell at once. In a container at its pids limit the exec itself
// still gets in (the engine moves it into the cgroup, which no limit
// refuses), but it could fork nothing: so when the cgroup has no pids to
// spare (or the image has no grep) the look is made by the shell alone,
// reading every environ with its own read. That forks nothing, but is
// slow (two hundred processes with a few KiB of environment each take
// half a second, grep a tenth of that), so it is not the rule. Should the
// pids go between the check and the fork, the script ends with an error
// and the caller tries again with pids lent.
//
// For SIGKILL the whole tree is stopped first and killed only once a look
// finds no member that the one before had not stopped: a process killed
// before its children would hand them to the container's init, out of the
// tree, and a running one could fork past the look. The later looks find
// the stopped processes again by pid and start time with the shell's own
// read, so that a fork bomb that takes the pids the first look freed
// cannot leave its tree stopped for ever. Zombies drop out of the look, but
// a zombie holds its pid until its parent (a reaper, or the container's
// init) takes it: the kill waits for that, three seconds at most (and not
// for one left to a pid 1 that reaps nothing, with session.init off), so
// that the next command finds free the pids the killed ones held (after a
// fork bomb, all of them); it sleeps between looks only when the cgroup
// has pids to spare, and looks again at once otherwise. A stat line is
// read whole: a command name may hold a newline.

// killScript is kill.sh, run as `sh -c killScript sh SIG KNOWN -e MARKER...`:
// it signals every process of some terminals and prints them, as
// pid:start-time pairs, for a later kill to find again.
//
//go:embed kill.sh
var killScript string

// killHeadroom is how many pids a kill borrows: the shell, a subshell, grep
// and cut, with room to spare.
const killHeadroom = 16

// maxKnown bounds the pairs a kill passes on to the next, to keep them one
// argument the kernel takes (MaxArgLen); a tree larger than that is found
// again by its markers and their descendants only.
const maxKnown = 64 << 10

// signalMarked sends sig to every process of the given terminals, found by
// their marker environment variable, known (what an earlier signalMarked
// of the same terminals returned) and descent, and returns what it
// signalled, for the next. It runs as an exec, so it works with a remote
// engine too.
func (s *Session) signalMarked(ctx context.Context, sig syscall.Signal, terminals []string, known string) (string, error) {
	if len(known) > maxKnown {
		known = known[:strings.LastIndexByte(known[:maxKnown], ' ')+1]
	}
	argv := []string{"/bin/sh", "-c", killScript, "sh", strings.TrimPrefix(SignalName(sig), "SIG"), known}
	for _, id := range terminals {
		// The marker with its NUL terminator would be exact, but grep
		// cannot take NUL; ids have a fixed length, so no id is a prefix
		// of another.
		argv = append(argv, "-e", MarkerEnv+"="+id)
	}
	out, err := s.execOutput(ctx, argv)
	if err == nil {
		return string(out), nil
	}
	// A command that used up the pids limit (a fork bomb) leaves no pid
	// for the kill itself: lend the container a few pids for the kill,
	// then take them back.
	s.m.log.Debug("kill exec failed; retrying with pids headroom", "session", s.ID, "err", err)
	restore, uerr := s.lendPids(ctx, killHeadroom)
	if uerr != nil {
		return "", errors.Join(err, uerr)
	}
	defer restore()
	out, err = s.execOutput(ctx, argv)
	return string(out), err
}

// lendPids raises the container's pids limit by n until restore is called
// by every caller that borrowed.
func (s *Session) lendPids(ctx context.Context, n int64) (restore func(), err error) {
	// Zero fields of an update mean "unchanged", so only pids is touched.
	orig, pids := s.spec.Limits.Pids, s.spec.Limits.Pids+n
	base := container.Resources{PidsLimit: &orig}
	lent := container.Resources{PidsLimit: &pids}
	cli := s.m.cli
	s.lendMu.Lock()
	defer s.lendMu.Unlock()
	if s.lenders == 0 {
		if _, err := cli.ContainerUpdate(ctx, s.contID, engine.ContainerUpdateOptions{Resources: &lent}); err != nil {
			return nil, fmt.Errorf("raise pids limit of session %s: %w", s.ID, err)
		}
	}
	s.lenders++
	return func() {
		s.lendMu.Lock()
		defer s.lendMu.Unlock()
		if s.lenders--; s.lenders > 0 {
			return
		}
		// Given back even when the kill's caller gave up, but not waited
		// for for ever: the next kill waits for this lock.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, err := cli.ContainerUpdate(ctx, s.contID, engine.ContainerUpdateOptions{Resources: &base}); err != nil {
			s.m.log.Warn("restore pids limit", "session", s.ID, "err", err)
		}
	}, nil
}

// sweepDelay batches the sweeps of released terminals, so that an agent
// running many short commands does not pay an exec for each.
const sweepDelay = time.Second

// sweepLater kills, a little later and together with others, whatever the
// released terminal's command left running in the background.
func (s *Session) sweepLater(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.sweep = append(s.sweep, id)
	if s.sweepTimer == nil {
		s.sweepTimer = time.AfterFunc(sweepDelay, s.runSweep)
	}
}

func (s *Session) runSweep() {
	s.mu.Lock()
	ids := s.sweep
	s.sweep, s.sweepTimer = nil, nil
	closed := s.closed
	s.mu.Unlock()
	if closed || len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(s.m.ctx, time.Minute)
	defer cancel()
	if _, err := s.signalMarked(ctx, syscall.SIGKILL, ids, ""); err != nil && ctx.Err() == nil {
		s.m.log.Debug("sweep after release", "session", s.ID, "err", err)
	}
}
