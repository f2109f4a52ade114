package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// checkMountSource refuses to bind-mount dir when it is, holds or lies in
// one of the host's kernel and runtime directories, or holds the engine's
// socket or one of sandboxd's own endpoints (private, Config.Private):
// `cd /run && sandboxd run ...` must not hand the engine to the command.
// Links are resolved first, as the mount will.
func checkMountSource(dir, engineSocket string, private []string) (real string, err error) {
	real, err = filepath.EvalSymlinks(dir)
	if err != nil {
		return "", fmt.Errorf("%w: workspace: %v", ErrInvalid, err)
	}
	if real == "/" {
		return "", fmt.Errorf("%w: workspace: %.200q is the host's root directory, which no sandbox may see; use a project directory", ErrInvalid, dir)
	}
	// Removable media are mounted under /run/media, and a project may
	// well live there.
	h := hostDirIn(real)
	for _, d := range hostDirs() {
		if Within(d, real) && !(Within("/run/media", real) && real != "/run/media") {
			h = d
			break
		}
	}
	if h != "" {
		return "", fmt.Errorf("%w: workspace: %.200q is, holds or lies in the host's %s, which no sandbox may see", ErrInvalid, dir, h)
	}
	if sock := engineSocketIn(real, engineSocket); sock != "" {
		return "", fmt.Errorf("%w: workspace: %.200q holds the Docker Engine's socket %s, which would give commands the engine", ErrInvalid, dir, sock)
	}
	if p := privateIn(real, private); p != "" {
		return "", fmt.Errorf("%w: workspace: %.200q holds %s, %s", ErrInvalid, dir, p, privateWhy)
	}
	return real, nil
}

// hostDirs are the host's kernel and runtime directories: /run holds the
// sockets of the engine, containerd and the system and user buses, each a
// way out.
func hostDirs() []string { return []string{"/proc", "/sys", "/dev", "/run"} }

// hostDirIn returns the first of hostDirs that real, a path with its links
// resolved, is or holds; "" when none.
func hostDirIn(real string) string {
	for _, h := range hostDirs() {
		if Within(real, h) {
			return h
		}
	}
	return ""
}

// engineSocketIn returns the engine's socket, links resolved, when real
// is or holds it; "" otherwise, or when the engine is not reached through
// a socket.
func engineSocketIn(real, engineSocket string) string {
	if engineSocket == "" {
		return ""
	}
	if sock, err := filepath.EvalSymlinks(engineSocket); err == nil && Within(real, sock) {
		return sock
	}
	return ""
}

// checkGrant refuses a granted mount source (real, its links resolved)
// that is or holds one of sandboxd's own endpoints (private), the host's
// kernel or runtime directories, or the engine's socket, or that is reached
// through a link not owned by root.
func checkGrant(origin, source, real, engineSocket string, private []string) error {
	// A sandboxed command that can write on the source's way (the source
	// lies in a workspace) can put a link there, and so choose what the
	// next session, also one of a later sandboxd, mounts. A command never
	// runs as root, so a link of root's is none of theirs.
	if link, uid, err := userLinkOn(source); err != nil {
		return fmt.Errorf("%w: %s: source %q: %v", ErrInvalid, origin, source, err)
	} else if link != "" {
		return fmt.Errorf("%w: %s: source %q passes the link %s of uid %d, which a sandboxed command running as that user could have put there to choose what is mounted; name the directory itself (%s)", ErrInvalid, origin, source, link, uid, real)
	}
	if p := privateIn(real, private); p != "" {
		return fmt.Errorf("%w: %s: source %q is or holds %s, %s", ErrInvalid, origin, source, p, privateWhy)
	}
	// A grant is the operator's choice, so one inside the host's
	// directories is let be (an SSH agent's socket in /run/user); one that
	// holds them whole is taken for a mistake, as is one that holds the
	// engine, which is the host's root: even read-only, a socket connects.
	if h := hostDirIn(real); h != "" {
		return fmt.Errorf("%w: %s: source %q is or holds the host's %s; grant what in it is needed", ErrInvalid, origin, source, h)
	}
	if sock := engineSocketIn(real, engineSocket); sock != "" {
		return fmt.Errorf("%w: %s: source %q is or holds the Docker Engine's socket %s, which would give commands the engine and so the host", ErrInvalid, origin, source, sock)
	}
	return nil
}

// userLinkOn returns the first symbolic link not owned by root that
// resolving path passes (resolvePath), and its owner; "" when there is
// none. A path that does not resolve has no link to report beyond the
// point where it stops.
func userLinkOn(path string) (link string, uid uint32, err error) {
	_, links, err := resolvePath(path)
	for _, l := range links {
		var st syscall.Stat_t
		if syscall.Lstat(l, &st) == nil && st.Uid != 0 {
			return l, st.Uid, nil
		}
	}
	if errors.Is(err, syscall.ELOOP) {
		return "", 0, err
	}
	return "", 0, nil
}

// privateWhy says why a mount source that holds one of Config.Private is
// refused.
const privateWhy = "a file of sandboxd's own (its socket, the AHP token file, its --config file, or its package cache), which would let commands drive or change sandboxd itself; put it outside the directories sandboxes see (the package cache moves with XDG_CACHE_HOME)"

// privateIn returns the first of private (Config.Private) that real, a
// path with its links resolved, is or holds, as the host resolves it;
// "" when none.
func privateIn(real string, private []string) string {
	for _, p := range private {
		for _, r := range resolvePrivate(p) {
			if Within(real, r) {
				return r
			}
		}
	}
	return ""
}

// resolvePrivate names endpoint p as a resolved mount source would show
// it: the deepest directory on its way that exists, links resolved, and
// the rest as named, since the socket, or the directory it goes in (a
// cache directory on a fresh machine), may not be made yet; and, when p
// exists and is a link, where the link leads, which is what a command
// would open.
func resolvePrivate(p string) []string {
	if abs, err := filepath.Abs(p); err == nil {
		p = abs
	}
	p = filepath.Clean(p)
	names := []string{p}
	for dir, rest := filepath.Dir(p), filepath.Base(p); ; {
		if r, err := filepath.EvalSymlinks(dir); err == nil {
			names[0] = filepath.Join(r, rest)
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir, rest = parent, filepath.Join(filepath.Base(dir), rest)
	}
	if r, err := filepath.EvalSymlinks(p); err == nil && r != names[0] {
		names = append(names, r)
	}
	return names
}

// grantedMounts resolves the links in the sources of the configured
// mounts, so that the engine mounts what was resolved, and reads their
// device and inode for verifyMounts: a source inside a directory that
// sandboxed commands may write could be swapped for a link meanwhile,
// which the engine would follow, like a session directory's.
func (s *Session) grantedMounts() ([]Mount, []mountCheck, error) {
	mounts := slices.Clone(s.m.cfg.Session.Mounts)
	checks := make([]mountCheck, 0, len(mounts))
	for i, mt := range mounts {
		origin := mt.origin()
		real, err := filepath.EvalSymlinks(mt.Source)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: source %q: %w", origin, mt.Source, err)
		}
		st, err := statEntryUnlinked(real)
		if err != nil || st.Mode&syscall.S_IFMT == syscall.S_IFLNK {
			return nil, nil, fmt.Errorf("%w: %s: source %q changed while it was checked", ErrInvalid, origin, mt.Source)
		}
		if err := checkGrant(origin, mt.Source, real, s.m.engineSocket(), s.m.cfg.Private); err != nil {
			return nil, nil, err
		}
		mounts[i].Source = real
		checks = append(checks, mountCheck{target: mt.Target, dev: uint64(st.Dev), ino: st.Ino, known: s.m.writableByAnother(s, real), mountPoint: true})
	}
	return mounts, checks, nil
}

// writableByAnother reports whether dir lies inside a directory another
// session (or the spare) mounts writable, whose commands could swap dir
// for a link.
func (m *Manager) writableByAnother(s *Session, dir string) bool {
	if m.cfg.Session.WorkspaceMode == "ro" {
		return false
	}
	m.mu.Lock()
	others := make([]*Session, 0, len(m.sessions)+len(m.detached)+1)
	for _, o := range m.sessions {
		others = append(others, o)
	}
	for o := range m.detached {
		others = append(others, o)
	}
	if m.spare != nil {
		others = append(others, m.spare)
	}
	m.mu.Unlock()
	for _, o := range others {
		if o == s {
			continue
		}
		o.mu.Lock()
		sources := o.mountSources
		o.mu.Unlock()
		for _, src := range sources {
			if src != dir && Within(src, dir) {
				return true
			}
		}
	}
	return false
}

// refusePlantedLinks refuses dir when a link on its way lies inside a
// directory another session mounts writable: that session's commands put
// it there, and it may lead anywhere the user can reach ($HOME), which
// the checks on the resolved directory would let pass.
func (m *Manager) refusePlantedLinks(s *Session, dir string) error {
	p := "/"
	for _, c := range strings.Split(strings.TrimPrefix(filepath.Clean(dir), "/"), "/") {
		if c == "" {
			continue
		}
		p = filepath.Join(p, c)
		fi, err := os.Lstat(p)
		if err != nil {
			return nil // the checks that follow report it
		}
		if fi.Mode()&os.ModeSymlink != 0 && m.writableByAnother(s, p) {
			return fmt.Errorf("%w: workspace: %q passes the link %s, which lies in another session's writable workspace", ErrInvalid, dir, p)
		}
	}
	return nil
}

// statUnlinked stats path, a path with its links resolved, opening one
// component after the other without following any: a link found now was
// put there since, and is refused.
func statUnlinked(path string) (syscall.Stat_t, error) {
	var st syscall.Stat_t
	fd, err := openUnlinked(path)
	if err != nil {
		return st, err
	}
	err = syscall.Fstat(fd, &st)
	syscall.Close(fd)
	return st, err
}

// openUnlinked opens directory path as statUnlinked walks it, for O_PATH
// use.
func openUnlinked(path string) (int, error) {
	fd, err := syscall.Open("/", unix.O_PATH|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	for _, c := range strings.Split(strings.TrimPrefix(path, "/"), "/") {
		if c == "" {
			continue
		}
		next, err := syscall.Openat(fd, c, unix.O_PATH|syscall.O_NOFOLLOW|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
		syscall.Close(fd)
		if err != nil {
			return -1, fmt.Errorf("%s: %w", c, err)
		}
		fd = next
	}
	return fd, nil
}

// statEntryUnlinked is statUnlinked for a path whose last component may
// be a file or a link: the link itself is what it stats.
func statEntryUnlinked(path string) (syscall.Stat_t, error) {
	var st syscall.Stat_t
	fd, err := openUnlinked(filepath.Dir(path))
	if err != nil {
		return st, err
	}
	defer syscall.Close(fd)
	e, err := syscall.Openat(fd, filepath.Base(path), unix.O_PATH|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return st, err
	}
	err = syscall.Fstat(e, &st)
	syscall.Close(e)
	return st, err
}
