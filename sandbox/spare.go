package sandbox

import (
	"errors"
	"path/filepath"

	"github.com/sandboxd/sandboxd/limits"
)

// dropStaleSpare drops the spare container when a repository was made in
// its workspace since it started: it has no read-only mount there, a new
// one will. The look at the workspace is made without m.mu, which a slow
// filesystem must not hold up.
func (m *Manager) dropStaleSpare() {
	m.mu.Lock()
	s := m.spare
	m.mu.Unlock()
	if s == nil || s.gitUnchanged() {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.spare != s || m.closed {
		return // taken or dropped meanwhile, or Close removes it
	}
	m.spare = nil
	m.log.Info("spare container dropped: the workspace's git metadata changed", "container", s.contID[:12])
	m.wg.Go(func() { m.discard(s) })
	m.refillSpare()
}

// spareFits reports whether a session asking for want can have the spare
// made with have: same workspace, nothing but the defaults otherwise.
func spareFits(have, want SessionSpec) bool {
	if _, err := checkDir(want); err != nil {
		return false // a fresh start reports it
	}
	return filepath.Clean(want.Workspace) == have.Workspace && len(want.ExtraDirs) == 0 &&
		(want.Image == "" || want.Image == have.Image) &&
		(want.Network == "" || want.Network == have.Network) &&
		want.Limits == limits.Limits{}
}

// KeepSpare keeps one container with spec (the configured defaults and a
// workspace) started ahead of need, for the next session that fits it.
func (m *Manager) KeepSpare(spec SessionSpec) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.spareSpec, m.spareHopeless = &spec, false
	m.refillSpare()
}

// spareRoomLocked reports whether a spare fits the memory budget beside the
// sessions. m.mu must be held.
func (m *Manager) spareRoomLocked() bool {
	if m.memoryBudget == 0 || m.spareSpec == nil {
		return true
	}
	committed, _ := m.committedLocked()
	return committed+m.memoryOf(*m.spareSpec) <= m.memoryBudget
}

// makeRoomLocked removes the spare when it no longer fits the memory
// budget beside the sessions: it is there for the sessions to come, which
// need its room more. m.mu must be held.
func (m *Manager) makeRoomLocked() {
	s := m.spare
	if s == nil || m.spareRoomLocked() {
		return
	}
	m.spare = nil
	m.log.Info("spare container removed to make room in the memory budget", "container", s.contID[:12])
	m.wg.Go(func() { m.discard(s) })
}

// refillSpare starts a new spare in the background, when it fits the
// memory budget. m.mu must be held.
func (m *Manager) refillSpare() {
	if m.spareSpec == nil || m.closed || m.spare != nil || m.spareStarting || m.spareHopeless || !m.spareRoomLocked() {
		return
	}
	m.spareStarting = true
	spec := *m.spareSpec
	spec.ID = "spare"
	s := newSession(m, "", spec)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		err := s.start(m.ctx)
		s.markReady(err)
		// Kept in the same hold of m.mu that ends spareStarting: a
		// session opened in between would start cold, and another spare
		// with it.
		m.mu.Lock()
		m.spareStarting = false
		m.spareHopeless = errors.Is(err, ErrInvalid)
		// The sessions opened meanwhile may have taken its room.
		keep := err == nil && !m.closed && m.spare == nil && m.spareRoomLocked()
		if keep {
			m.spare = s
		}
		m.mu.Unlock()
		if err != nil {
			switch {
			case m.ctx.Err() != nil:
			case errors.Is(err, ErrInvalid):
				// The served workspace is one no session may have (wrap
				// started in / or the home directory): the sessions the
				// editor names will say so if they name it.
				m.log.Debug("no spare container", "err", err)
			default:
				m.log.Warn("start spare container", "err", err)
			}
			return
		}
		if !keep {
			m.discard(s)
			return
		}
		m.log.Debug("spare container ready", "container", s.contID[:12])
	}()
}
