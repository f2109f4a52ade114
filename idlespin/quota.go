package idlespin

import (
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
	for _, line := range strings.Split(strings.TrimSpace(string(cgroups)), "\n") {
		// hierarchy-id:controllers:path
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var file string
		var m *mountinfo.Mount
		switch {
		case parts[0] == "0" && parts[1] == "":
			file, m = "cpu.max", findMount(mounts, func(m mountinfo.Mount) bool { return m.FSType == "cgroup2" })
		case slices.Contains(strings.Split(parts[1], ","), "cpu"):
			file, m = "cpu.cfs_quota_us", findMount(mounts, func(m mountinfo.Mount) bool {
				return m.FSType == "cgroup" && slices.Contains(strings.Split(m.Options, ","), "cpu")
			})
		default:
			continue
		}
		if m == nil {
			return "", fmt.Errorf("cannot tell whether cgroup %s has a CPU quota: its hierarchy is not mounted", parts[2])
		}
		rel, ok := within(parts[2], m.Root)
		if !ok {
			return "", fmt.Errorf("cannot tell whether cgroup %s has a CPU quota: it is outside %s, mounted at %s", parts[2], m.Root, m.Point)
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

// findMount returns the last mount that matches: a later one covers an
// earlier one at the same place.
func findMount(mounts []mountinfo.Mount, match func(mountinfo.Mount) bool) *mountinfo.Mount {
	for i := len(mounts) - 1; i >= 0; i-- {
		if match(mounts[i]) {
			return &mounts[i]
		}
	}
	return nil
}

// within returns p relative to root, as an absolute path, if p is root or
// below it.
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
