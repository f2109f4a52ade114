package hostpath

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// CheckPrivate refuses path unless nobody but uid and root can change
// what it holds: path must be owned by uid or root and not writable by
// others, and each of its parents owned by uid or root and either not
// writable by others or sticky (otherwise another user could rename path
// away and put their own in its place). Group-writable is let be: with a
// private group per user and umask 002 (Debian's and Fedora's habit)
// everything a user makes is. It returns path absolute and with its links
// resolved, so that a link changed later does not matter.
func CheckPrivate(path string, uid int) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", err
	}
	if owner := Owner(fi); owner != uid && owner != 0 {
		return "", fmt.Errorf("refusing %s: owned by uid %d, not by uid %d", path, owner, uid)
	}
	if fi.Mode().Perm()&0o002 != 0 {
		return "", fmt.Errorf("refusing %s: writable by others (mode %04o)", path, fi.Mode().Perm())
	}
	for p := filepath.Dir(real); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return "", err
		}
		if owner := Owner(fi); owner != uid && owner != 0 {
			return "", fmt.Errorf("refusing %s: its parent %s is owned by uid %d, who could replace it", path, p, owner)
		}
		if fi.Mode().Perm()&0o002 != 0 && fi.Mode()&fs.ModeSticky == 0 {
			return "", fmt.Errorf("refusing %s: its parent %s is writable by others and not sticky (mode %04o), so they could replace it", path, p, fi.Mode().Perm())
		}
		if p == filepath.Dir(p) {
			return real, nil
		}
	}
}

// Owner is the uid owning a file; -1 when the system does not say.
func Owner(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}
