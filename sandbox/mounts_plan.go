package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/moby/moby/api/types/mount"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/mountinfo"
)

// bind is a directory the container mounts: source on the host, links
// resolved, at target.
type bind struct{ source, target string }

// planBinds pairs each target with its resolved source (sources[i], on
// device devs[i]) and leaves out a target that lies inside another, which
// the outer mount shows already. A nested target that resolves elsewhere
// is refused; one on a filesystem of its own is mounted after all.
func planBinds(targets, sources []string, devs []uint64) ([]bind, error) {
	binds := make([]bind, 0, len(targets))
	for i, t := range targets {
		shown := false
		// The engine would find a nested target through the outer mount,
		// that is through a host directory that other sandboxes may
		// write, and a link put there at the right moment would land the
		// mount anywhere in the container, where the check from inside
		// does not look.
		for j, o := range targets {
			if i == j || !Within(o, t) || t == o && j > i {
				continue
			}
			// The outer mount shows the nested directory only when its
			// source is the outer source's own subdirectory; one that
			// resolves elsewhere cannot be shown safely.
			rel, err := filepath.Rel(o, t)
			if err != nil || sources[i] != filepath.Join(sources[j], rel) {
				return nil, fmt.Errorf("%w: workspace: %q lies inside %q, which is mounted too, but resolves to %s; name it by that path or leave it out", ErrInvalid, t, o, sources[i])
			}
			// On a filesystem of its own (devs differ) the outer mount,
			// not recursive, shows only the directory under it: mounted
			// after all, and checked from inside like any other.
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

// coverHostMounts covers, in the container, each filesystem mounted on the
// host below the sources of binds and granted (their links resolved;
// mountPoints, as the host's mountinfo lists them), which the mounts, not
// recursive, do not show: a directory with an empty read-only tmpfs, a
// file (isDir tells) with /dev/null, read-only. A place where another mount
// shows its own (a session directory of its own, a grant inside the
// workspace) is not covered. It returns the host paths covered and the
// mounts.
func coverHostMounts(binds []bind, granted []Mount, mountPoints []string, isDir func(string) bool) ([]string, []mount.Mount) {
	// Stacked mounts list a place more than once: it is covered once.
	mountPoints = slices.Compact(slices.Sorted(slices.Values(mountPoints)))
	binds = slices.Clip(binds)
	// A granted mount is covered whatever its mode, as the workspace is:
	// what the container shows below a mount does not depend on what may
	// be written there.
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
			// Without a cover the directory there would be a plain
			// directory inside, and a command's rmdir or rename of it would
			// detach or move the host's own mount: the kernel refuses that
			// only for a mount point of the container's own table.
			hosts = append(hosts, p)
			// The host binds files too (/etc/hosts in a container of its
			// own), where a tmpfs cannot go.
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
