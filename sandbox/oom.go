package sandbox

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"
)

// oomKillsRose reads the container's OOM-kill counter and reports whether
// it rose since the last read: the command that asks died of SIGKILL that
// sandboxd did not send, and a rise says the OOM killer sent it. When
// several died together (the counter rose by more than one), the others
// learn it too if they ask soon after; a rise left over from a process
// killed in the background is not put down to a command much later. It
// costs an exec, so it is only asked when needed.
func (s *Session) oomKillsRose(ctx context.Context) bool {
	// The container's own user reads, where it is not the commands': a
	// command could stop a cat of its own user, or runc's init of its
	// exec, which would hold the engine on the container. The exit status
	// does not wait for it long all the same.
	ctx, cancel := context.WithTimeout(ctx, oomReadTimeout)
	defer cancel()
	user := s.user
	if s.m.keeper {
		user = keeperUser(s.user)
	}
	out, err := s.execOutputAs(ctx, user, []string{"cat", "/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"})
	// One of the two files is missing (cgroup v1 or v2): cat fails, and
	// what it read of the other counts. Any other failure (flooded, out
	// of time) leaves nothing to trust.
	var ee *execError
	if err != nil && (len(out) == 0 || !errors.As(err, &ee)) {
		s.m.log.Warn("read oom counter", "session", s.ID, "err", err)
		return false
	}
	n := parseOOMKills(out)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.countOOMKillsLocked(n, time.Now())
}

// oomReadTimeout bounds the read of the OOM-kill counter; past it, the
// kill is not put down to the OOM killer.
const oomReadTimeout = 10 * time.Second

// oomWindow is how long after a rise of the OOM-kill counter by several
// the other commands killed with it may claim it.
const oomWindow = 5 * time.Second

// countOOMKillsLocked is oomKillsRose's account, given the counter's value
// n read at now. s.mu must be held.
func (s *Session) countOOMKillsLocked(n int64, now time.Time) bool {
	if n > s.oomSeen {
		s.oomSpare, s.oomSpareAt = n-s.oomSeen-1, now
		s.oomSeen = n
		return true
	}
	if s.oomSpare > 0 && now.Sub(s.oomSpareAt) < oomWindow {
		s.oomSpare--
		return true
	}
	return false
}

// parseOOMKills finds the oom_kill counter in cgroup v1 memory.oom_control
// or cgroup v2 memory.events text.
func parseOOMKills(text []byte) int64 {
	for line := range strings.SplitSeq(string(text), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == "oom_kill" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}
