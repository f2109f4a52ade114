package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/engine"
)

// discard removes the container of s, which no session map holds any
// more (a start that failed half way, a spare not kept), and tries again
// later when the engine refuses: nothing else would remove it before exit.
func (m *Manager) discard(s *Session) {
	if err := s.removeContainer(); err != nil {
		m.log.Warn("remove container", "session", s.ID, "err", err)
		m.removeLater(s)
	}
}

// removeMade removes, in the background, the container named name that
// the engine may have made for a create whose answer was an error (it
// timed out, the connection broke): nobody has its id, and it would stay
// until sandboxd exits. The engine may still be making it: not found is
// tried again a few times.
func (m *Manager) removeMade(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return // the exit removes every container of the instance
	}
	m.wg.Go(func() {
		for _, wait := range []time.Duration{0, 2 * time.Second, 10 * time.Second} {
			select {
			case <-time.After(wait):
			case <-m.ctx.Done():
				return
			}
			err := engine.RemoveContainer(m.ctx, m.cli, name)
			switch {
			case err == nil:
				m.log.Info("removed the container of a failed create", "container", name)
				return
			case !engine.IsNotFound(err):
				m.log.Warn("remove the container of a failed create", "container", name, "err", err)
			}
		}
	})
}

// removeLater tries again, in the background, to remove the container of s
// whose removal failed (an engine under load may not stop a container in
// time), rather than leave it until the next start; the exit removes what
// is left when sandboxd stops first. Until it is gone, s counts among the
// detached: its container still counts against the limit, and what its
// commands can write still counts in the checks of other sessions.
func (m *Manager) removeLater(s *Session) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.detached[s] = struct{}{}
	if m.retrying == nil {
		m.retrying = make(map[*Session]bool)
	}
	m.retrying[s] = true
	m.wg.Go(func() {
		// Then every minute, for as long as the container is there: it
		// keeps its place among the sessions until it is gone.
		for try := 0; ; try++ {
			wait := time.Minute
			if backoff := []time.Duration{2 * time.Second, 10 * time.Second, 30 * time.Second}; try < len(backoff) {
				wait = backoff[try]
			}
			select {
			case <-time.After(wait):
			case <-m.ctx.Done():
				return
			}
			err := s.removeContainer()
			if err == nil {
				m.log.Info("container removed on a later try", "session", s.ID)
				m.mu.Lock()
				delete(m.detached, s)
				delete(m.retrying, s)
				m.mu.Unlock()
				return
			}
			m.log.Warn("remove container", "session", s.ID, "err", err)
		}
	})
}

// removeLeftovers removes what containers of this instance are still
// there once every session is closed: one whose removal failed (the
// engine was busy), or one a start made after its session was given up
// on. The next start would remove them, but there may be none.
func (m *Manager) removeLeftovers(ctx context.Context) error {
	// Each removal has deadlines of its own.
	ctx = context.WithoutCancel(ctx)
	lctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	list, err := m.cli.ContainerList(lctx, engine.ContainerListOptions{
		All:     true,
		Filters: make(engine.Filters).Add("label", LabelInstance+"="+m.instance.ID),
	})
	if err != nil {
		return fmt.Errorf("remove leftover containers: %w", engine.Error(err))
	}
	var errs []error
	for _, c := range list.Items {
		m.log.Warn("removing a container left behind", "container", c.ID[:12], "session", c.Labels[LabelSession])
		// A conflict is a removal under way already.
		if err := engine.RemoveContainer(ctx, m.cli, c.ID); err != nil && !engine.IsNotFound(err) && !engine.IsConflict(err) {
			errs = append(errs, fmt.Errorf("remove leftover container %.12s: %w", c.ID, err))
		}
	}
	return errors.Join(errs...)
}

// listTimeout bounds a listing of containers, which the engine answers
// from its own record of them, also while it waits for a container.
const listTimeout = 30 * time.Second

// GCInBackground removes, as GC does, the containers of instances no
// longer running, beside whatever the manager does meanwhile: a container
// the engine is slow to remove holds up no session. Close stops it.
func (m *Manager) GCInBackground() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.wg.Go(func() {
		if _, err := GC(m.ctx, m.cli, m.log, GCOptions{Keep: m.instance.ID}); err != nil && m.ctx.Err() == nil {
			m.log.Warn("gc at start", "err", err)
		}
	})
}

// GCOptions selects what GC removes.
type GCOptions struct {
	// All removes every sandboxd container on the engine, live owner or not.
	All bool
	// Keep is an instance whose containers are never removed (the caller's).
	Keep string
}

// GC removes the containers whose owning instance is no longer running and
// returns their ids. When it could not remove some, the error is a
// *RemoveError. Every call it makes to the engine has a deadline.
func GC(ctx context.Context, cli engine.API, log *slog.Logger, opts GCOptions) ([]string, error) {
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("read hostname: %w", err)
	}
	here := localHost{name: host, boot: bootID(), machine: machineID(), pidNS: pidNamespace(), lockDir: LockDir()}
	if !opts.All {
		// Locks in a directory someone else may write would decide
		// whose containers go: none is trusted.
		d, err := openLockDir(here.lockDir)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		if d != nil {
			d.Close()
		}
	}
	lctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	list, err := cli.ContainerList(lctx, engine.ContainerListOptions{
		All:     true,
		Filters: make(engine.Filters).Add("label", LabelInstance),
	})
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", engine.Error(err))
	}
	var removed []string
	var errs []error
	for _, c := range list.Items {
		owner := c.Labels[LabelInstance]
		if owner == opts.Keep {
			continue
		}
		if !opts.All && here.instanceAlive(c.Labels) {
			continue
		}
		err := engine.RemoveContainer(ctx, cli, c.ID)
		if engine.IsConflict(err) {
			continue // a removal under way already
		}
		if err != nil && !engine.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove container %.12s: %w", c.ID, err))
			continue
		}
		log.Info("removed container left by a dead instance", "container", c.ID[:12], "instance", owner, "session", c.Labels[LabelSession])
		removed = append(removed, c.ID)
	}
	if len(errs) > 0 {
		return removed, &RemoveError{errors.Join(errs...)}
	}
	return removed, nil
}

// localHost is what gc compares a container's labels with: this host, its
// boot, and where its instances keep their locks.
type localHost struct {
	name, boot, machine, pidNS, lockDir string
}

// differs reports whether a label and what this host has for it are both
// known and not the same.
func differs(label, here string) bool { return label != "" && here != "" && label != here }

// instanceAlive reports whether the instance that labelled a container is
// still running. Containers of other hosts are treated as alive: their
// owner's lock cannot be seen from here.
func (h localHost) instanceAlive(labels map[string]string) bool {
	if labels[LabelHost] != h.name || differs(labels[LabelMachine], h.machine) {
		return true
	}
	id := labels[LabelInstance]
	if id == "" || id != filepath.Base(id) {
		return false
	}
	// No instance of an earlier boot still runs, whatever its lock file
	// (one that another user's umask made unreadable) or its pid says.
	if differs(labels[LabelBoot], h.boot) {
		return false
	}
	name := filepath.Join(h.lockDir, id+".lock")
	// Not following a link, nor waiting on a FIFO someone put there.
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		// Without its lock (removed, /tmp emptied, or a /tmp of its own),
		// only the pid is left, which means nothing from another pid
		// namespace (sandboxd in a container of the host's name).
		if differs(labels[LabelPidNS], h.pidNS) {
			return true
		}
		pid, _ := strconv.Atoi(labels[LabelPid])
		return pid > 0 && processExists(syscall.Kill(pid, 0))
	}
	if err != nil {
		// A lock we may not even open belongs to someone else; leave it.
		return true
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return true
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	os.Remove(name)
	return false
}

// processExists reads the result of kill(pid, 0): EPERM is a process that
// is there but another user's.
func processExists(err error) bool {
	return err == nil || errors.Is(err, syscall.EPERM)
}
