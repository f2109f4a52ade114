package sandbox

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/moby/moby/api/types/mount"
	"golang.org/x/sys/unix"
)

// protectGit plans read-only mounts over the git metadata of the session
// directories (real, their sources with links resolved; binds, what is
// mounted), and over what their repositories' config makes host git read
// config from or run (configTargets; made empty first when missing),
// wherever a bind or a writable grant (grants, sources resolved) shows it,
// each directory between a bind and the metadata pinned by a mount onto
// itself. The checks it returns make the started container show the very
// files that were checked there. What it cannot protect it logs as
// untrusted; only a grant of the metadata itself is refused.
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
	// writable grants that hold or lie in a session directory, or hold
	// what the config names.
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
	var open []string // the sources of every writable grant
	// A writable grant that shows the metadata too (one of the folder the
	// session's directory is in, say) gets the same at its own target:
	// else the metadata, read-only at the directory's path, would be
	// writable at the grant's.
	for _, mt := range grants {
		if mt.Mode == "ro" {
			continue
		}
		open = append(open, mt.Source)
		if slices.ContainsFunc(gitHomes, func(r string) bool { return Within(mt.Source, r) || Within(r, mt.Source) }) {
			shows = append(slices.Clip(shows), bind{source: mt.Source, target: mt.Target})
			writable = append(writable, mt)
		}
	}
	if len(shows) == 0 && len(open) == 0 {
		return nil, nil, nil
	}
	found, err := statGitMetadata(real, open, covered)
	if err != nil {
		return nil, nil, err
	}
	if s.makeGitTargets(found.missing, shows, grants) {
		if found, err = statGitMetadata(real, open, covered); err != nil {
			return nil, nil, err
		}
	}
	// A writable grant that shows a path the config names gets it
	// read-only at its target too.
	for _, mt := range grants {
		if mt.Mode != "ro" && !slices.ContainsFunc(shows, func(b bind) bool { return b.source == mt.Source && b.target == mt.Target }) &&
			slices.ContainsFunc(found.conf, func(g gitFile) bool { return Within(mt.Source, g.path) }) {
			shows = append(slices.Clip(shows), bind{source: mt.Source, target: mt.Target})
		}
	}
	// A grant of the metadata itself, or of what is in it, would show it
	// where no read-only mount can be put over it.
	paths := gitPaths(found.meta)
	for _, mt := range writable {
		if g := gitInGrant(real, paths, chain, mt.Source); g != "" {
			return nil, nil, fmt.Errorf("%w: %s: source %q is git metadata of the session's directories (%s), which protect_git keeps read-only: grant it read-only", ErrInvalid, mt.origin(), mt.Source, g)
		}
	}
	if links := gitLinks(real); len(links) > 0 {
		// A link cannot be mounted over without following it: commands
		// can replace it with a directory of their own, which the
		// person's git would then read.
		s.m.log.Warn("a .git in the session's directories is a link, which protect_git cannot keep read-only: commands can point it elsewhere; treat that repository as untrusted: host git there may run what they wrote",
			"session", s.ID, "paths", links)
	}
	s.logGitNotes(found.notes)
	for _, b := range found.blocked {
		s.m.log.Warn("protect_git keeps read-only whole, mode and all, a directory whose mode hides what is below it from sandboxd; a command may have set it",
			"session", s.ID, "path", b.path, "looking_for", b.what)
	}
	type readOnly struct {
		g      gitFile
		b      bind
		rel    string
		target string
	}
	var ros []readOnly
	for _, g := range found.files() {
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
	plan := func(b bind, source, target, mode string, dev, ino uint64) {
		planned[target] = true
		mounts = append(mounts, bindMount(source, target, mode))
		checks = append(checks, mountCheck{target: target, dev: dev, ino: ino, known: s.m.writableByAnother(s, source), mountPoint: true,
			unseen: !mayEnter(s.user, b.source, filepath.Dir(source))})
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
			plan(r.b, filepath.Join(r.b.source, sub), target, "rw", uint64(st.Dev), st.Ino)
		}
		plan(r.b, r.g.path, r.target, "ro", r.g.dev, r.g.ino)
	}
	s.gitSeen, s.gitGuarded, s.gitAlso = found.files(), true, open
	return mounts, checks, nil
}

// makeGitTargets makes, empty, each of missing (paths the repositories'
// config names that are not there yet) that lies where a bind or a
// writable grant (of shows and grants) shows it writable: else a command
// could make it, and host git would read or run what it put there. It
// reports whether it made any.
func (s *Session) makeGitTargets(missing []gitTarget, shows []bind, grants []Mount) bool {
	roots := make([]string, 0, len(shows)+len(grants))
	for _, b := range shows {
		roots = append(roots, b.source)
	}
	for _, mt := range grants {
		if mt.Mode != "ro" {
			roots = append(roots, mt.Source)
		}
	}
	var made []string
	for _, t := range missing {
		root := slices.IndexFunc(roots, func(r string) bool { return Within(r, t.path) })
		if root < 0 {
			continue
		}
		if err := makeGitTarget(roots[root], t); err != nil {
			s.logGitNotes([]gitNote{{t.path, fmt.Sprintf("named by %s, it is not there and could not be made: %v", t.why, err)}})
			continue
		}
		made = append(made, t.path)
	}
	if len(made) > 0 {
		s.m.log.Info("protect_git made what the repositories' config names but was not there, empty, to keep it read-only", "session", s.ID, "paths", made)
	}
	return len(made) > 0
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
	return err == nil && slices.Equal(now.files(), s.gitSeen)
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
	for _, g := range now.files() {
		if !slices.Contains(s.gitSeen, g) {
			made = append(made, g.path)
		}
	}
	return made
}

// maxLoggedNotes bounds the lines logGitNotes writes for one session:
// a command can make a great many repositories that sandboxd cannot read.
const maxLoggedNotes = 16

// logGitNotes warns of what protect_git could not protect, one line each,
// at most maxLoggedNotes and a count of the rest.
func (s *Session) logGitNotes(notes []gitNote) {
	for i, n := range notes {
		if i == maxLoggedNotes {
			s.m.log.Warn("protect_git cannot keep read-only more git metadata than the lines above name; treat the session's repositories as untrusted", "session", s.ID, "more", len(notes)-i)
			return
		}
		s.m.log.Warn("protect_git cannot keep all of this git metadata read-only; treat it as untrusted: host git there may run what commands wrote",
			"session", s.ID, "path", n.path, "unprotected", n.what)
	}
}

// mayEnter reports whether user ("uid:gid") may enter each directory from
// root, which the container shows, down to dir, by their mode bits (not
// their ACLs): where it may not, a command of the session cannot look
// either. A user given by name counts as able to.
func mayEnter(user, root, dir string) bool {
	u, g, ok := strings.Cut(user, ":")
	uid, err1 := strconv.ParseUint(u, 10, 32)
	gid, err2 := strconv.ParseUint(g, 10, 32)
	if !ok || err1 != nil || err2 != nil || !Within(root, dir) {
		return true
	}
	rel, _ := filepath.Rel(root, dir)
	at := root
	for _, c := range strings.Split(rel, "/") {
		if c == "." {
			continue
		}
		at = filepath.Join(at, c)
		var st unix.Stat_t
		if unix.Lstat(at, &st) != nil {
			return true // the check from inside tells
		}
		bit := uint32(0o001)
		switch {
		case uint64(st.Uid) == uid:
			bit = 0o100
		case uint64(st.Gid) == gid:
			bit = 0o010
		}
		if st.Mode&bit == 0 {
			return false
		}
	}
	return true
}
