package idlespin

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/mountinfo"
)

// cpuQuota returns the first cgroup, from the process's own up to the top
// this process sees, that has a CPU quota, or "" if none has. It reads
// proc/self/cgroup and proc/self/mountinfo from fsys, and the cgroup
// files where mountinfo says their hierarchy is mounted. It fails where it
// cannot tell: no mount of a hierarchy, or a cgroup outside its mount's
// root. A quota set above this process's cgroup namespace it cannot see.
func cpuQuota(fsys fs.FS) (string, error) {
	cgroups, err := fs.ReadFile(fsys, "proc/self/cgroup")
	if err != nil {
		return "", err
	}
	table, err := fs.ReadFile(fsys, "proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	mounts := mountinfo.Parse(table)
	var lines [][]string
	cpuOnV1 := false
	for _, line := range strings.Split(strings.TrimSpace(string(cgroups)), "\n") {
		// hierarchy-id:controllers:path
		if parts := strings.SplitN(line, ":", 3); len(parts) == 3 {
			lines = append(lines, parts)
			cpuOnV1 = cpuOnV1 || parts[0] != "0" && slices.Contains(strings.Split(parts[1], ","), "cpu")
		}
	}
	for _, parts := range lines {
		var file string
		var match func(mountinfo.Mount) bool
		switch {
		case parts[0] == "0" && parts[1] == "":
			if cpuOnV1 {
				// The cpu controller is on one hierarchy only; the
				// unified one may not even be mounted here.
				continue
			}
			file, match = "cpu.max", func(m mountinfo.Mount) bool { return m.FSType == "cgroup2" }
		case slices.Contains(strings.Split(parts[1], ","), "cpu"):
			file, match = "cpu.cfs_quota_us", func(m mountinfo.Mount) bool {
				return m.FSType == "cgroup" && slices.Contains(strings.Split(m.Options, ","), "cpu")
			}
		default:
			continue
		}
		m, rel, err := mountOf(mounts, match, parts[2])
		if err != nil {
			return "", fmt.Errorf("cannot tell whether cgroup %s has a CPU quota: %w", parts[2], err)
		}
		for dir := rel; ; dir = path.Dir(dir) {
			// The root of a hierarchy has no cpu.max.
			if v, err := fs.ReadFile(fsys, strings.TrimPrefix(path.Join(m.Point, dir, file), "/")); err == nil && limited(strings.TrimSpace(string(v))) {
				return path.Join(m.Root, dir), nil
			}
			if dir == "/" {
				break
			}
		}
	}
	return "", nil
}

// mountOf returns the mount of a hierarchy (those match takes) that holds
// cgroup, the last one listed where several do (a later mount covers an
// earlier one), and the cgroup's path within it.
func mountOf(mounts []mountinfo.Mount, match func(mountinfo.Mount) bool, cgroup string) (mountinfo.Mount, string, error) {
	found := false
	for i := len(mounts) - 1; i >= 0; i-- {
		if !match(mounts[i]) {
			continue
		}
		found = true
		if rel, ok := within(cgroup, mounts[i].Root); ok {
			return mounts[i], rel, nil
		}
	}
	if !found {
		return mountinfo.Mount{}, "", errors.New("its hierarchy is not mounted")
	}
	return mountinfo.Mount{}, "", errors.New("it is outside every mount of its hierarchy")
}

// within returns p relative to root, as an absolute path, if p is root or
// below it: sandbox.Within and the path below, for a package that does
// not import sandbox (and with it the engine's client).
func within(p, root string) (string, bool) {
	if p != path.Clean(p) || !path.IsAbs(p) {
		return "", false // "/../..": outside the namespace's root
	}
	if root == "/" {
		return p, true
	}
	if p == root {
		return "/", true
	}
	if rest, ok := strings.CutPrefix(p, root+"/"); ok {
		return "/" + rest, true
	}
	return "", false
}

// limited reads a cpu.max ("max 100000" or "50000 100000") or a
// cpu.cfs_quota_us ("-1" or "50000").
func limited(v string) bool {
	quota, _, _ := strings.Cut(v, " ")
	return quota != "" && quota != "max" && quota != "-1"
}
