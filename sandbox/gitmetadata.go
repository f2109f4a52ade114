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
