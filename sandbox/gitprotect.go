package sandbox

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/moby/api/types/mount"
)

// protectGit plans read-only mounts over the git metadata of the session
// directories (real, their sources with links resolved; binds, what is
// mounted) wherever a bind or a writable grant (grants, sources resolved)
// shows it, each directory between a bind and the metadata pinned by a
// mount onto itself. The checks it returns make the started container show
// the very files that were checked there.
func (s *Session) protectGit(real []string, binds []bind, grants []Mount, covered []string) ([]mount.Mount, []mountCheck, error) {
	sc := s.m.cfg.Session
	if !sc.ProtectGit {
		return nil, nil, nil
	}
	// A command that could write the metadata could set a hook,
	// core.fsmonitor or a filter that the person's own git runs on the
	// host, outside any sandbox, at the editor's next `git status`.
	// What shows the metadata writable: the session's binds, unless the
	// workspace is read-only (and the metadata in it with it), and the
	// writable grants that hold or lie in a session directory.
	var shows []bind
	if sc.guardsGit() {
		shows = binds
	}
	// The git directories the session directories' own .git name, beside
	// them or anywhere (a worktree's repository): each root's .git is
	// read-only in every session, so where it points was not chosen by a
	// command.
	chain := rootGitDirs(real)
	gitHomes := append(slices.Clip(real), chain...)
	var writable []Mount
	var also []string
	// A writable grant that shows the metadata too (one of the folder the
	// session's directory is in, say) gets the same at its own target:
	// else the metadata, read-only at the directory's path, would be
	// writable at the grant's.
	for _, mt := range grants {
		if mt.Mode == "ro" || !slices.ContainsFunc(gitHomes, func(r string) bool { return Within(mt.Source, r) || Within(r, mt.Source) }) {
			continue
		}
		shows = append(slices.Clip(shows), bind{source: mt.Source, target: mt.Target})
		writable = append(writable, mt)
		// One that holds a session directory, or a git directory one
		// names, shows the git directories the .git files name there
		// too.
		if slices.ContainsFunc(gitHomes, func(r string) bool { return r != mt.Source && Within(mt.Source, r) }) {
			also = append(also, mt.Source)
		}
	}
	if len(shows) == 0 {
		return nil, nil, nil
	}
	found, err := statGitMetadata(real, also, covered)
	if err != nil {
		return nil, nil, err
	}
	// A grant of the metadata itself, or of what is in it, would show it
	// where no read-only mount can be put over it.
	paths := gitPaths(found)
	for _, mt := range writable {
		if g := gitInGrant(real, paths, chain, mt.Source); g != "" {
			return nil, nil, fmt.Errorf("%w: %s: source %q is git metadata of the session's directories (%s), which protect_git keeps read-only: grant it read-only", ErrInvalid, mt.origin(), mt.Source, g)
		}
	}
	if links := gitLinks(real); len(links) > 0 {
		// A link cannot be mounted over without following it: commands
		// can replace it with a directory of their own, which the
		// person's git would then read.
		s.m.log.Warn("a .git in the session's directories is a link, which protect_git cannot keep: commands can replace it; look at it before you run git there on the host",
			"session", s.ID, "paths", links)
	}
	type readOnly struct {
		g      gitFile
		b      bind
		rel    string
		target string
	}
	var ros []readOnly
	for _, g := range found {
		for _, b := range shows {
			if g.path == b.source || !Within(b.source, g.path) {
				continue
			}
			// Below a filesystem this bind does not show: not there.
			if slices.ContainsFunc(covered, func(h string) bool { return h != b.source && Within(b.source, h) && Within(h, g.path) }) {
				continue
			}
			rel, _ := filepath.Rel(b.source, g.path)
			target := filepath.Join(b.target, rel)
			// A pointer naming a directory that holds a session
			// directory would make that read-only: left alone.
			// A grant mounted between the bind's target and the
			// metadata's shows its own there: nothing of the session's
			// to protect, and no place for a pin.
			overlaid := slices.ContainsFunc(grants, func(o Mount) bool {
				return o.Target != b.target && Within(b.target, o.Target) && Within(o.Target, target)
			}) || slices.ContainsFunc(binds, func(o bind) bool {
				return o.target != b.target && Within(b.target, o.target) && Within(o.target, target)
			})
			if slices.ContainsFunc(binds, func(o bind) bool { return Within(target, o.target) }) ||
				slices.ContainsFunc(ros, func(r readOnly) bool { return r.target == target }) || overlaid {
				continue
			}
			ros = append(ros, readOnly{g, b, rel, target})
		}
	}
	// Inside a read-only mount nothing can be renamed: what lies there
	// needs neither a mount of its own nor a pin.
	underRO := func(t string, strictly bool) bool {
		return slices.ContainsFunc(ros, func(r readOnly) bool { return Within(r.target, t) && (!strictly || r.target != t) })
	}
	var mounts []mount.Mount
	var checks []mountCheck
	planned := map[string]bool{}
	for _, b := range binds {
		planned[b.target] = true
	}
	plan := func(source, target, mode string, dev, ino uint64) {
		planned[target] = true
		mounts = append(mounts, bindMount(source, target, mode))
		checks = append(checks, mountCheck{target: target, dev: dev, ino: ino, known: s.m.writableByAnother(s, source), mountPoint: true})
	}
	for _, r := range ros {
		if underRO(r.target, true) {
			continue
		}
		// A mount point can be neither renamed nor removed from inside,
		// but the directory above one can: each directory between the bind
		// and the metadata is pinned, so that nothing can move the
		// metadata aside and put other in its place.
		parts := strings.Split(r.rel, "/")
		for k := 1; k < len(parts); k++ {
			sub := filepath.Join(parts[:k]...)
			target := filepath.Join(r.b.target, sub)
			if planned[target] || underRO(target, false) {
				continue
			}
			st, err := statUnlinked(filepath.Join(r.b.source, sub))
			if err != nil {
				return nil, nil, fmt.Errorf("%w: workspace: %q changed while it was checked: %v", ErrInvalid, filepath.Join(r.b.source, sub), err)
			}
			plan(filepath.Join(r.b.source, sub), target, "rw", uint64(st.Dev), st.Ino)
		}
		plan(r.g.path, r.target, "ro", r.g.dev, r.g.ino)
	}
	s.gitSeen, s.gitGuarded, s.gitAlso = found, true, also
	return mounts, checks, nil
}

// gitFile is a piece of git metadata as protectGit found it.
type gitFile struct {
	path     string
	dev, ino uint64
}

// statGitMetadata finds the git metadata of the session directories and
// reads the device and inode of each, not following a link. mountPoints
// are the host's mount points below them, which it does not look into.
func statGitMetadata(real, also, mountPoints []string) ([]gitFile, error) {
	paths, err := gitMetadataOf(real, also, mountPoints)
	if err != nil {
		return nil, err
	}
	var found []gitFile
	for _, p := range paths {
		st, err := statEntryUnlinked(p)
		if err != nil {
			return nil, fmt.Errorf("%w: workspace: %q changed while it was checked: %v", ErrInvalid, p, err)
		}
		found = append(found, gitFile{p, uint64(st.Dev), st.Ino})
	}
	return found, nil
}

// gitPaths returns the paths of found.
func gitPaths(found []gitFile) []string {
	paths := make([]string, len(found))
	for i, g := range found {
		paths[i] = g.path
	}
	return paths
}

// gitInGrant returns the git metadata of the session directories (real)
// that a grant of source shows with no place for a read-only mount over
// it: metadata that is source or holds it. Only metadata no command placed
// counts: what lies in a session directory (of found), and the git
// directories their own .git name (chain); a pointer a command left in a
// .git below could name any directory of a grant.
func gitInGrant(real, found, chain []string, source string) string {
	for _, g := range found {
		if Within(g, source) && slices.ContainsFunc(real, func(r string) bool { return Within(r, g) }) {
			return g
		}
	}
	for _, g := range chain {
		if Within(g, source) {
			return g
		}
	}
	return ""
}

// gitUnchanged reports whether the git metadata of the session's
// directories is still what protectGit found when the container started: a
// repository made since (`git init`, a clone) has no read-only mount in
// it, so a spare container is no longer fit for a new session.
func (s *Session) gitUnchanged() bool {
	if !s.gitGuarded {
		return true
	}
	now, err := statGitMetadata(s.mountSources, s.gitAlso, hostMountPoints())
	return err == nil && slices.Equal(now, s.gitSeen)
}

// gitMade returns the git metadata in the session's directories that
// protectGit did not find when the container started (`git init`, a
// clone): nothing kept commands from writing it.
func (s *Session) gitMade() []string {
	select {
	case <-s.ready:
	default:
		return nil // never started: nothing ran
	}
	s.mu.Lock()
	sources := s.mountSources
	s.mu.Unlock()
	if !s.gitGuarded || s.err != nil || sources == nil {
		return nil
	}
	now, err := statGitMetadata(sources, s.gitAlso, hostMountPoints())
	if err != nil {
		return nil
	}
	var made []string
	for _, g := range now {
		if !slices.Contains(s.gitSeen, g) {
			made = append(made, g.path)
		}
	}
	return made
}
