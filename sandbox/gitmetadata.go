package sandbox

import (
	"cmp"
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

// gitNote is something protect_git could not protect: path, a
// repository or a file of one, is to be treated as untrusted, and what
// says what was left unprotected there.
type gitNote struct{ path, what string }

// gitMetadataOf returns the git metadata that scanGit finds, and what it
// could not protect.
func gitMetadataOf(real, also, mountPoints []string) ([]string, []gitNote) {
	scan := scanGit(real, also, mountPoints)
	return scan.found, scan.notes
}

// gitScan is what scanGit finds.
type gitScan struct {
	found []string
	// repos are the repositories whose config host git reads there.
	repos []gitRepo
	notes []gitNote
}

// scanGit finds the git metadata in the session directories (real, links
// resolved) and in the directories right below them (a folder of
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
//
// A repository it cannot read whole (an index it cannot parse, more
// submodules or repositories than it protects) never fails the scan: what
// it could not protect is in the notes, for the log, since any of it
// may be a command's, planted to lock the workspace.
func scanGit(real, also, mountPoints []string) gitScan {
	var scan gitScan
	note := func(path, what string) { scan.notes = append(scan.notes, gitNote{path, what}) }
	in := append(slices.Clip(real), also...)
	add := func(p string) bool {
		if slices.Contains(scan.found, p) || !slices.ContainsFunc(in, func(r string) bool { return Within(r, p) }) || !unlinked(p, in) {
			return false
		}
		scan.found = append(scan.found, p)
		return true
	}
	// The session directories come first, and their submodules, so that
	// repositories a command made right below them cannot use up the
	// bounds before those are looked at.
	roots := slices.Clone(real)
	var nested []string
	for _, r := range real {
		repos, left := nestedRepositories(r, mountPoints)
		if len(left) > 0 {
			note(r, fmt.Sprintf("%d repositories right below it beyond the %d whose git metadata is mounted read-only, newest first: %s", len(left), maxNested, listSome(left)))
		}
		nested = append(nested, repos...)
	}
	fromIndex, indexBytes := 0, int64(indexBudget)
	for i := 0; i < len(roots) || nested != nil; i++ {
		if i == len(roots) {
			for _, n := range nested {
				if !slices.Contains(roots, n) { // a submodule of a session directory's too
					roots = append(roots, n)
				}
			}
			if nested = nil; i == len(roots) {
				break
			}
		}
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
		if gitdir != "" {
			scan.repos = append(scan.repos, gitRepo{gitdir: gitdir, common: common, worktree: r})
		}
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
			modules, err := submoduleRepos(d)
			if err != nil {
				note(filepath.Join(d, "modules"), fmt.Sprintf("the submodules beyond the first %d entries or %d levels (%v)", maxModuleDirs, maxModuleDepth, err))
			}
			for _, m := range modules {
				scan.repos = append(scan.repos, m)
				if m.worktree == "" || slices.Contains(mountPoints, m.worktree) {
					continue
				}
				if _, ok, err := gitMetadata(m.worktree); err == nil && ok {
					add(filepath.Join(m.worktree, ".git"))
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
			note(r, fmt.Sprintf("the submodules its index records: %v", err))
		}
		var left []string
		for _, l := range links {
			wt := filepath.Join(r, filepath.FromSlash(l))
			if slices.ContainsFunc(mountPoints, func(m string) bool { return m != r && Within(r, m) && Within(m, wt) }) || slices.Contains(roots, wt) {
				continue
			}
			if fromIndex >= maxModuleDirs {
				left = append(left, wt)
				continue
			}
			fromIndex++
			if _, ok, err := gitMetadata(wt); err == nil && ok {
				roots = append(roots, wt)
			} else if fi, err := os.Lstat(wt); err == nil && fi.IsDir() {
				add(wt)
			}
		}
		if len(left) > 0 {
			note(r, fmt.Sprintf("%d submodules its index records beyond the %d protected: %s", len(left), maxModuleDirs, listSome(left)))
		}
	}
	return scan
}

// listSome lists the first few of paths, and how many more there are.
func listSome(paths []string) string {
	const some = 5
	if len(paths) <= some {
		return strings.Join(paths, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(paths[:some], ", "), len(paths)-some)
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

// submoduleRepos returns the git directories of the submodules in
// gitdir's modules directory, nested ones too, each with its working tree
// (core.worktree, relative to it; "" for none). A module's name may hold
// slashes, which make directories of their own. Beyond the bounds it
// returns what it found before, and an error.
func submoduleRepos(gitdir string) ([]gitRepo, error) {
	var repos []gitRepo
	seen := 0
	var walk func(dir string, depth int) error
	walk = func(dir string, depth int) error {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil
		}
		if depth > maxModuleDepth || seen+len(entries) > maxModuleDirs {
			return fmt.Errorf("%s holds more than sandboxd looks at", dir)
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
			m := gitRepo{gitdir: d}
			if wt := gitConfigValue(filepath.Join(d, "config"), "core", "worktree"); wt != "" {
				if !filepath.IsAbs(wt) {
					wt = filepath.Join(d, wt)
				}
				m.worktree = filepath.Clean(wt)
			}
			repos = append(repos, m)
			if err := walk(filepath.Join(d, "modules"), depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	err := walk(filepath.Join(gitdir, "modules"), 0)
	return repos, err
}

// maxNested bounds the repositories protected right below a session
// directory: each costs two mounts.
const maxNested = 256

// nestedRepositories returns the directories right below dir that hold a
// .git (not links, and not host mount points), oldest first, at most
// maxNested; left are the rest. Oldest is by the birth time of the .git,
// which no command can set: a command that makes many repositories to
// crowd out the person's gets only its own left out. Without birth
// times, by name.
func nestedRepositories(dir string, mountPoints []string) (repos, left []string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil // the session's start reports a directory it cannot read
	}
	born := map[string]int64{}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if !e.IsDir() || e.Name() == ".git" || slices.ContainsFunc(mountPoints, func(m string) bool { return m == p || m == filepath.Join(p, ".git") }) {
			continue
		}
		if _, ok, err := gitMetadata(p); err == nil && ok {
			repos = append(repos, p)
			var st unix.Statx_t
			if unix.Statx(unix.AT_FDCWD, filepath.Join(p, ".git"), unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BTIME, &st) == nil && st.Mask&unix.STATX_BTIME != 0 {
				born[p] = st.Btime.Sec*1e9 + int64(st.Btime.Nsec)
			}
		}
	}
	if len(repos) <= maxNested {
		return repos, nil
	}
	if len(born) == len(repos) {
		slices.SortStableFunc(repos, func(a, b string) int { return cmp.Compare(born[a], born[b]) })
	}
	left = slices.Clone(repos[maxNested:])
	slices.Reverse(left)
	repos = repos[:maxNested]
	slices.Sort(repos)
	return repos, left
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

// gitConfigValue returns key's value in section (no subsection) of a git
// config file, the last one set, or "": what git reads there, includes
// aside.
func gitConfigValue(file, section, key string) string {
	var value string
	for _, v := range parseGitConfig(readSmallFile(file, 64<<10)) {
		if v.section == section && v.subsection == "" && v.key == key {
			value = v.value
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
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size <= 0 {
		return nil
	}
	b := make([]byte, min(int64(max), st.Size))
	n, err := unix.Read(fd, b)
	if err != nil || n <= 0 {
		return nil
	}
	return b[:n]
}
