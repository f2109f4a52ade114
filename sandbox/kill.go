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
		return k.wait(ctx)
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

// wait returns the kill's error once it is done, or ctx's.
func (k *killing) wait(ctx context.Context) error {
	select {
	case <-k.done:
		return k.err
	case <-ctx.Done():
		return ctx.Err()
	}
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
		if err := t.signalAll(kctx, stop); err != nil {
			return fmt.Errorf("kill terminal %s: %w", t.ID, err)
		}
		select {
		case <-t.done:
		case <-time.After(grace):
		}
	}
	// Always finish with SIGKILL: children forked while SIGTERM was on its
	// way, or that ignore it, would otherwise outlive the command.
	if err := t.signalAll(kctx, syscall.SIGKILL); err != nil {
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
// before are found again by pid and start time, and by the sessions they
// were in, so that one which removed the marker and whose parent then
// died of the first signal still gets the second. When the kill script
// fails (a command stopped it, or runc's init of its exec), the session's
// commands are ended from outside the container (reclaim).
func (t *Terminal) signalAll(ctx context.Context, sig syscall.Signal) error {
	t.markSent(sig)
	if t.cmd.merged() {
		// A kill right after the start: the shell in front of the
		// command says the command's session before the command runs,
		// which may drop its marker at once.
		select {
		case <-t.topSaid:
		case <-t.done:
		case <-time.After(topWait):
		}
	}
	t.mu.Lock()
	known := t.top + t.signalled
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
	if err != nil {
		return t.session.reclaim(ctx, fmt.Errorf("kill terminal %s: %w", t.ID, err), t)
	}
	return nil
}

// How kill.sh finds a terminal's processes. A process is one of theirs
// when its environment carries one of the markers given as grep -e
// arguments, when it is one of the pairs given (known, from an earlier kill
// of the same terminals), when it descends from one of those, or when it
// is in the session of one of those or in a session given. Each command's
// exec is a session of its own (the engine's runtime makes it one) that
// its first process leads, and what the command starts stays in it unless
// it makes a session of its own, which is then the command's too. So a
// process that removed the marker from its environment is still found: by
// its parent while it has one, and by its session once orphaned (the
// container's init adopts it), also when it is the command's first
// process (sandboxd passes the session that one leads, "%SID:start", as
// the shell in front of the command reports it: Command.execArgv). A
// session given is the terminals' while its leader is the one recorded
// (pid and start time, in clock ticks since boot as /proc/PID/stat has
// them) or is gone (no other process can take its id while one is in
// it); ":0" records one whose leader was gone already. Sessions 0 and 1
// (the container's init) are nobody's. Markers are plain regular
// expressions (letters, digits, '_' and '='): busybox grep -F stops at
// the first NUL of environ, its regex matcher does not. A reaper (the
// engine's init in front of a command of sandboxd run: reaperPath) is not
// sent SIGTERM or SIGHUP: it passes them on to its child, which would get
// them twice, and some programs take a second one as "stop now".
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
// it signals every process of some terminals and prints them, their
// sessions first ("%SID:start") and then pid:start-time pairs, for a later
// kill to find again.
//
//go:embed kill.sh
var killScript string

// killHeadroom is how many pids a kill borrows: the shell, a subshell, grep
// and cut, with room to spare.
const killHeadroom = 16

// maxKnown bounds the sessions and pairs a kill passes on to the next, to
// keep them one argument the kernel takes (MaxArgLen); a tree larger than
// that is found again by its markers, sessions and descent only.
const maxKnown = 64 << 10

// How long a pass of the kill script may take. It runs as the commands'
// user, so a command can stop it, or runc's init of its exec, which then
// holds the engine on the container (no exec, inspect or removal of it
// answers): past this the kill goes on from outside the container
// (reclaim). A SIGKILL pass stops a whole tree first (a fork bomb's takes
// a while) and waits up to 3 s for the reaping.
const (
	signalPassTimeout = 5 * time.Second
	killPassTimeout   = 10 * time.Second
)

// errHelperSilent is the cause of a pass of the kill script that took too
// long.
var errHelperSilent = errors.New("the kill script did not end in time (a command may have stopped it)")

// signalMarked sends sig to every process of the given terminals, found by
// their marker environment variable, known (what an earlier signalMarked
// of the same terminals returned, and the sessions their commands lead),
// descent and session, and returns what it signalled, for the next. It
// runs as an exec, so it works with a remote engine too.
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
	limit := signalPassTimeout
	if sig == syscall.SIGKILL {
		limit = killPassTimeout
	}
	pass := func() (string, error) {
		ctx, cancel := context.WithTimeoutCause(ctx, limit, errHelperSilent)
		defer cancel()
		out, err := s.execOutput(ctx, argv)
		if cause := context.Cause(ctx); err != nil && errors.Is(cause, errHelperSilent) {
			err = fmt.Errorf("session %s: %w", s.ID, cause)
		}
		return string(out), err
	}
	out, err := pass()
	if err == nil || errors.Is(err, errHelperSilent) {
		return out, err
	}
	// A command that used up the pids limit (a fork bomb) leaves no pid
	// for the kill itself: lend the container a few pids for the kill,
	// then take them back.
	s.m.log.Debug("kill exec failed; retrying with pids headroom", "session", s.ID, "err", err)
	lctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	restore, uerr := s.lendPids(lctx, killHeadroom)
	if uerr != nil {
		return "", errors.Join(err, uerr)
	}
	defer restore()
	return pass()
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
		if err := s.reclaim(ctx, fmt.Errorf("sweep after release: %w", err)); err != nil {
			s.m.log.Warn("sweep after release", "session", s.ID, "err", err)
		}
	}
}

// reclaim ends every command of the session from outside its container,
// for when the kill script could not (why): a command stopped or flooded
// it, or stopped runc's init of its exec, which holds the engine on the
// container. From this host, where sandboxd sees the container's
// processes and may signal them (as root, or as the commands' user), it
// SIGKILLs every one that is not the container's own (the keeper's), which
// frees the engine too, and the session goes on. Elsewhere (a remote
// engine, another user's commands), or where the container's own
// processes run as the commands' user, it closes the session: the engine
// kills and removes the container, and the session's next command opens
// it again, in a new one. The terminals it ends, the session's and those
// given (released ones), report SIGKILL. Concurrent calls share one.
func (s *Session) reclaim(ctx context.Context, why error, also ...*Terminal) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil // its container goes, with every process in it
	}
	if r := s.reclaiming; r != nil {
		s.mu.Unlock()
		return r.wait(ctx)
	}
	r := &killing{done: make(chan struct{})}
	s.reclaiming = r
	terms := also
	for _, t := range s.terminals {
		terms = append(terms, t)
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.reclaiming = nil
		s.mu.Unlock()
		close(r.done)
	}()
	for _, t := range terms {
		if !t.Exited() {
			t.markSent(syscall.SIGKILL)
		}
	}
	if own := keeperUser(s.user); s.m.keeper && own != s.user {
		n, err := engine.KillOnHost(s.contID, keeper)
		if err == nil {
			s.m.log.Warn("ended every command of the session from this host, as its own kill could not", "session", s.ID, "processes", n, "why", why)
			return nil
		}
		why = fmt.Errorf("%w; from this host: %w", why, err)
	}
	s.m.log.Warn("closing the session, whose commands its own kill could not end: the engine kills and removes its container, and its next command opens it again, in a new container", "session", s.ID, "why", why)
	r.err = s.Close(ctx)
	return r.err
}

// topWait is how long a kill waits for the shell in front of a command
// to say the command's session (mergeStderr): it says it as the exec
// starts, some 50 ms after the create.
const topWait = 2 * time.Second

// startWatch is how long an exec's create and attach may take before
// sandboxd asks whether the engine is held on the session's container
// (unwedge): they take milliseconds when it is not.
const startWatch = 10 * time.Second

// pingTimeout bounds the ping by which unwedge tells an engine held on
// one container from one that is slow or gone.
const pingTimeout = 5 * time.Second

// unwedge ends the session's commands from outside its container
// (reclaim) when the engine answers a ping while a call about the
// container (what) has waited startWatch: an exec whose start a command
// stopped (runc's init of it) holds the engine on the container, and
// every exec, inspect or removal of it waits.
func (s *Session) unwedge(what string) {
	ctx, cancel := context.WithTimeout(s.m.ctx, pingTimeout)
	defer cancel()
	if _, err := s.m.cli.Ping(ctx, engine.PingOptions{}); err != nil {
		return
	}
	why := fmt.Errorf("%s: the engine answers, but not about the session's container within %v (a command may have stopped runc's init of an exec)", what, startWatch)
	if err := s.reclaim(context.WithoutCancel(s.m.ctx), why); err != nil {
		s.m.log.Warn("free the engine held on the session's container", "session", s.ID, "err", err)
	}
}
