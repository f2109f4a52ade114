package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// gitFile is a piece of git metadata as protectGit found it.
type gitFile struct {
	path     string
	dev, ino uint64
}

// gitFound is what statGitMetadata finds.
type gitFound struct {
	// meta is the git metadata of the session directories.
	meta []gitFile
	// conf is what the repositories' config makes host git read config
	// from or run, in a session directory or a writable grant: links
	// resolved, and each component checked to be none; missing is what
	// of it is not there (yet).
	conf    []gitFile
	missing []gitTarget
	notes   []gitNote
	// blocked are the directories (in conf too) whose mode kept the scan
	// from looking below them, each with what it was looking for.
	blocked []gitNote
}

// files is all that is to be read-only.
func (f gitFound) files() []gitFile { return append(slices.Clip(f.meta), f.conf...) }

// Bounds on what the config of one repository makes sandboxd look at:
// the paths kept read-only (each costs a mount, and pins), the paths
// looked at, and the bytes of config read. Each repository has its own,
// so that one a command made cannot use up those of the person's; the
// number of repositories is bounded (maxNested, maxModuleDirs), and so
// the total.
const (
	maxConfigTargets = 32
	maxConfigLooks   = 512
	configBudget     = 2 << 20
)

// maxBlocked bounds the directories kept read-only whole because the scan
// could not look below them: each costs a mount.
const maxBlocked = 256

// statGitMetadata finds the git metadata of the session directories (real)
// and what their repositories' config makes host git read or run
// (configTargets) where commands could write it: in real or in grants
// (the sources of the writable grants), and reads the device and inode of
// each, not following a link. mountPoints are the host's mount points
// below them, which it does not look into.
func statGitMetadata(real, grants, mountPoints []string) (gitFound, error) {
	// The writable grants that hold a session directory, or a git
	// directory one names, show the git directories the .git files name
	// there too.
	homes := append(slices.Clip(real), rootGitDirs(real)...)
	var also []string
	for _, g := range grants {
		if slices.ContainsFunc(homes, func(r string) bool { return r != g && Within(g, r) }) {
			also = append(also, g)
		}
	}
	scan := scanGit(real, also, mountPoints)
	found := gitFound{notes: scan.notes}
	for _, p := range scan.found {
		st, err := statEntryUnlinked(p)
		if err != nil {
			return gitFound{}, fmt.Errorf("%w: workspace: %q changed while it was checked: %v", ErrInvalid, p, err)
		}
		found.meta = append(found.meta, gitFile{p, uint64(st.Dev), st.Ino})
	}
	owner := -1
	if len(real) > 0 {
		if st, err := statUnlinked(real[0]); err == nil {
			owner = int(st.Uid)
		}
	}
	reach := append(slices.Clip(real), grants...)
	seen := map[string]bool{}
	// A directory a command set to mode 000 hides a repository below it
	// (sandboxd, as the workspace's owner, has no more rights than the
	// command): such a directory of a session directory, or its .git,
	// is kept read-only whole, its mode too, so that nothing below it can
	// be reached or changed.
	for _, r := range real {
		entries, _ := os.ReadDir(r) // the session's start reports a directory it cannot read
		probe := []string{r}
		for _, e := range entries {
			if e.IsDir() && e.Name() != ".git" {
				probe = append(probe, filepath.Join(r, e.Name()))
			}
		}
		for _, d := range probe {
			if slices.ContainsFunc(mountPoints, func(m string) bool { return Within(m, d) || m == filepath.Join(d, ".git") }) {
				continue
			}
			if _, links, err := resolvePath(filepath.Join(d, ".git", "config")); len(links) == 0 {
				found.block(err, "a repository's git metadata", reach, scan.found, seen)
			}
		}
	}
	home := homeDirs(owner)
	// scan.repos has the session directories' own repositories first.
	for _, repo := range scan.repos {
		budget := int64(configBudget)
		targets, notes := configTargets(repo, home, &budget)
		found.notes = append(found.notes, notes...)
		if len(targets) > maxConfigLooks {
			found.notes = append(found.notes, gitNote{repo.gitdir, fmt.Sprintf("the paths its config names: more than the %d paths sandboxd looks at for one repository", maxConfigLooks)})
			targets = targets[:maxConfigLooks]
		}
		placed := 0
		for _, t := range targets {
			found.place(t, reach, scan.found, mountPoints, seen, &placed)
		}
	}
	return found, nil
}

// place sorts target t into found: what lies where commands could write
// (in reach, not in the read-only metadata, not at or below one of
// mountPoints) and is there goes to conf, what is not to missing, what
// cannot be kept read-only to the notes. seen holds the paths already
// placed; *placed counts those of the repository t is of.
func (found *gitFound) place(t gitTarget, reach, meta, mountPoints []string, seen map[string]bool, placed *int) {
	p, links, err := resolvePath(t.path)
	if err != nil {
		if len(links) == 0 && found.block(err, "named by "+t.why+", "+t.path, reach, meta, seen) {
			return
		}
		if slices.ContainsFunc(reach, func(r string) bool { return Within(r, filepath.Clean(t.path)) }) {
			found.notes = append(found.notes, gitNote{t.path, fmt.Sprintf("named by %s, it could not be looked at: %v", t.why, err)})
		}
		return
	}
	root := slices.IndexFunc(reach, func(r string) bool { return Within(r, p) })
	if seen[p] || root < 0 ||
		slices.ContainsFunc(meta, func(m string) bool { return Within(m, p) }) ||
		slices.ContainsFunc(mountPoints, func(m string) bool { return m != reach[root] && Within(reach[root], m) && Within(m, p) }) {
		return
	}
	if *placed >= maxConfigTargets {
		found.notes = append(found.notes, gitNote{p, fmt.Sprintf("named by %s, beyond the %d paths of one repository's config sandboxd keeps read-only", t.why, maxConfigTargets)})
		return
	}
	seen[p] = true
	*placed++
	// A link that a command can change would lead git elsewhere.
	for _, l := range links {
		if slices.ContainsFunc(reach, func(r string) bool { return Within(r, l) }) && !slices.ContainsFunc(meta, func(m string) bool { return Within(m, l) }) {
			found.notes = append(found.notes, gitNote{p, fmt.Sprintf("named by %s through the link %s, which commands can point elsewhere", t.why, l)})
			break
		}
	}
	if r := slices.IndexFunc(reach, func(r string) bool { return Within(p, r) }); r >= 0 {
		found.notes = append(found.notes, gitNote{p, fmt.Sprintf("named by %s, it is or holds %s, which cannot be read-only", t.why, reach[r])})
		return
	}
	st, err := statEntryUnlinked(p)
	switch {
	case errors.Is(err, syscall.ENOENT):
		found.missing = append(found.missing, gitTarget{path: p, dir: t.dir, why: t.why})
	case err != nil:
		found.notes = append(found.notes, gitNote{p, fmt.Sprintf("named by %s, it could not be looked at: %v", t.why, err)})
	default:
		found.conf = append(found.conf, gitFile{p, uint64(st.Dev), st.Ino})
	}
}

// block keeps read-only whole the directory whose mode made a lookup in
// reach fail with err (EACCES, EPERM), unless it is one of reach itself
// or lies in the read-only metadata (meta), and reports whether it did.
// seen holds the paths already placed.
func (found *gitFound) block(err error, what string, reach, meta []string, seen map[string]bool) bool {
	var pe *fs.PathError
	if !errors.Is(err, syscall.EACCES) && !errors.Is(err, syscall.EPERM) || !errors.As(err, &pe) {
		return false
	}
	d := filepath.Dir(pe.Path)
	root := slices.IndexFunc(reach, func(r string) bool { return Within(r, d) })
	if root < 0 || d == reach[root] || slices.ContainsFunc(meta, func(m string) bool { return Within(m, d) }) {
		return false
	}
	if seen[d] {
		return true
	}
	if len(found.blocked) >= maxBlocked {
		found.notes = append(found.notes, gitNote{d, fmt.Sprintf("its mode keeps sandboxd from looking below it for %s, beyond the %d such directories kept read-only", what, maxBlocked)})
		return true
	}
	st, err := statEntryUnlinked(d)
	if err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return false
	}
	seen[d] = true
	found.conf = append(found.conf, gitFile{d, uint64(st.Dev), st.Ino})
	found.blocked = append(found.blocked, gitNote{d, what})
	return true
}

// maxLinkHops is how many links the kernel follows in one path.
const maxLinkHops = 40

// resolvePath follows the links in p, an absolute path, as the kernel does
// when it opens p (git a file its config names, the engine a mount's
// source), component by component, and returns where it leads, with each
// link it passed, in order. What of that does not exist is appended as
// written: something a command could make. A file in the way of the rest
// is where it leads: nothing can go on from there, but a command could
// put a directory in its place.
func resolvePath(p string) (string, []string, error) {
	rest := strings.Split(p, "/")
	cur := "/"
	var links []string
	for hops := 0; len(rest) > 0; {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, c)
		fi, err := os.Lstat(next)
		if errors.Is(err, fs.ErrNotExist) {
			return filepath.Join(append([]string{next}, rest...)...), links, nil
		}
		if err != nil {
			return "", links, err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			if !fi.IsDir() && slices.ContainsFunc(rest, func(c string) bool { return c != "" && c != "." }) {
				return cur, links, nil // a file in the way
			}
			continue
		}
		if hops++; hops > maxLinkHops {
			return "", links, fmt.Errorf("more than %d links on its way: %w", maxLinkHops, syscall.ELOOP)
		}
		links = append(links, next)
		to, err := os.Readlink(next)
		if err != nil {
			return "", links, err
		}
		if filepath.IsAbs(to) {
			cur = "/"
		}
		rest = append(strings.Split(to, "/"), rest...)
	}
	return cur, links, nil
}

// makeGitTarget makes t.path, which lies in root and is not there, empty:
// a directory when t.dir, else a file, with any directories missing on
// the way. It walks from root without following a link, and gives each
// the owner and group of the directory it is made in: nothing a command
// could not have made there itself.
func makeGitTarget(root string, t gitTarget) error {
	rel, err := filepath.Rel(root, t.path)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("%s lies outside %s", t.path, root)
	}
	fd, err := openUnlinked(root)
	if err != nil {
		return err
	}
	defer func() { unix.Close(fd) }()
	parts := strings.Split(rel, "/")
	for i, c := range parts {
		last := i == len(parts)-1
		var st unix.Stat_t
		if last && unix.Fstatat(fd, c, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			return nil // made meanwhile
		}
		next, err := unix.Openat(fd, c, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
			fd = next
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("%s: %w", c, err)
		}
		var parent unix.Stat_t
		if err := unix.Fstat(fd, &parent); err != nil {
			return err
		}
		if last && !t.dir {
			f, err := unix.Openat(fd, c, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
			if err != nil {
				return fmt.Errorf("%s: %w", c, err)
			}
			err = unix.Fchown(f, int(parent.Uid), int(parent.Gid))
			unix.Close(f)
			if err != nil && !errors.Is(err, unix.EPERM) {
				return fmt.Errorf("%s: %w", c, err)
			}
			return nil
		}
		if err := unix.Mkdirat(fd, c, 0o755); err != nil {
			return fmt.Errorf("%s: %w", c, err)
		}
		if err := unix.Fchownat(fd, c, int(parent.Uid), int(parent.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.EPERM) {
			return fmt.Errorf("%s: %w", c, err)
		}
		if last {
			return nil
		}
		next, err = unix.Openat(fd, c, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", c, err)
		}
		unix.Close(fd)
		fd = next
	}
	return nil
}
