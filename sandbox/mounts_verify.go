package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// mountCheck is a mount source as checked on the host, for verifyMounts.
type mountCheck struct {
	target   string
	dev, ino uint64
	// known says a session of this sandboxd can write above the source.
	known bool
	// mountPoint says the target must be a mount point in the container:
	// a mount that the engine, following a link planted in a directory
	// above, put somewhere else leaves the target showing the directory
	// as checked, and only the mount table tells.
	mountPoint bool
	// unseen says the session's user may not enter a directory on the
	// way to the target (one a command set to mode 000, say): stat
	// cannot look there, and only the mount table is checked.
	unseen bool
}

// verifyMounts makes sure each target in the running container is the
// directory that was checked: a sandboxed command able to write above a
// source can swap it for a link between the check and the engine's mount,
// which follows links; the device and inode seen from inside tell.
func (s *Session) verifyMounts(ctx context.Context, checks []mountCheck, covers []string) error {
	cmd := []string{"stat", "-c", "%d:%i", "--"}
	var unseen []string // in the mount table only
	checks = slices.DeleteFunc(slices.Clone(checks), func(c mountCheck) bool {
		if c.unseen {
			unseen = append(unseen, c.target)
		}
		return c.unseen
	})
	for _, c := range checks {
		cmd = append(cmd, c.target)
	}
	// Its own bound: a stat stuck on a hung filesystem must not hold the
	// start for the whole of its time.
	ctx, cancel := context.WithTimeout(ctx, verifyTimeout)
	defer cancel()
	// The mount table is read meanwhile: two execs one after the other
	// would add one's time to every cold start.
	want := append(slices.Clone(covers), unseen...)
	for _, c := range checks {
		if c.mountPoint {
			want = append(want, c.target)
		}
	}
	type output struct {
		b   []byte
		err error
	}
	table := make(chan output, 1)
	if len(want) > 0 {
		go func() {
			b, err := s.execOutput(ctx, []string{"cat", "/proc/self/mountinfo"})
			table <- output{b, err}
		}()
	}
	out, err := s.execOutput(ctx, cmd)
	var ee *execError
	if err != nil && !(errors.As(err, &ee) && ee.missing()) {
		// stat ran and could not look at one of them (a target the
		// session user may not reach), or the engine failed: nothing
		// was verified.
		return fmt.Errorf("verify mounts: %w", err)
	}
	if err != nil {
		// An image without stat cannot be asked; that is only let pass
		// when no session here can write above a source (one of another
		// sandboxd might: the log says so).
		for _, c := range checks {
			if c.known {
				return fmt.Errorf("verify mounts: %q lies in another session's writable workspace and the image %s cannot show what is mounted there (it needs stat): %w: %s", c.target, s.spec.Image, err, bytes.TrimSpace(out))
			}
		}
		s.m.log.Warn("mounts not verified: the image has no usable stat", "session", s.ID, "image", s.spec.Image, "err", err)
		return nil
	}
	lines := strings.Fields(string(out))
	if len(lines) != len(checks) {
		return fmt.Errorf("verify mounts: stat gave %q", out)
	}
	for i, c := range checks {
		if lines[i] != fmt.Sprintf("%d:%d", c.dev, c.ino) {
			s.m.log.Warn("a mount source was swapped between its check and its mount", "session", s.ID, "target", c.target)
			return fmt.Errorf("%w: workspace: %q changed between its check and its mount (%s, checked %d:%d; if every session is refused so, the engine runs in a VM or on another host, whose view of the files sandboxd cannot check: use a local engine)", ErrInvalid, c.target, lines[i], c.dev, c.ino)
		}
	}
	if len(want) == 0 {
		return nil
	}
	// Every mount must have landed on its target: the engine finds a
	// target inside a writable directory by following links, and a link
	// planted there at the right moment would put the mount elsewhere in
	// the container, while the target, still the directory checked,
	// shows the same device and inode.
	t := <-table
	if t.err != nil {
		return fmt.Errorf("verify mounts: read the container's mount table: %w", t.err)
	}
	points := mountPointsOf(t.b)
	for _, t := range want {
		if !slices.Contains(points, t) {
			s.m.log.Warn("a mount did not land on its target", "session", s.ID, "target", t)
			return fmt.Errorf("%w: workspace: nothing is mounted at %q in the container: a link put in its way sent the mount elsewhere", ErrInvalid, t)
		}
	}
	return nil
}

// verifyTimeout bounds the check of a new container's mounts.
const verifyTimeout = 30 * time.Second
