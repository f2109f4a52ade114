package audit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// openNoLinks opens path with flags (O_NOFOLLOW and O_CLOEXEC added),
// refusing a symbolic link in any of its components: each directory is
// opened in the one before it, never through a link, so that no link
// planted on the way leads the file elsewhere.
func openNoLinks(path string, flags int, perm uint32) (*os.File, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	dir, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: "/", Err: err}
	}
	walked := ""
	for name := range strings.SplitSeq(strings.Trim(filepath.Dir(abs), "/"), "/") {
		if name == "" {
			continue
		}
		walked += "/" + name
		next, err := unix.Openat(dir, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(dir)
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			return nil, fmt.Errorf("%s: %s is a symbolic link or no directory: name the file by its real path", path, walked)
		}
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: walked, Err: err}
		}
		dir = next
	}
	fd, err := unix.Openat(dir, filepath.Base(abs), flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
	unix.Close(dir)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%s is a symbolic link: name the file by its real path", path)
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}
