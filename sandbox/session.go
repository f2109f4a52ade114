package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/mountinfo"
	"github.com/sandboxd/sandboxd/limits"
)

// SessionSpec says what container a session gets. Zero fields take the
// configuration's defaults.
type SessionSpec struct {
	// ID is the client's session id; it labels the container.
	ID string
	// Workspace is the absolute host directory bind-mounted at the same
	// path; commands may only run at or below it (or ExtraDirs).
	Workspace string
	// ExtraDirs are further host directories mounted like the workspace.
	ExtraDirs []string
	// Dir is where commands that name no directory run: at or below
	// Workspace or ExtraDirs; empty means Workspace. Only mounted paths
	// are the host's to resolve, so a directory a peer names goes here:
	// as a mount source a symlink in it would reach anywhere on the host.
	Dir   string
	Image string
	// Limits overrides the configured limits; zero fields keep them.
	Limits  limits.Limits
	Network string
}

// Session is one agent session's container. Its terminals run as docker
// execs in it; closing it removes the container and everything in it.
type Session struct {
	ID  string
	key string
	m   *Manager

	spec SessionSpec // defaults filled in
	user string      // uid:gid
	// mountSources are the workspace and extra directories, links
	// resolved, once the session has checked them (guarded by mu).
	mountSources []string
	// gitSeen is the git metadata protectGit found, for a spare to be
	// adopted only while it is still what is there; gitGuarded says it
	// looked, gitAlso are the writable grants it looked in besides the
	// session's directories.
	gitSeen    []gitFile
	gitGuarded bool
	gitAlso    []string
	ready      chan struct{}
	err        error // set before ready is closed
	contID     string

	mu        sync.Mutex
	terminals map[string]*Terminal
	closed    bool
	ran       bool // a command was started
	lastUsed  time.Time
	oomSeen   int64
	// oomSpare counts the kills of the last rise beyond the one put down
	// to the command that found it, for commands killed with it, which
	// ask within oomWindow of oomSpareAt.
	oomSpare   int64
	oomSpareAt time.Time
	// sweep lists released terminals whose leftovers are to be killed.
	sweep      []string
	sweepTimer *time.Timer

	closeOnce sync.Once
	closeErr  error

	// lendMu orders the pids limit's changes; lenders counts the kills
	// that borrow pids now: the limit goes back when the last is done,
	// not under another kill's feet.
	lendMu  sync.Mutex
	lenders int
}

func newSession(m *Manager, key string, spec SessionSpec) *Session {
	return &Session{
		ID:        spec.ID,
		key:       key,
		m:         m,
		spec:      spec,
		ready:     make(chan struct{}),
		terminals: make(map[string]*Terminal),
		lastUsed:  time.Now(),
	}
}

func (s *Session) markReady(err error) {
	s.err = err
	close(s.ready)
}

// waitReady waits until the session's start is over and returns its
// error. A started session is found ready also under a ctx that is done,
// which a caller that must not wait passes.
func (s *Session) waitReady(ctx context.Context) error {
	select {
	case <-s.ready:
		return s.err
	default:
	}
	select {
	case <-s.ready:
		return s.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ContainerID returns the id of the session's container.
func (s *Session) ContainerID() string { return s.contID }

// Workspace returns the session's workspace directory.
func (s *Session) Workspace() string { return s.spec.Workspace }

// Dir returns where commands that name no directory run.
func (s *Session) Dir() string {
	if s.spec.Dir != "" {
		return s.spec.Dir
	}
	return s.spec.Workspace
}

// User returns the uid:gid commands run as.
func (s *Session) User() string { return s.user }

// Limits returns the resource limits the container runs with.
func (s *Session) Limits() limits.Limits { return s.spec.Limits }

// Manager returns the manager that owns the session.
func (s *Session) Manager() *Manager { return s.m }

// ValidateSpec fills in defaults from the configuration and checks a spec,
// returning an ErrInvalid error that names the bad field.
func ValidateSpec(cfg Config, hostCPUs int, spec SessionSpec) (SessionSpec, error) {
	c := cfg.Session
	if spec.Workspace == "" {
		return spec, fmt.Errorf("%w: cwd: a workspace directory is required", ErrInvalid)
	}
	if err := CheckString("cwd", spec.Workspace); err != nil {
		return spec, err
	}
	if !filepath.IsAbs(spec.Workspace) {
		return spec, fmt.Errorf("%w: cwd: %.200q is not an absolute path", ErrInvalid, spec.Workspace)
	}
	spec.Workspace = filepath.Clean(spec.Workspace)
	// Cleaned in a copy: the caller's spec shares the slice, and may be
	// read while the session starts.
	spec.ExtraDirs = slices.Clone(spec.ExtraDirs)
	for i, d := range spec.ExtraDirs {
		if err := CheckString("additionalDirectories", d); err != nil {
			return spec, err
		}
		if !filepath.IsAbs(d) {
			return spec, fmt.Errorf("%w: additionalDirectories: %.200q is not an absolute path", ErrInvalid, d)
		}
		spec.ExtraDirs[i] = filepath.Clean(d)
	}
	dir, err := checkDir(spec)
	if err != nil {
		return spec, err
	}
	spec.Dir = dir
	if spec.Image == "" {
		spec.Image = c.Image
	} else if spec.Image != c.Image {
		if err := CheckString("image", spec.Image); err != nil {
			return spec, err
		}
	}
	if spec.Network == "" {
		spec.Network = c.Network
	} else if spec.Network != c.Network && spec.Network != "none" {
		// Only the configured network or none: a client may tighten
		// isolation, never loosen it.
		allowed := `"none"`
		if c.Network != "none" {
			allowed = fmt.Sprintf(`%q or "none"`, c.Network)
		}
		return spec, fmt.Errorf("%w: network: %.200q is not allowed; use %s (the configuration's session.network allows one, in a --config file)", ErrInvalid, spec.Network, allowed)
	}
	l := c.Limits()
	if spec.Limits.CPUs != 0 {
		l.CPUs = spec.Limits.CPUs
	}
	if spec.Limits.Memory != 0 {
		l.Memory = spec.Limits.Memory
	}
	if spec.Limits.Pids != 0 {
		l.Pids = spec.Limits.Pids
	}
	if err := l.Validate(hostCPUs); err != nil {
		return spec, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := l.Within(c.MaxLimits()); err != nil {
		return spec, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	spec.Limits = l
	return spec, nil
}

// checkDir checks a spec's Dir against its mounts and returns it cleaned.
func checkDir(spec SessionSpec) (string, error) {
	if spec.Dir == "" {
		return "", nil
	}
	if err := CheckString("cwd", spec.Dir); err != nil {
		return "", err
	}
	if !filepath.IsAbs(spec.Dir) {
		return "", fmt.Errorf("%w: cwd: %.200q is not an absolute path", ErrInvalid, spec.Dir)
	}
	dir := filepath.Clean(spec.Dir)
	for _, root := range append([]string{spec.Workspace}, spec.ExtraDirs...) {
		if Within(filepath.Clean(root), dir) {
			return dir, CheckIsDir(dir)
		}
	}
	return "", fmt.Errorf("%w: cwd: %.200q is outside the session's workspace %s", ErrInvalid, spec.Dir, spec.Workspace)
}

// CheckIsDir refuses a cwd in a session directory that is no directory: the
// container shows those directories at their host paths, and the engine
// would otherwise fail the command with runc's "chdir to cwd ... failed"
// (and a session opened with it, every command that names no cwd).
func CheckIsDir(dir string) error {
	fi, err := os.Stat(dir)
	switch {
	case err != nil:
		return fmt.Errorf("%w: cwd: %v", ErrInvalid, err)
	case !fi.IsDir():
		return fmt.Errorf("%w: cwd: %.200q is not a directory", ErrInvalid, dir)
	}
	return nil
}

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
// kernel or runtime directories, or the engine's socket. A grant is the
// operator's choice, so one inside those directories is let be (an SSH
// agent's socket in /run/user); one that holds them whole is taken for a
// mistake, as is one that holds the engine, which is the host's root:
// even read-only, a socket connects.
//
// A source reached through a link that is not root's is refused too: a
// sandboxed command that can write on the source's way (the source lies in
// a workspace) can put one there, and so choose what the next session,
// also one of a later sandboxd, mounts. A command never runs as root, so
// a link of root's is none of theirs.
func checkGrant(origin, source, real, engineSocket string, private []string) error {
	if link, uid, err := userLinkOn(source); err != nil {
		return fmt.Errorf("%w: %s: source %q: %v", ErrInvalid, origin, source, err)
	} else if link != "" {
		return fmt.Errorf("%w: %s: source %q passes the link %s of uid %d, which a sandboxed command running as that user could have put there to choose what is mounted; name the directory itself (%s)", ErrInvalid, origin, source, link, uid, real)
	}
	if p := privateIn(real, private); p != "" {
		return fmt.Errorf("%w: %s: source %q is or holds %s, %s", ErrInvalid, origin, source, p, privateWhy)
	}
	if h := hostDirIn(real); h != "" {
		return fmt.Errorf("%w: %s: source %q is or holds the host's %s; grant what in it is needed", ErrInvalid, origin, source, h)
	}
	if sock := engineSocketIn(real, engineSocket); sock != "" {
		return fmt.Errorf("%w: %s: source %q is or holds the Docker Engine's socket %s, which would give commands the engine and so the host", ErrInvalid, origin, source, sock)
	}
	return nil
}

// userLinkOn returns the first symbolic link not owned by root that
// resolving path passes, and its owner; "" when there is none. It resolves
// as the kernel does, component by component, so that a link inside a
// link's target is looked at too. A path that does not resolve has no
// link to report beyond the point where it stops.
func userLinkOn(path string) (link string, uid uint32, err error) {
	cur := "/"
	todo := strings.Split(path, "/")
	for n := 0; len(todo) > 0; {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, c)
		var st syscall.Stat_t
		if syscall.Lstat(next, &st) != nil {
			return "", 0, nil
		}
		if st.Mode&syscall.S_IFMT != syscall.S_IFLNK {
			cur = next
			continue
		}
		if st.Uid != 0 {
			return next, st.Uid, nil
		}
		if n++; n > 255 {
			return "", 0, fmt.Errorf("too many links on its way")
		}
		target, err := os.Readlink(next)
		if err != nil {
			return "", 0, nil
		}
		if filepath.IsAbs(target) {
			cur = "/"
		}
		todo = append(strings.Split(target, "/"), todo...)
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
}

// verifyMounts makes sure each target in the running container is the
// directory that was checked: a sandboxed command able to write above a
// source can swap it for a link between the check and the engine's mount,
// which follows links; the device and inode seen from inside tell.
func (s *Session) verifyMounts(ctx context.Context, checks []mountCheck, covers []string) error {
	cmd := []string{"stat", "-c", "%d:%i", "--"}
	for _, c := range checks {
		cmd = append(cmd, c.target)
	}
	// Its own bound: a stat stuck on a hung filesystem must not hold the
	// start for the whole of its time.
	ctx, cancel := context.WithTimeout(ctx, verifyTimeout)
	defer cancel()
	// The mount table is read meanwhile: two execs one after the other
	// would add one's time to every cold start.
	want := slices.Clone(covers)
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

// distinctTargets refuses two mounts at one place, which the engine
// would refuse with less to say. A mount below a cover of
// coverHostMounts is fine: the engine mounts the shallower first, and
// the tmpfs is made read-only only once every mount is in place.
func distinctTargets(mounts []mount.Mount) error {
	seen := map[string]bool{}
	for _, m := range mounts {
		if seen[m.Target] {
			return fmt.Errorf("%w: two mounts at %q (a session directory, session.mounts, or a filesystem below one of them)", ErrInvalid, m.Target)
		}
		seen[m.Target] = true
	}
	return nil
}

// verifyTimeout bounds the check of a new container's mounts.
const verifyTimeout = 30 * time.Second

// sessionUser picks the uid:gid commands run as: the configured user,
// else the owner of the workspace (st, as checked), else (root owns it,
// or an id the engine cannot run as) the fallback user.
func sessionUser(c SessionConfig, st *syscall.Stat_t) string {
	if c.User != "" {
		return c.User
	}
	// An owner above maxUserID (such as the 4294967294 some NFS servers
	// give unknown users) is nobody a command can run as: like root's
	// workspace, the fallback user's, rather than every session there
	// refused by the engine at its start.
	if st == nil || st.Uid == 0 || st.Uid > maxUserID {
		return c.FallbackUser
	}
	if st.Gid == 0 || st.Gid > maxUserID {
		// The owner, but not root's group, which may write what root
		// owns group-writable (nor one the engine refuses): the fallback
		// user's group instead.
		_, g, _ := strings.Cut(c.FallbackUser, ":")
		return fmt.Sprintf("%d:%s", st.Uid, g)
	}
	return fmt.Sprintf("%d:%d", st.Uid, st.Gid)
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

// gitMetadata finds the .git of session directory dir (its links
// resolved) without following a link: a directory, or the file a worktree
// or submodule has. ok is false when there is none, or it is a link, which
// is left alone: mounting where it points would show what it points to.
func gitMetadata(dir string) (st syscall.Stat_t, ok bool, err error) {
	st, err = statEntryUnlinked(filepath.Join(dir, ".git"))
	if errors.Is(err, syscall.ENOENT) {
		return st, false, nil
	}
	if err != nil {
		return st, false, err
	}
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFDIR, syscall.S_IFREG:
		return st, true, nil
	}
	return st, false, nil
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

func (s *Session) start(ctx context.Context) error {
	m := s.m
	spec, err := ValidateSpec(m.cfg, m.hostCPUs, s.spec)
	if err != nil {
		return fmt.Errorf("open session %s: %w", s.ID, err)
	}
	s.spec = spec
	for _, d := range spec.ExtraDirs {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return fmt.Errorf("open session %s: %w: additionalDirectories: %.200q is not a directory", s.ID, ErrInvalid, d)
		}
	}
	// Each source is checked, then its device and inode are read from the
	// very directory checked (no link followed), and the started container
	// must show the same there: a sandboxed command that can write above
	// a source could otherwise swap it for a link between the check and
	// the engine's mount, and so can a sandbox of another sandboxd.
	var checks []mountCheck
	real := make([]string, 0, 1+len(spec.ExtraDirs))
	var owner *syscall.Stat_t
	for _, d := range append([]string{spec.Workspace}, spec.ExtraDirs...) {
		if err := m.refusePlantedLinks(s, d); err != nil {
			return fmt.Errorf("open session %s: %w", s.ID, err)
		}
		r, err := checkMountSource(d, m.engineSocket(), m.cfg.Private)
		if err != nil {
			return fmt.Errorf("open session %s: %w", s.ID, err)
		}
		st, err := statUnlinked(r)
		if err != nil {
			return fmt.Errorf("open session %s: %w: workspace: %q changed while it was checked: %v", s.ID, ErrInvalid, d, err)
		}
		if owner == nil {
			owner = &st
		}
		real = append(real, r)
		checks = append(checks, mountCheck{target: d, dev: uint64(st.Dev), ino: st.Ino, known: m.writableByAnother(s, r)})
	}
	user := sessionUser(m.cfg.Session, owner)
	if m.cfg.Session.User == "" && user == m.cfg.Session.FallbackUser {
		// Warned, since commands then cannot write the workspace, which
		// would look like a fault of the sandbox.
		m.log.Warn("the workspace is root's (or an owner the engine cannot run as): commands run as session.fallback_user and cannot write it unless it lets them; set session.user, or chown the directory",
			"session", s.ID, "workspace", spec.Workspace, "user", user)
	}
	s.mu.Lock()
	s.mountSources = real
	s.mu.Unlock()
	s.user = user
	devs := make([]uint64, len(checks))
	for i, c := range checks {
		devs[i] = c.dev
	}
	binds, err := planBinds(append([]string{spec.Workspace}, spec.ExtraDirs...), real, devs)
	if err != nil {
		return fmt.Errorf("open session %s: %w", s.ID, err)
	}
	for i := range checks {
		checks[i].mountPoint = slices.ContainsFunc(binds, func(b bind) bool { return b.target == checks[i].target })
	}
	sc := m.cfg.Session
	var granted []mountCheck
	if sc.Mounts, granted, err = s.grantedMounts(); err != nil {
		return fmt.Errorf("open session %s: %w", s.ID, err)
	}
	checks = append(checks, granted...)
	covered, covers := coverHostMounts(binds, sc.Mounts, hostMountPoints(), mountPointIsDir)
	if len(covered) > 0 {
		// What the container shows empty, so that a missing tool or
		// file can be told from a broken grant.
		m.log.Info("host filesystems below the session's mounts are shown empty; mount one by its own path to show it", "session", s.ID, "covered", covered)
	}
	protected, gitChecks, err := s.protectGit(real, binds, sc.Mounts, covered)
	if err != nil {
		return fmt.Errorf("open session %s: %w", s.ID, err)
	}
	protected = append(covers, protected...)
	checks = append(checks, gitChecks...)
	own := user
	if m.keeper {
		own = keeperUser(user)
	}
	cfg, hostCfg := containerConfig(sc, spec, binds, protected, own, m.instance.Labels(s.ID))
	if err := distinctTargets(hostCfg.Mounts); err != nil {
		return fmt.Errorf("open session %s: %w", s.ID, err)
	}
	var coverTargets []string
	for _, c := range covers {
		coverTargets = append(coverTargets, c.Target)
	}
	name := "sandboxd-" + m.instance.ID + "-" + containerSafe(s.ID)
	suffix, err := randomID(3)
	if err != nil {
		return err
	}
	// The engine goes on with a create or start whose caller gave up,
	// and a container made that way would be nobody's: the session sees
	// both through (a close meanwhile removes it).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	created, err := m.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config:     cfg,
		HostConfig: hostCfg,
		Name:       name + "-" + suffix,
	})
	if err != nil {
		if isNotFound(err) {
			return fmt.Errorf("open session %s: image %s is missing: build it with `sandboxd image build` (or load it with `docker load`): %w", s.ID, spec.Image, err)
		}
		m.removeMade(name + "-" + suffix)
		return fmt.Errorf("open session %s: create container: %w", s.ID, EngineError(err))
	}
	for _, w := range created.Warnings {
		// What the engine dropped of the container asked for (a limit
		// its kernel cannot enforce) it says only here.
		m.log.Warn("the engine changed the session's container", "session", s.ID, "warning", w)
	}
	s.mu.Lock()
	closed := s.closed
	s.contID = created.ID
	s.mu.Unlock()
	// fail removes the container of a start that cannot go on. A close
	// that came meanwhile (Close found no container to remove before
	// the lines above, or removed it under the start after them) is
	// what failed it, and said so, for a caller that opens the session
	// again.
	fail := func(err error) error {
		m.discard(s)
		if s.isClosed() {
			return fmt.Errorf("open session %s: %w: closed while it started", s.ID, ErrNotFound)
		}
		return err
	}
	if closed {
		return fail(nil)
	}
	if _, err := m.cli.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		return fail(fmt.Errorf("open session %s: start container: %w", s.ID, EngineError(err)))
	}
	if err := s.verifyMounts(ctx, checks, coverTargets); err != nil {
		if why := s.stopped(ctx, created.ID); why != nil {
			err = why
		}
		return fail(fmt.Errorf("open session %s: %w", s.ID, err))
	}
	m.log.Info("session opened", "session", s.ID, "container", created.ID[:12], "workspace", spec.Workspace, "user", user,
		"cpus", spec.Limits.CPUs, "memory", limits.FormatBytes(spec.Limits.Memory), "pids", spec.Limits.Pids)
	return nil
}

// stopped says why container id is not running, or nil when it is. The
// engine starts a container whose init cannot run its command (an image
// without sleep) as if it had started; only the exec made next fails, with
// an error that does not say why.
func (s *Session) stopped(ctx context.Context, id string) error {
	c, err := s.m.cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if err != nil || c.Container.State == nil || c.Container.State.Running {
		return nil
	}
	st := c.Container.State
	why := st.Error
	if why == "" {
		why = s.lastLogLines(ctx, id)
	}
	hint := ""
	if st.ExitCode == 127 {
		hint = fmt.Sprintf("; the container runs `sleep infinity` as its main process, so the image %s needs sleep in its PATH", s.spec.Image)
	}
	return fmt.Errorf("the container stopped as it started, exit code %d: %s%s", st.ExitCode, why, hint)
}

// lastLogLines is the end of what a container wrote, cut short: it goes
// into an error message.
func (s *Session) lastLogLines(ctx context.Context, id string) string {
	logs, err := s.m.cli.ContainerLogs(ctx, id, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true, Tail: "3"})
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer logs.Close()
	var out bytes.Buffer
	// A cut frame ends the copy with an error; what came before it is
	// what is wanted.
	stdcopy.StdCopy(&out, &out, io.LimitReader(logs, 2048))
	return strings.Join(strings.Fields(strings.ToValidUTF8(out.String(), "?")), " ")
}

// bind is a directory the container mounts: source on the host, links
// resolved, at target.
type bind struct{ source, target string }

// planBinds pairs each target with its resolved source and leaves out a
// target that lies inside another: the engine would find a nested target
// through the outer mount, that is through a host directory that other
// sandboxes may write, and a link put there at the right moment would land
// the mount anywhere in the container, where the check from inside does
// not look. The outer mount shows the nested directory already, when its
// source is the outer source's own subdirectory; one that resolves
// elsewhere cannot be shown safely and is refused. A nested directory on
// a filesystem of its own (devs differ) is mounted after all, since the
// outer mount, not recursive, shows only the directory under it; the check
// from inside then looks at it like at any other.
func planBinds(targets, sources []string, devs []uint64) ([]bind, error) {
	binds := make([]bind, 0, len(targets))
	for i, t := range targets {
		shown := false
		for j, o := range targets {
			if i == j || !Within(o, t) || t == o && j > i {
				continue
			}
			rel, err := filepath.Rel(o, t)
			if err != nil || sources[i] != filepath.Join(sources[j], rel) {
				return nil, fmt.Errorf("%w: workspace: %q lies inside %q, which is mounted too, but resolves to %s; name it by that path or leave it out", ErrInvalid, t, o, sources[i])
			}
			if t == o || devs == nil || devs[i] == devs[j] {
				shown = true
			}
		}
		if !shown {
			binds = append(binds, bind{source: sources[i], target: t})
		}
	}
	return binds, nil
}

// protectGit plans read-only mounts over the git metadata of the session
// directories (real, their sources with links resolved; binds, what is
// mounted): a command that could write there could set a hook,
// core.fsmonitor or a filter that the person's own git runs on the host,
// outside any sandbox, at the editor's next `git status`. Each is mounted
// wherever a bind shows it. A mount point can be neither renamed nor
// removed from inside, but the directory above one can: every directory
// between the bind and the metadata is pinned by a mount onto itself, so
// that nothing can move the metadata aside and put other in its place. The
// checks make the started container show the very files that were checked
// there. A writable grant (grants, sources resolved) that shows the
// metadata too, one of the folder the session's directory is in say, gets
// the same at its own target: else the metadata, read-only at the
// directory's path, would be writable at the grant's.
func (s *Session) protectGit(real []string, binds []bind, grants []Mount, covered []string) ([]mount.Mount, []mountCheck, error) {
	sc := s.m.cfg.Session
	if !sc.ProtectGit {
		return nil, nil, nil
	}
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

// rootGitDirs returns the git directories the .git of each session
// directory names (a worktree's, a separate git directory), and the common
// directory each git directory names, wherever they lie.
func rootGitDirs(real []string) []string {
	var dirs []string
	for _, r := range real {
		gitdir, common, ok := gitDirsOf(r)
		if !ok || gitdir == "" {
			continue
		}
		if gitdir != filepath.Join(r, ".git") {
			dirs = append(dirs, gitdir)
		}
		if common != "" && !slices.Contains(dirs, common) {
			dirs = append(dirs, common)
		}
	}
	return dirs
}

// gitDirsOf reads the .git of dir: ok when it has one; gitdir is the .git
// itself when a directory, else the git directory its file names ("" for
// none that is one); common is the common directory gitdir names, if any.
func gitDirsOf(dir string) (gitdir, common string, ok bool) {
	st, ok, err := gitMetadata(dir)
	if err != nil || !ok {
		return "", "", false
	}
	gitdir = filepath.Join(dir, ".git")
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		if gitdir = pointedTo(gitdir, "gitdir: "); !isGitDir(gitdir) {
			return "", "", true
		}
	}
	if common = pointedTo(filepath.Join(gitdir, "commondir"), ""); !isGitDir(common) {
		common = ""
	}
	return gitdir, common, true
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

// gitMetadataOf finds the git metadata in the session directories (real,
// links resolved) and in the directories right below them (a folder of
// projects, which editors search for repositories one level down): each
// one's .git, a directory or the file a worktree, submodule or separate
// git directory has; the git directory such a file names; and the common
// directory (config and hooks of a worktree) a git directory names. Only
// what lies in one of the session directories, or in one of also
// (writable grants that hold one), counts: nothing else is in the
// container. A path with a link on the way inside one of those is left
// out, and so is a .git that is a link: a command could point it
// elsewhere, and git follows it when it runs. Nothing at or below one of
// mountPoints (the host's filesystems below the session directories,
// which the container does not show) is looked at: a dead network mount
// would hang the look.
func gitMetadataOf(real, also, mountPoints []string) ([]string, error) {
	var found []string
	in := append(slices.Clip(real), also...)
	add := func(p string) bool {
		if slices.Contains(found, p) || !slices.ContainsFunc(in, func(r string) bool { return Within(r, p) }) || !unlinked(p, in) {
			return false
		}
		found = append(found, p)
		return true
	}
	var roots []string
	for _, r := range real {
		nested, err := nestedRepositories(r, mountPoints)
		if err != nil {
			return nil, err
		}
		roots = append(append(roots, r), nested...)
	}
	// Submodules found in an index are looked at as roots too, for
	// their own .git and their own submodules.
	fromIndex, indexBytes := 0, int64(indexBudget)
	for i := 0; i < len(roots); i++ {
		r := roots[i]
		dotgit := filepath.Join(r, ".git")
		if slices.Contains(mountPoints, dotgit) {
			continue
		}
		gitdir, common, ok := gitDirsOf(r)
		if !ok {
			continue
		}
		add(dotgit)
		if gitdir != dotgit && (gitdir == "" || !add(gitdir)) {
			continue
		}
		dirs := []string{gitdir}
		if common != "" {
			add(common)
			dirs = append(dirs, common)
		}
		// A submodule's .git file may lie any depth below: a command that
		// pointed it elsewhere would have git, which goes into
		// submodules for `git status`, run that repository's config.
		for _, d := range dirs {
			wts, err := submoduleWorktrees(d)
			if err != nil {
				return nil, err
			}
			for _, wt := range wts {
				if _, ok, err := gitMetadata(wt); err == nil && ok && !slices.Contains(mountPoints, wt) {
					add(filepath.Join(wt, ".git"))
				}
			}
		}
		// Host git goes into every submodule the index records that has
		// a .git, set up or not: one a command made (`git init` in a
		// submodule never checked out) would have its config run. The
		// directory of one without a .git is kept read-only whole, so
		// that none can be made there; one with is looked at as a root.
		hashLen := 20
		if strings.EqualFold(gitConfigValue(filepath.Join(dirs[len(dirs)-1], "config"), "extensions", "objectformat"), "sha256") {
			hashLen = 32
		}
		links, err := gitlinks(filepath.Join(gitdir, "index"), hashLen, &indexBytes)
		if err != nil {
			return nil, fmt.Errorf("%w: workspace: %v: sandboxd cannot tell which submodules to protect (session.protect_git); let git rewrite it (`git update-index --index-version 2`) or set protect_git = false", ErrInvalid, err)
		}
		for _, l := range links {
			wt := filepath.Join(r, filepath.FromSlash(l))
			if slices.ContainsFunc(mountPoints, func(m string) bool { return Within(m, wt) }) || slices.Contains(roots, wt) {
				continue
			}
			if fromIndex++; fromIndex > maxModuleDirs {
				return nil, fmt.Errorf("%w: workspace: %s records more submodules than sandboxd protects (%d; session.protect_git); set protect_git = false", ErrInvalid, r, maxModuleDirs)
			}
			if _, ok, err := gitMetadata(wt); err == nil && ok {
				roots = append(roots, wt)
			} else if fi, err := os.Lstat(wt); err == nil && fi.IsDir() {
				add(wt)
			}
		}
	}
	return found, nil
}

// gitLinks returns the .git entries that are links in the session
// directories (real) and right below them, where gitMetadataOf looks.
func gitLinks(real []string) []string {
	var links []string
	for _, r := range real {
		dirs := []string{r}
		if entries, err := os.ReadDir(r); err == nil {
			for _, e := range entries {
				if e.IsDir() && e.Name() != ".git" {
					dirs = append(dirs, filepath.Join(r, e.Name()))
				}
			}
		}
		for _, d := range dirs {
			if fi, err := os.Lstat(filepath.Join(d, ".git")); err == nil && fi.Mode()&os.ModeSymlink != 0 {
				links = append(links, filepath.Join(d, ".git"))
			}
		}
	}
	return links
}

// maxModuleDirs and maxModuleDepth bound what submoduleWorktrees looks
// at.
const (
	maxModuleDirs  = 1024
	maxModuleDepth = 8
)

// submoduleWorktrees returns the working trees of the submodules whose git
// directories lie in gitdir's modules directory (core.worktree of each,
// relative to it), nested ones too. A module's name may hold slashes,
// which make directories of their own. A modules directory beyond its
// bounds is refused rather than some submodules left out.
func submoduleWorktrees(gitdir string) ([]string, error) {
	var wts []string
	seen := 0
	var walk func(dir string, depth int) error
	walk = func(dir string, depth int) error {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil
		}
		if depth > maxModuleDepth || seen+len(entries) > maxModuleDirs {
			return fmt.Errorf("%w: workspace: %s holds more submodules than sandboxd protects (%d entries, %d levels; session.protect_git); set protect_git = false", ErrInvalid, filepath.Join(gitdir, "modules"), maxModuleDirs, maxModuleDepth)
		}
		seen += len(entries)
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			d := filepath.Join(dir, e.Name())
			if !isGitDir(d) {
				if err := walk(d, depth+1); err != nil {
					return err
				}
				continue
			}
			if wt := gitConfigValue(filepath.Join(d, "config"), "core", "worktree"); wt != "" {
				if !filepath.IsAbs(wt) {
					wt = filepath.Join(d, wt)
				}
				wts = append(wts, filepath.Clean(wt))
			}
			if err := walk(filepath.Join(d, "modules"), depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	err := walk(filepath.Join(gitdir, "modules"), 0)
	return wts, err
}

// maxNested bounds the repositories protected right below a session
// directory: each costs two mounts.
const maxNested = 256

// nestedRepositories returns the directories right below dir that hold a
// .git, in name order: not links, and not host mount points. More than
// maxNested of them is refused rather than some left unprotected, which
// a command could choose by making repositories that come first.
func nestedRepositories(dir string, mountPoints []string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil // the session's start reports a directory it cannot read
	}
	var repos []string
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if !e.IsDir() || e.Name() == ".git" || slices.ContainsFunc(mountPoints, func(m string) bool { return m == p || m == filepath.Join(p, ".git") }) {
			continue
		}
		if _, ok, err := gitMetadata(p); err == nil && ok {
			repos = append(repos, p)
		}
	}
	if len(repos) > maxNested {
		return nil, fmt.Errorf("%w: workspace: %s holds %d repositories right below it, more than the %d whose git metadata sandboxd mounts read-only (session.protect_git); open a directory with fewer, or set protect_git = false", ErrInvalid, dir, len(repos), maxNested)
	}
	return repos, nil
}

// isGitDir reports whether dir looks like a git directory (a HEAD, or
// objects and refs):
// a pointer to any other directory would only make that read-only.
func isGitDir(dir string) bool {
	if dir == "" {
		return false
	}
	// HEAD may be a link (core.preferSymlinkRefs); a common directory
	// needs none, only objects and refs.
	if fi, err := os.Lstat(filepath.Join(dir, "HEAD")); err == nil && (fi.Mode().IsRegular() || fi.Mode()&os.ModeSymlink != 0) {
		return true
	}
	objects, err1 := os.Lstat(filepath.Join(dir, "objects"))
	refs, err2 := os.Lstat(filepath.Join(dir, "refs"))
	return err1 == nil && err2 == nil && objects.IsDir() && refs.IsDir()
}

// unlinked reports whether no component of p below one of the session
// directories (real) is a link, and p exists.
func unlinked(p string, real []string) bool {
	for _, r := range real {
		if !Within(r, p) {
			continue
		}
		rel, err := filepath.Rel(r, p)
		if err != nil {
			return false
		}
		at := r
		for _, c := range strings.Split(rel, "/") {
			if c == "." {
				continue
			}
			at = filepath.Join(at, c)
			fi, err := os.Lstat(at)
			if err != nil || fi.Mode()&os.ModeSymlink != 0 {
				return false
			}
		}
		return true
	}
	return false
}

// pointedTo reads the path a small git pointer file holds after prefix
// (e.g. "gitdir: "), relative to the file's directory unless absolute, as
// git reads it: all of the rest, less a line end; "" when there is none.
func pointedTo(file, prefix string) string {
	b := readSmallFile(file, 4096)
	p, ok := strings.CutPrefix(strings.TrimRight(string(b), "\r\n"), prefix)
	if !ok || p == "" {
		return ""
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(filepath.Dir(file), p)
	}
	return filepath.Clean(p)
}

// gitConfigValue returns key's value in section of a git config file, as
// far as a plain reading tells (the last one set, quotes removed), or "".
func gitConfigValue(file, section, key string) string {
	var in bool
	var value string
	for _, line := range strings.Split(string(readSmallFile(file, 64<<10)), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "[") {
			name, _, _ := strings.Cut(strings.Trim(line, "[]"), " ")
			in = strings.EqualFold(name, section)
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if in && ok && strings.EqualFold(strings.TrimSpace(k), key) {
			value = strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	return value
}

// readSmallFile reads up to max bytes of a regular file, once, without
// following a link or waiting: a FIFO a command put there must not hold
// sandboxd up. It returns nil for anything else.
func readSmallFile(file string, max int) []byte {
	fd, err := unix.Open(file, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil
	}
	b := make([]byte, max)
	n, err := unix.Read(fd, b)
	if err != nil || n <= 0 {
		return nil
	}
	return b[:n]
}

// coverHostMounts finds the filesystems mounted on the host below the
// sources of the binds and of the granted mounts (their links resolved;
// mountPoints, as the host's mountinfo lists them), which the mounts, not
// recursive, do not show, and covers each in the container with an empty
// read-only tmpfs. Without one the directory there would be a plain
// directory inside, and a command's rmdir or rename of it would detach or
// move the host's own mount: the kernel refuses that only for a mount
// point of the container's own table. A granted mount is covered whatever
// its mode, as the workspace is: what the container shows below a mount
// does not depend on what may be written there. A place where another
// mount shows its own (a session directory of its own, a grant inside the
// workspace) is not covered. It returns the host paths covered and the
// mounts. isDir tells a directory from a file mount point (the host binds
// files too, /etc/hosts in a container of its own): a file is covered by
// /dev/null, read-only, where a tmpfs cannot go.
func coverHostMounts(binds []bind, granted []Mount, mountPoints []string, isDir func(string) bool) ([]string, []mount.Mount) {
	// Stacked mounts list a place more than once: it is covered once.
	mountPoints = slices.Compact(slices.Sorted(slices.Values(mountPoints)))
	binds = slices.Clip(binds)
	for _, mt := range granted {
		binds = append(binds, bind{source: mt.Source, target: mt.Target})
	}
	var hosts []string
	var covers []mount.Mount
	for _, b := range binds {
		for _, p := range mountPoints {
			if p == b.source || !Within(b.source, p) {
				continue
			}
			// Only the topmost: what lies below a covered one is not in
			// the container anyway.
			if slices.ContainsFunc(mountPoints, func(o string) bool {
				return o != p && o != b.source && Within(b.source, o) && Within(o, p)
			}) {
				continue
			}
			rel, _ := filepath.Rel(b.source, p)
			target := filepath.Join(b.target, rel)
			// Another mount at that place or above it, inside b's: the
			// engine mounts it after b (deeper targets come later), and
			// the container shows it there, not b's directory.
			if slices.ContainsFunc(binds, func(o bind) bool {
				return o.target != b.target && Within(b.target, o.target) && Within(o.target, target)
			}) {
				continue
			}
			hosts = append(hosts, p)
			if !isDir(p) {
				covers = append(covers, mount.Mount{Type: mount.TypeBind, Source: os.DevNull, Target: target, ReadOnly: true})
				continue
			}
			covers = append(covers, mount.Mount{Type: mount.TypeTmpfs, Target: target, ReadOnly: true,
				TmpfsOptions: &mount.TmpfsOptions{SizeBytes: 4096, Mode: 0o555}})
		}
	}
	return hosts, covers
}

// mountPointIsDir reports whether the mount point p is a directory, from
// what the kernel has cached: a dead network filesystem there must not
// hang the start. What cannot be looked at counts as a directory, the
// usual mount point.
func mountPointIsDir(p string) bool {
	var st unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW|unix.AT_NO_AUTOMOUNT|unix.AT_STATX_DONT_SYNC, unix.STATX_TYPE, &st)
	return err != nil || st.Mode&unix.S_IFMT == unix.S_IFDIR
}

// hostMountPoints lists the mount points of sandboxd's mount namespace,
// the host's as the engine sees it.
func hostMountPoints() []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	return mountPointsOf(b)
}

// mountPointsOf lists the mount points of a mountinfo table.
func mountPointsOf(table []byte) []string {
	var points []string
	for _, m := range mountinfo.Parse(table) {
		points = append(points, m.Point)
	}
	return points
}

// bindMount mounts source at target, read-only when mode is "ro". Not
// recursive: a filesystem mounted somewhere below a directory (a chroot's
// /proc, a loop device, another bind) was never checked, and the engine's
// read-only would not reach it.
func bindMount(source, target, mode string) mount.Mount {
	return mount.Mount{Type: mount.TypeBind, Source: source, Target: target, ReadOnly: mode == "ro",
		BindOptions: &mount.BindOptions{NonRecursive: true}}
}

// keeper is the user the container's own processes run as: an id no
// configuration is likely to give commands (the engine takes ids up to
// maxUserID). An engine that maps ids (userns-remap, rootless) has no
// such id to give (Manager.keeper): there they are the commands' own.
const keeper = maxUserID - 1

// keeperUser is the user of the container's own processes in a session
// whose commands run as user: the keeper, unless that is user's uid, when
// they stay the commands' own.
func keeperUser(user string) string {
	if uid, _, _ := strings.Cut(user, ":"); strings.TrimLeft(uid, "0") == strconv.Itoa(keeper) {
		return user
	}
	return fmt.Sprintf("%d:%d", keeper, keeper)
}

// containerConfig is the hardened container of DESIGN.md: no network, no
// capabilities, no privilege gain, read-only root, init, limits, a non-root
// user, and no host path but the workspace and what the config grants.
//
// binds are the workspace and extra directories, their sources with links
// resolved, as checked: what the engine mounts, so that no link it would
// follow is one that was not checked. more are mounted over them.
func containerConfig(c SessionConfig, spec SessionSpec, binds []bind, more []mount.Mount, own string, labels map[string]string) (*container.Config, *container.HostConfig) {
	cfg := &container.Config{
		Image: spec.Image,
		// The image's own entrypoint (a tool's image runs the tool) would
		// take the sleep as its arguments, and the container would end.
		Entrypoint: []string{"sleep", "infinity"},
		// The container's own processes (its init, the sleep that keeps
		// it up) run as own, not as the commands' user where the engine
		// lets them: a command that signals whatever its user may (`kill
		// -9 -1`) would stop the container, and every command of the
		// session after it would fail. Every exec names the session's
		// user.
		User: own,
		// The keeper may not enter the workspace, whose owner may keep
		// others out; every exec names its own directory.
		WorkingDir: "/",
		// PATH is the image's (a toolchain's image adds its own bin), or
		// the engine's default where the image sets none.
		Env:      []string{"HOME=/tmp"},
		Labels:   labels,
		Hostname: "sandbox",
	}
	tmpfs := make(map[string]string, len(c.Scratch))
scratch:
	for _, p := range c.Scratch {
		// A workspace at or above a scratch path (`cd /tmp && sandboxd
		// run ...`) is that place already (writable unless the workspace
		// is mounted read-only): a tmpfs there would hide it.
		for _, b := range binds {
			if Within(b.target, p) {
				continue scratch
			}
		}
		// exec: toolchains run what they build in /tmp; the workspace is
		// executable anyway, so noexec would protect nothing.
		tmpfs[p] = fmt.Sprintf("rw,exec,nosuid,nodev,size=%d,mode=1777", int64(c.ScratchSize))
	}
	var mounts []mount.Mount
	for _, b := range binds {
		mounts = append(mounts, bindMount(b.source, b.target, c.WorkspaceMode))
	}
	mounts = append(mounts, more...)
	for _, mt := range c.Mounts {
		mounts = append(mounts, bindMount(mt.Source, mt.Target, mt.Mode))
	}
	var secOpt []string
	if c.NoNewPrivileges {
		secOpt = append(secOpt, "no-new-privileges")
	}
	init := c.Init
	host := &container.HostConfig{
		NetworkMode:    container.NetworkMode(spec.Network),
		CapDrop:        c.CapDrop,
		SecurityOpt:    secOpt,
		ReadonlyRootfs: c.ReadonlyRootfs,
		Tmpfs:          tmpfs,
		Init:           &init,
		Mounts:         mounts,
		Resources:      spec.Limits.Engine(),
		IpcMode:        "private",
		// The container's own cgroup, not the host's hierarchy and the
		// container's id (cgroup v1 defaults to the host's).
		CgroupnsMode: container.CgroupnsModePrivate,
		// On an engine that maps ids pid 1 runs as the session's user,
		// so a command can write to the container's log (/proc/1/fd/1);
		// on an engine without log limits that would fill the host's
		// disk. The log holds only what the init says when the
		// container fails to start.
		LogConfig: container.LogConfig{Type: "json-file", Config: map[string]string{"max-size": "1m", "max-file": "1"}},
	}
	return cfg, host
}

// containerSafe keeps the characters Docker allows in names.
func containerSafe(id string) string {
	var b strings.Builder
	for _, r := range id {
		if b.Len() >= 32 {
			break
		}
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.' {
			b.WriteRune(r)
		}
	}
	return b.String()
}

func (s *Session) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// claimIdle marks the session closed, for the caller to Close, when it has
// had no call and no unreleased terminal for timeout. Checking and marking
// are one step: a call that comes meanwhile either keeps the session or
// finds it closed, never a terminal of it killed a moment after it started.
func (s *Session) claimIdle(now time.Time, timeout time.Duration) bool {
	select {
	case <-s.ready:
	default:
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// A terminal not yet released, running or not, is still the peer's to
	// read: its id must stay good until terminal/release.
	if s.closed || len(s.terminals) > 0 || now.Sub(s.lastUsed) < timeout {
		return false
	}
	s.closed = true
	return true
}

// Terminal returns the terminal with the given id.
func (s *Session) Terminal(id string) (*Terminal, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastUsed = time.Now()
	t, ok := s.terminals[id]
	if !ok || s.closed {
		return nil, fmt.Errorf("terminal %s: %w", id, ErrNotFound)
	}
	return t, nil
}

// Release kills the terminal if it still runs and forgets it; its id is
// unknown afterwards.
func (s *Session) Release(ctx context.Context, id string) error {
	t, err := s.Terminal(id)
	if err != nil {
		return err
	}
	if !s.forgetTerminal(t) {
		return fmt.Errorf("terminal %s: %w", id, ErrNotFound)
	}
	err = t.Kill(ctx)
	t.close()
	// Processes the command left running in the background are part of
	// what release frees, nobody need wait for that, and the kill leaves
	// them be when the command had exited, also just as it looked; when
	// the kill failed, the id is gone, and the sweep is what is left to
	// kill them with.
	s.sweepLater(id)
	if err != nil {
		if ctx.Err() != nil {
			// Asked off while the kill waited: released all the same,
			// and to say otherwise would have the peer retry an id that
			// is no more.
			return nil
		}
		return fmt.Errorf("release terminal %s: %w", id, err)
	}
	return nil
}

// Close kills every terminal and removes the container.
func (s *Session) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		// Out of the manager's sessions first: an open under the key
		// while the container is removed is a new session, not this
		// closing one. Among the detached until the container is gone.
		s.m.detach(s)
		s.mu.Lock()
		s.closed = true
		if s.sweepTimer != nil {
			s.sweepTimer.Stop()
		}
		terms := make([]*Terminal, 0, len(s.terminals))
		for _, t := range s.terminals {
			terms = append(terms, t)
		}
		s.terminals = map[string]*Terminal{}
		s.mu.Unlock()
		for _, t := range terms {
			t.unhold()
		}
		// Removing the container kills every process in it at once; no
		// per-terminal kill is needed.
		for _, t := range terms {
			t.markSent(syscall.SIGKILL)
		}
		s.closeErr = s.removeContainer()
		s.mu.Lock()
		ran := s.ran
		s.mu.Unlock()
		if made := s.gitMade(); ran && len(made) > 0 {
			s.m.log.Warn("git metadata appeared in the session's directories while it ran, with no read-only mount over it: commands may have set hooks or config there; look at them before you run git in it on the host",
				"session", s.ID, "paths", made)
		}
		for _, t := range terms {
			t.close()
		}
		s.m.forget(s)
		if s.closeErr != nil {
			s.m.removeLater(s) // among the detached again until it is gone
		}
		s.m.log.Info("session closed", "session", s.ID)
	})
	return s.closeErr
}

func (s *Session) removeContainer() error {
	s.mu.Lock()
	id := s.contID
	s.mu.Unlock()
	if id == "" {
		return nil
	}
	// A caller's cancelled context must not leave the container behind.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.m.ctx), 30*time.Second)
	defer cancel()
	if err := removeContainer(ctx, s.m.cli, id); err != nil && !isNotFound(err) {
		return fmt.Errorf("close session %s: remove container %.12s: %w", s.ID, id, err)
	}
	return nil
}

// oomKillsRose reads the container's OOM-kill counter and reports whether
// it rose since the last read: the command that asks died of SIGKILL that
// sandboxd did not send, and a rise says the OOM killer sent it. When
// several died together (the counter rose by more than one), the others
// learn it too if they ask soon after; a rise left over from a process
// killed in the background is not put down to a command much later. It
// costs an exec, so it is only asked when needed.
func (s *Session) oomKillsRose(ctx context.Context) bool {
	// A command of the session can stop the reading cat: the exit status
	// must not wait for it.
	ctx, cancel := context.WithTimeout(ctx, oomReadTimeout)
	defer cancel()
	out, err := s.execOutput(ctx, []string{"cat", "/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"})
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

// killScript signals every process of some terminals and prints them, as
// pid:start-time pairs, for a later kill to find again. A process is one
// of theirs when its environment carries one of the markers given as grep
// -e arguments, when it is one of the pairs given (known, from an earlier
// kill of the same terminals), or when it descends from one of those: a
// process that removed the marker from its environment is still its
// parent's child, or, once orphaned while the command runs, the child of
// the command's own reaper (reaperPath), which carries the marker; or,
// adopted by the container's init with no marker in an environment it
// can read, it started after the kill's first signal and is in one of the
// process groups that signal reached (the "@start" and "%group" the
// SIGTERM pass prints ahead of its pairs; start times in clock ticks since
// boot, as /proc/PID/stat has them): forked by one that removed its
// marker as the command, and its reaper with it, ended on that signal.
// Another command's process that lost its reaper meanwhile is of another
// group (the reaper gives each command its own), and is left alone; with
// no reaper every command's group is 0, which scopes nothing, and the
// rule is off. Markers
// are plain regular expressions (letters, digits, '_' and '='): busybox
// grep -F stops at the first NUL of environ, its regex matcher does not.
// A reaper is not sent SIGTERM or SIGHUP: it passes them on to its child,
// which would get them twice, and some programs take a second one as
// "stop now".
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
// has pids to spare, and looks again at once otherwise. A stat line is read whole: a command name may hold
// a newline.
const killScript = `sig=$1; known=" $2 "; shift 2; n=0; last=
since=; groups=" "
for k in $known; do case $k in @*) since=${k#@};; %*) groups="$groups${k#%} ";; esac; done
pc=/sys/fs/cgroup/pids; [ -r "$pc/pids.max" ] || pc=/sys/fs/cgroup
room() {
  max=; cur=
  { read -r max < "$pc/pids.max"; read -r cur < "$pc/pids.current"; } 2>/dev/null
  case $max in ''|*[!0-9]*) return 0;; esac
  case $cur in ''|*[!0-9]*) return 0;; esac
  [ $((max - cur)) -gt 2 ]
}
pids=" "
look=
if room && command -v grep >/dev/null; then look=$(echo .; exec grep -ls "$@" /proc/[0-9]*/environ); fi
case $look in
.*)
  for f in $look; do case $f in /proc/*/environ) f=${f#/proc/}; pids="$pids${f%/environ} ";; esac; done;;
*)
  for d in /proc/[0-9]*; do
    e=; l=
    { while read -r l; do e="$e$l"; done; e="$e$l"; } 2>/dev/null < "$d/environ"
    for m; do
      case $m in -e) continue;; esac
      case $e in *"$m"*) pids="$pids${d#/proc/} "; break;; esac
    done
  done;;
esac
readstat() {
  st=
  { read -r st; while read -r l; do st="$st $l"; done; } 2>/dev/null < "$1"
}
tree() {
  links=; reapers=" "
  for d in /proc/[0-9]*; do
    readstat "$d/stat"
    [ -n "$st" ] || continue
    p=${d#/proc/}
    case $st in "$p (docker-init) "?" 0 "*) reapers="$reapers$p ";; esac
    set -- ${st##*) }
    case $1 in Z|X) continue;; esac
    case $known in *" $p:${20} "*) case $pids in *" $p "*) ;; *) pids="$pids$p ";; esac;; esac
    if [ "$2" = 1 ] && [ -n "$since" ] && [ "${20}" -ge "$since" ]; then
      case $groups in *" $3 "*)
        case $pids in *" $p "*) ;; *)
          e=; l=
          { while read -r l; do e="$e$l"; done; e="$e$l"; } 2>/dev/null < "$d/environ"
          case $e in ''|*SANDBOXD_TERMINAL=*) ;; *) pids="$pids$p ";; esac;;
        esac;;
      esac
    fi
    links="$links $p:$2:$3:${20}"
  done
  grew=1
  while [ "$pids" != " " ] && [ $grew = 1 ]; do
    grew=0
    for l in $links; do
      p=${l%%:*}; pp=${l#*:}; pp=${pp%%:*}
      case $pids in *" $p "*) continue;; esac
      case $pids in *" $pp "*) pids="$pids$p "; grew=1;; esac
    done
  done
}
tree
if [ "$sig" != KILL ]; then
  send=
  for p in $pids; do case $reapers in *" $p "*) ;; *) send="$send $p";; esac; done
  [ -z "$send" ] || kill -s "$sig" $send 2>/dev/null
  readstat /proc/$$/stat; set -- ${st##*) }
  printf '@%s ' "${20}"
  gs=" "
  for l in $links; do
    case $pids in *" ${l%%:*} "*)
      g=${l#*:}; g=${g#*:}; g=${g%%:*}
      case $gs in *" $g "*) ;; *) gs="$gs$g "; [ "$g" = 0 ] || printf '%%%s ' "$g";; esac;;
    esac
  done
  for l in $links; do
    case $pids in *" ${l%%:*} "*) printf '%s:%s ' "${l%%:*}" "${l##*:}";; esac
  done
  exit 0
fi
while [ "$pids" != " " ]; do
  kill -s STOP $pids 2>/dev/null
  new=0
  for p in $pids; do case $last in *" $p "*) ;; *) new=1; break;; esac; done
  [ $new = 1 ] || kill -s KILL $pids 2>/dev/null
  n=$((n+1))
  if [ $n -ge 100 ]; then kill -s KILL $pids 2>/dev/null; exit 1; fi
  for l in $links; do
    case $pids in *" ${l%%:*} "*)
      case $known in *" ${l%%:*}:${l##*:} "*) ;; *) known="$known${l%%:*}:${l##*:} ";; esac;;
    esac
  done
  last=$pids; pids=" "
  tree
done
read -r t0 _ < /proc/uptime; t0=${t0%.*}${t0#*.}
reaps=0; readstat /proc/1/stat
case $st in "1 (docker-init) "*|"1 (tini) "*) reaps=1;; esac
for k in $known; do
  while :; do
    readstat "/proc/${k%%:*}/stat"
    [ -n "$st" ] || break
    set -- ${st##*) }
    [ "${20}" = "${k##*:}" ] || break
    [ "$2" != 1 ] || [ $reaps = 1 ] || break
    read -r t _ < /proc/uptime; t=${t%.*}${t#*.}
    [ $((t - t0)) -lt 300 ] || break 2
    if room; then sleep 0.01; fi
  done
done`

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
		if _, err := cli.ContainerUpdate(ctx, s.contID, client.ContainerUpdateOptions{Resources: &lent}); err != nil {
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
		if _, err := cli.ContainerUpdate(ctx, s.contID, client.ContainerUpdateOptions{Resources: &base}); err != nil {
			s.m.log.Warn("restore pids limit", "session", s.ID, "err", err)
		}
	}, nil
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

// execOutput runs a helper command in the container as the session's user
// and returns its output. The user matters: with no capabilities, only a
// process of the same uid may signal the command's processes.
func (s *Session) execOutput(ctx context.Context, cmd []string) ([]byte, error) {
	cli := s.m.cli
	ex, err := cli.ExecCreate(ctx, s.contID, client.ExecCreateOptions{
		User: s.user, Cmd: cmd, AttachStdout: true, AttachStderr: true,
	})
	if err != nil {
		return nil, err
	}
	att, err := cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{})
	if err != nil {
		return nil, err
	}
	defer att.Close()
	// Reads of the hijacked connection do not watch ctx.
	defer context.AfterFunc(ctx, att.Close)()
	// A command of the session can write into a helper's output (it runs
	// as the same user, so /proc/PID/fd/1 is open to it): what sandboxd
	// keeps is bounded, and a helper that says more has failed.
	out, errOut := &cappedBuffer{max: maxHelperOutput}, &cappedBuffer{max: maxHelperOutput}
	if _, err := stdcopy.StdCopy(out, errOut, att.Reader); err != nil {
		return out.Bytes(), fmt.Errorf("session %s: %s: %w", s.ID, cmd[0], err)
	}
	code, err := waitExec(ctx, cli, ex.ID)
	if err != nil {
		return out.Bytes(), err
	}
	if code != 0 {
		return out.Bytes(), &execError{cmd: cmd[0], code: code, stderr: string(bytes.TrimSpace(errOut.Bytes())), output: out.String() + errOut.String()}
	}
	return out.Bytes(), nil
}

// maxHelperOutput bounds what sandboxd reads from one of its own commands
// in a container, far above what any of them writes: mountinfo of some
// thousand mounts, or the kill script's pairs for some hundred thousand
// processes.
const maxHelperOutput = 4 << 20

// cappedBuffer is a bytes.Buffer that takes at most max bytes.
type cappedBuffer struct {
	bytes.Buffer
	max int
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.max {
		return 0, fmt.Errorf("wrote more than the %d bytes expected of it (a command of the session writing into it?)", b.max)
	}
	return b.Buffer.Write(p)
}

// execError is a command of sandboxd's own that ran in a container and
// failed.
type execError struct {
	cmd    string
	code   int
	stderr string
	output string // all it wrote, for missing
}

func (e *execError) Error() string {
	if e.stderr == "" {
		return fmt.Sprintf("%s exited with %d", e.cmd, e.code)
	}
	return fmt.Sprintf("%s exited with %d: %.500s", e.cmd, e.code, e.stderr)
}

// missing reports whether the image does not have the command: the
// engine says so with 126 or 127 and its reason.
func (e *execError) missing() bool {
	return (e.code == 126 || e.code == 127) && (strings.Contains(e.output, "executable file not found") || strings.Contains(e.output, "no such file or directory"))
}

// waitExec polls until the exec is no longer running and returns its exit
// code. The stream's EOF comes first; the engine records the exit a moment
// later, and ExitCode reads 0 until then, so Running must be checked.
//
// A process still running long after its stream ended (its connection was
// closed by a release or a close, and it outlived the kill) is polled once
// a second: it may run for as long as the container does.
func waitExec(ctx context.Context, cli *client.Client, execID string) (int, error) {
	delay := 500 * time.Microsecond
	start := time.Now()
	for {
		r, err := cli.ExecInspect(ctx, execID, client.ExecInspectOptions{})
		if err != nil {
			return 0, err
		}
		if !r.Running {
			return r.ExitCode, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(delay*2, 50*time.Millisecond)
		if time.Since(start) > 5*time.Second {
			delay = time.Second
		}
	}
}
