package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

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
