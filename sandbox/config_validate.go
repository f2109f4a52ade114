package sandbox

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/distribution/reference"

	"github.com/sandboxd/sandboxd/internal/egress"
	"github.com/sandboxd/sandboxd/limits"
)

var uidGID = regexp.MustCompile(`^[0-9]+:[0-9]+$`)

// maxUserID is the largest uid or gid the engine runs a process as (it
// refuses more, at every container start or exec).
const maxUserID = math.MaxInt32

// imageID is an image's full id, which the engine takes where a reference
// goes but a reference cannot be.
var imageID = regexp.MustCompile(`^(sha256:)?[0-9a-f]{64}$`)

func (c Config) validate(file, text string, hostCPUs int) error {
	bad := func(key string, format string, args ...any) error {
		return &ConfigError{File: file, Line: keyLine(text, key), Key: key, Err: fmt.Errorf(format, args...)}
	}
	s := c.Session
	if strings.TrimSpace(s.Image) == "" {
		return bad("session.image", "must name an image, not be empty or blank")
	}
	for _, ref := range append([]string{s.Image}, s.Images...) {
		// As the engine reads a reference: one it would refuse is
		// said now, not when a peer asks for it.
		if imageID.MatchString(ref) {
			continue
		}
		if _, err := reference.ParseNormalizedNamed(ref); err != nil {
			key := "session.images"
			if ref == s.Image {
				key = "session.image"
			}
			return bad(key, "%.200q is not an image reference: %v", ref, err)
		}
	}
	if err := s.Limits().Validate(hostCPUs); err != nil {
		return bad("session."+limitField(err), "%v", err)
	}
	if err := s.MaxLimits().Validate(hostCPUs); err != nil {
		return bad("session.max."+limitField(err), "%v", err)
	}
	// A kill lends the container killHeadroom pids above its limit
	// (lendPids), and the kernel takes no pids.max above limits.MaxPids:
	// a limit nearer than that would fail every kill of a fork bomb.
	for _, k := range []struct {
		key  string
		pids Pids
	}{{"session.pids", s.Pids}, {"session.max.pids", s.Max.Pids}} {
		if int64(k.pids) > limits.MaxPids-killHeadroom {
			return bad(k.key, "%d is above %d: the kernel takes a pids limit of at most %d, and a kill borrows %d above it", k.pids, limits.MaxPids-killHeadroom, limits.MaxPids, killHeadroom)
		}
	}
	if err := s.Limits().Within(s.MaxLimits()); err != nil {
		// Blamed on what the file set: the default, or else the maximum
		// it lowered below the embedded default.
		key := "session." + limitField(err)
		_, set := findKey(text, key)
		if _, maxSet := findKey(text, "session.max."+limitField(err)); !set && maxSet {
			key = "session.max." + limitField(err)
		}
		return bad(key, "%v", err)
	}
	if s.Network == "" || s.Network == "host" || strings.HasPrefix(s.Network, "container:") {
		return bad("session.network", "%q is not allowed: use \"none\" or a Docker network name", s.Network)
	}
	for _, key := range []struct{ name, v string }{{"session.user", s.User}, {"session.fallback_user", s.FallbackUser}} {
		if key.v == "" && key.name == "session.user" {
			continue
		}
		if !uidGID.MatchString(key.v) {
			return bad(key.name, "%q must be written as uid:gid, e.g. \"1000:1000\"", key.v)
		}
		uid, gid, _ := strings.Cut(key.v, ":")
		u, uerr := strconv.ParseUint(uid, 10, 64)
		g, gerr := strconv.ParseUint(gid, 10, 64)
		if uerr != nil || gerr != nil || u > maxUserID || g > maxUserID {
			return bad(key.name, "%q: uid and gid must each be at most %d (2^31-1), the largest the Docker Engine runs a process as", key.v, maxUserID)
		}
		// Checked as a number: "00:0" is root too.
		if u == 0 {
			return bad(key.name, "uid 0 (root) is never used inside a sandbox")
		}
		// Root's group may write what root owns group-writable, in the
		// workspace and the mounts.
		if g == 0 {
			return bad(key.name, "gid 0 (root's group) is never used inside a sandbox")
		}
	}
	if s.Workspace != "" && !filepath.IsAbs(s.Workspace) {
		return bad("session.workspace", "%q must be an absolute path", s.Workspace)
	}
	if s.WorkspaceMode != "rw" && s.WorkspaceMode != "ro" {
		return bad("session.workspace_mode", "%q must be \"rw\" or \"ro\"", s.WorkspaceMode)
	}
	if err := validateScratch(s.Scratch); err != nil {
		return bad("session.scratch", "%v", err)
	}
	if err := validateMounts(s.Mounts, s.Scratch); err != nil {
		return bad("session.mounts", "%v", err)
	}
	for _, name := range s.CapDrop {
		if !isCapability(name) {
			return bad("session.cap_drop", "%q is not a Linux capability (e.g. \"NET_RAW\" or \"CAP_NET_RAW\"), nor \"ALL\"", name)
		}
	}
	t := c.Terminal
	if time.Duration(t.KillGrace) > maxKillGrace {
		return bad("terminal.kill_grace", "%s is above the maximum of %s", time.Duration(t.KillGrace), maxKillGrace)
	}
	if t.OutputByteLimit > t.MaxOutputByteLimit {
		return bad("terminal.output_byte_limit", "%s is above max_output_byte_limit %s", t.OutputByteLimit, t.MaxOutputByteLimit)
	}
	if t.MaxOutputByteLimit > 1<<30 {
		return bad("terminal.max_output_byte_limit", "%s is above the 1GiB a terminal may hold", t.MaxOutputByteLimit)
	}
	if c.Server.MaxOutputMemory < t.MaxOutputByteLimit {
		return bad("server.max_output_memory", "%s is below terminal.max_output_byte_limit %s", c.Server.MaxOutputMemory, t.MaxOutputByteLimit)
	}
	if _, err := egress.ParseAllowlist(c.Egress.Allow); err != nil {
		return bad("egress.allow", "%v", err)
	}
	if c.Audit.File != "" && strings.TrimSpace(c.Audit.File) == "" {
		return bad("audit.file", "%q is blank: leave it out for no audit log", c.Audit.File)
	}
	return nil
}

// maxKillGrace bounds how long a kill, and so a shutdown, waits for a
// command to end after SIGTERM.
const maxKillGrace = 5 * time.Minute

// validateScratch refuses scratch paths the engine would mount twice, or
// that checkContainerPath refuses.
func validateScratch(paths []string) error {
	seen := make(map[string]string, len(paths))
	for _, p := range paths {
		if err := checkContainerPath(p); err != nil {
			return err
		}
		clean := filepath.Clean(p)
		if first, ok := seen[clean]; ok {
			return fmt.Errorf("%q and %q are the same path", first, p)
		}
		seen[clean] = p
	}
	return nil
}

// validateMounts refuses mounts whose source is not an absolute path,
// whose target checkContainerPath refuses, or whose target is a scratch
// path's tmpfs.
func validateMounts(mounts []Mount, scratch []string) error {
	targets := make(map[string]string, len(mounts))
	for _, m := range mounts {
		if !filepath.IsAbs(m.Source) || strings.ContainsRune(m.Source, 0) {
			return fmt.Errorf("source %q must be an absolute path (without a NUL byte)", m.Source)
		}
		if err := checkContainerPath(m.Target); err != nil {
			return fmt.Errorf("target of %q: %w", m.Source, err)
		}
		target := filepath.Clean(m.Target)
		if first, ok := targets[target]; ok {
			// Else every session's start would be refused.
			return fmt.Errorf("targets %q and %q are the same path: one mount there at most", first, m.Target)
		}
		targets[target] = m.Target
		for _, p := range scratch {
			if filepath.Clean(p) == target {
				return fmt.Errorf("target %q is also a scratch path (session.scratch): drop it from one of them", m.Target)
			}
		}
		if m.Mode != "ro" && m.Mode != "rw" && m.Mode != "" {
			return fmt.Errorf("mode %q must be \"rw\" or \"ro\"", m.Mode)
		}
	}
	return nil
}

// checkContainerPath refuses a place in the container where sandboxd
// would mount something (a scratch tmpfs, a granted mount) that the
// engine would refuse at every start, or that would hide what the
// container itself needs: a relative path, one with a NUL byte (no path
// has one), the container's root, and the /proc, /sys and /dev the
// engine provides.
func checkContainerPath(p string) error {
	if strings.ContainsRune(p, 0) {
		return fmt.Errorf("%q holds a NUL byte, which no path can", p)
	}
	if !filepath.IsAbs(p) {
		return fmt.Errorf("%q must be an absolute path", p)
	}
	clean := filepath.Clean(p)
	if clean == "/" {
		return fmt.Errorf("%q must not be /, the container's root", p)
	}
	for _, sys := range []string{"/proc", "/sys", "/dev"} {
		if Within(sys, clean) {
			return fmt.Errorf("%q is under %s, which the engine provides", p, sys)
		}
	}
	return nil
}

// isCapability accepts what the engine does: "ALL", or a Linux capability
// name (up to Linux 6.x) in any case, with or without "CAP_".
func isCapability(name string) bool {
	known := []string{
		"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL",
		"SETGID", "SETUID", "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE",
		"NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
		"SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
		"SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME",
		"SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL",
		"SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM",
		"BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
	}
	n := strings.ToUpper(name)
	return n == "ALL" || slices.Contains(known, strings.TrimPrefix(n, "CAP_"))
}

// limitField names the limits field an error from package limits is about.
func limitField(err error) string {
	msg := err.Error()
	for _, f := range []string{"cpus", "memory", "pids"} {
		if strings.Contains(msg, f) {
			return f
		}
	}
	return "limits"
}

// checkSources refuses, at start, a configuration whose served workspace
// is or holds one of sandboxd's own endpoints (Private), or a granted
// mount source that checkGrant refuses: every session would be refused,
// or would see it. A path that does not resolve is left to a session's
// start to report.
func (c Config) checkSources(engineSocket string) error {
	if !c.FallbackWorkspace {
		ws, err := c.ServedWorkspace()
		if err != nil {
			return err
		}
		if _, err := filepath.EvalSymlinks(ws); err == nil {
			if _, err := checkMountSource(ws, engineSocket, c.Private); err != nil {
				if c.Session.Workspace == "" {
					// The directory sandboxd runs in: no setting.
					return errors.New(Reason(err))
				}
				return c.settingError("session.workspace", "workspace", err)
			}
		}
	}
	for _, mt := range c.Session.Mounts {
		if real, err := filepath.EvalSymlinks(mt.Source); err == nil {
			if err := checkGrant(mt.origin(), mt.Source, real, engineSocket, c.Private); err != nil {
				if mt.Origin != "" {
					return errors.New(Reason(err))
				}
				return c.settingError("session.mounts", "session.mounts", err)
			}
		}
	}
	return nil
}

// checkMemoryBudget refuses, at start, a configuration whose sessions
// could not open with their default memory on this host.
func checkMemoryBudget(cfg Config, hostMemory int64) error {
	mem := int64(cfg.Session.Memory)
	budget := cfg.Server.MemoryBudget.Of(hostMemory)
	switch {
	case hostMemory > 0 && mem > hostMemory:
		return cfg.settingError("session.memory", "", fmt.Errorf("%s is more than the %s of memory the engine's host has", roundBytes(mem), roundBytes(hostMemory)))
	case budget > 0 && mem > budget:
		return cfg.settingError("session.memory", "", fmt.Errorf("%s is more than the memory budget of %s: no session could open with it; lower it, or raise the budget", roundBytes(mem), budgetText(cfg.Server.MemoryBudget, hostMemory)))
	}
	return nil
}

// settingError words err, which a session's start would give as a
// refused request about what ("workspace: ..."), as the fault of a setting
// of the configuration, found at sandboxd's start: the file, the line, the
// key.
func (c Config) settingError(key, what string, err error) error {
	msg := Reason(err)
	msg = strings.TrimPrefix(msg, what+": ")
	file := c.file
	if file == "" {
		file = "configuration"
	}
	return &ConfigError{File: file, Line: keyLine(c.text, key), Key: key, Err: errors.New(msg)}
}

// keyLine finds the line where a dotted key is set, for messages about
// settings the TOML decoder gives no position for: the line that sets it,
// or else the one that sets the nearest table or inline table holding it
// (a member of an inline table, a key below an unknown table). Keys may
// be dotted and quoted, and tables opened by [header] or [[header]].
func keyLine(text, key string) int {
	line, _ := findKey(text, key)
	return line
}

// findKey is keyLine that also tells whether the line found sets key
// itself.
func findKey(text, key string) (line int, exact bool) {
	want := strings.Split(key, ".")
	best, bestLen := 0, 0
	table := []string(nil)
	for i, line := range strings.Split(text, "\n") {
		l := strings.TrimSpace(line)
		var path []string
		if strings.HasPrefix(l, "[") {
			header, _, _ := strings.Cut(l, "#")
			table = keyParts(strings.Trim(strings.TrimSpace(header), "[] "))
			path = table
		} else if name, _, ok := strings.Cut(l, "="); ok && !strings.HasPrefix(l, "#") {
			path = append(slices.Clip(table), keyParts(name)...)
		} else {
			continue
		}
		n := 0
		for n < len(path) && n < len(want) && path[n] == want[n] {
			n++
		}
		if n == len(path) && n == len(want) {
			return i + 1, true
		}
		if n == len(path) && n > bestLen {
			best, bestLen = i+1, n
		}
	}
	return best, false
}

// keyParts splits a TOML key as written (dotted, parts maybe quoted) into
// its parts.
func keyParts(key string) []string {
	var parts []string
	for _, p := range strings.Split(key, ".") {
		parts = append(parts, strings.Trim(strings.TrimSpace(p), `"'`))
	}
	return parts
}
