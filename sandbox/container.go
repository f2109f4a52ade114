package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"

	"github.com/sandboxd/sandboxd/internal/engine"

	"github.com/sandboxd/sandboxd/limits"
)

func (s *Session) start(ctx context.Context) error {
	m := s.m
	spec, err := ValidateSpec(m.cfg, m.hostCPUs, s.spec)
	if err != nil {
		return fmt.Errorf("open session %s: %w", s.ID, err)
	}
	s.spec = spec
	for _, d := range spec.ExtraDirs {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return fmt.Errorf("open session %s: %w: additionalDirectories: %.200q is not a directory", s.ID, ErrInvalid, d)
		}
	}
	// Each source is checked, then its device and inode are read from the
	// very directory checked (no link followed), and the started container
	// must show the same there: a sandboxed command that can write above
	// a source could otherwise swap it for a link between the check and
	// the engine's mount, and so can a sandbox of another sandboxd.
	var checks []mountCheck
	real := make([]string, 0, 1+len(spec.ExtraDirs))
	var owner *syscall.Stat_t
	for _, d := range append([]string{spec.Workspace}, spec.ExtraDirs...) {
		if err := m.refusePlantedLinks(s, d); err != nil {
			return fmt.Errorf("open session %s: %w", s.ID, err)
		}
		r, err := checkMountSource(d, m.engineSocket(), m.cfg.Private)
		if err != nil {
			return fmt.Errorf("open session %s: %w", s.ID, err)
		}
		st, err := statUnlinked(r)
		if err != nil {
			return fmt.Errorf("open session %s: %w: workspace: %q changed while it was checked: %v", s.ID, ErrInvalid, d, err)
		}
		if owner == nil {
			owner = &st
		}
		real = append(real, r)
		checks = append(checks, mountCheck{target: d, dev: uint64(st.Dev), ino: st.Ino, known: m.writableByAnother(s, r)})
	}
	user := sessionUser(m.cfg.Session, owner)
	if m.cfg.Session.User == "" && user == m.cfg.Session.FallbackUser {
		// Warned, since commands then cannot write the workspace, which
		// would look like a fault of the sandbox.
		m.log.Warn("the workspace is root's (or an owner the engine cannot run as): commands run as session.fallback_user and cannot write it unless it lets them; set session.user, or chown the directory",
			"session", s.ID, "workspace", spec.Workspace, "user", user)
	}
	s.mu.Lock()
	s.mountSources = real
	s.mu.Unlock()
	s.user = user
	devs := make([]uint64, len(checks))
	for i, c := range checks {
		devs[i] = c.dev
	}
	binds, err := planBinds(append([]string{spec.Workspace}, spec.ExtraDirs...), real, devs)
	if err != nil {
		return fmt.Errorf("open session %s: %w", s.ID, err)
	}
	for i := range checks {
		checks[i].mountPoint = slices.ContainsFunc(binds, func(b bind) bool { return b.target == checks[i].target })
	}
	sc := m.cfg.Session
	var granted []mountCheck
	if sc.Mounts, granted, err = s.grantedMounts(); err != nil {
		return fmt.Errorf("open session %s: %w", s.ID, err)
	}
	checks = append(checks, granted...)
	covered, covers := coverHostMounts(binds, sc.Mounts, hostMountPoints(), mountPointIsDir)
	if len(covered) > 0 {
		// What the container shows empty, so that a missing tool or
		// file can be told from a broken grant.
		m.log.Info("host filesystems below the session's mounts are shown empty; mount one by its own path to show it", "session", s.ID, "covered", covered)
	}
	protected, gitChecks, err := s.protectGit(real, binds, sc.Mounts, covered)
	if err != nil {
		return fmt.Errorf("open session %s: %w", s.ID, err)
	}
	protected = append(covers, protected...)
	protected = append(protected, m.cfg.Gateway.mounts()...)
	checks = append(checks, gitChecks...)
	own := user
	if m.keeper {
		own = keeperUser(user)
	}
	cfg, hostCfg := containerConfig(sc, spec, binds, protected, own, m.instance.Labels(s.ID))
	if g := m.cfg.Gateway; g != nil {
		cfg.Entrypoint, cfg.Env = g.entrypoint(), append(cfg.Env, g.env()...)
	}
	if err := distinctTargets(hostCfg.Mounts); err != nil {
		return fmt.Errorf("open session %s: %w", s.ID, err)
	}
	var coverTargets []string
	for _, c := range covers {
		coverTargets = append(coverTargets, c.Target)
	}
	name := "sandboxd-" + m.instance.ID + "-" + containerSafe(s.ID)
	suffix, err := randomID(3)
	if err != nil {
		return err
	}
	// The engine goes on with a create or start whose caller gave up,
	// and a container made that way would be nobody's: the session sees
	// both through (a close meanwhile removes it).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	created, err := m.cli.ContainerCreate(ctx, engine.ContainerCreateOptions{
		Config:     cfg,
		HostConfig: hostCfg,
		Name:       name + "-" + suffix,
	})
	if err != nil {
		if engine.IsNotFound(err) {
			return fmt.Errorf("open session %s: image %s is missing: build it with `sandboxd image build` (or load it with `docker load`): %w", s.ID, spec.Image, err)
		}
		m.removeMade(name + "-" + suffix)
		return fmt.Errorf("open session %s: create container: %w", s.ID, engine.Error(err))
	}
	for _, w := range created.Warnings {
		// What the engine dropped of the container asked for (a limit
		// its kernel cannot enforce) it says only here.
		m.log.Warn("the engine changed the session's container", "session", s.ID, "warning", w)
	}
	s.mu.Lock()
	closed := s.closed
	s.contID = created.ID
	s.mu.Unlock()
	// fail removes the container of a start that cannot go on. A close
	// that came meanwhile (Close found no container to remove before
	// the lines above, or removed it under the start after them) is
	// what failed it, and said so, for a caller that opens the session
	// again.
	fail := func(err error) error {
		m.discard(s)
		if s.isClosed() {
			return fmt.Errorf("open session %s: %w: closed while it started", s.ID, ErrNotFound)
		}
		return err
	}
	if closed {
		return fail(nil)
	}
	if _, err := m.cli.ContainerStart(ctx, created.ID, engine.ContainerStartOptions{}); err != nil {
		return fail(fmt.Errorf("open session %s: start container: %w", s.ID, engine.Error(err)))
	}
	if err := s.verifyMounts(ctx, checks, coverTargets); err != nil {
		if why := s.stopped(ctx, created.ID); why != nil {
			err = why
		}
		return fail(fmt.Errorf("open session %s: %w", s.ID, err))
	}
	m.log.Info("session opened", "session", s.ID, "container", created.ID[:12], "workspace", spec.Workspace, "user", user,
		"cpus", spec.Limits.CPUs, "memory", limits.FormatBytes(spec.Limits.Memory), "pids", spec.Limits.Pids)
	return nil
}

// stopped says why container id is not running, or nil when it is. The
// engine starts a container whose init cannot run its command (an image
// without sleep) as if it had started; only the exec made next fails, with
// an error that does not say why.
func (s *Session) stopped(ctx context.Context, id string) error {
	c, err := s.m.cli.ContainerInspect(ctx, id, engine.ContainerInspectOptions{})
	if err != nil || c.Container.State == nil || c.Container.State.Running {
		return nil
	}
	st := c.Container.State
	why := st.Error
	if why == "" {
		why = s.lastLogLines(ctx, id)
	}
	hint := ""
	if st.ExitCode == 127 {
		hint = fmt.Sprintf("; the container runs `sleep infinity` as its main process, so the image %s needs sleep in its PATH", s.spec.Image)
	}
	return fmt.Errorf("the container stopped as it started, exit code %d: %s%s", st.ExitCode, why, hint)
}

// lastLogLines is the end of what a container wrote, cut short: it goes
// into an error message.
func (s *Session) lastLogLines(ctx context.Context, id string) string {
	logs, err := s.m.cli.ContainerLogs(ctx, id, engine.ContainerLogsOptions{ShowStdout: true, ShowStderr: true, Tail: "3"})
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer logs.Close()
	var out bytes.Buffer
	// A cut frame ends the copy with an error; what came before it is
	// what is wanted.
	stdcopy.StdCopy(&out, &out, io.LimitReader(logs, 2048))
	return strings.Join(strings.Fields(strings.ToValidUTF8(out.String(), "?")), " ")
}

// keeper is the user the container's own processes run as: an id no
// configuration is likely to give commands (the engine takes ids up to
// maxUserID). An engine that maps ids (userns-remap, rootless) has no
// such id to give (Manager.keeper): there they are the commands' own.
const keeper = maxUserID - 1

// keeperUser is the user of the container's own processes in a session
// whose commands run as user: the keeper, unless that is user's uid, when
// they stay the commands' own.
func keeperUser(user string) string {
	if uid, _, _ := strings.Cut(user, ":"); strings.TrimLeft(uid, "0") == strconv.Itoa(keeper) {
		return user
	}
	return fmt.Sprintf("%d:%d", keeper, keeper)
}

// containerConfig is the hardened container of DESIGN.md: no network, no
// capabilities, no privilege gain, read-only root, init, limits, a non-root
// user, and no host path but the workspace and what the config grants.
//
// binds are the workspace and extra directories, their sources with links
// resolved, as checked: what the engine mounts, so that no link it would
// follow is one that was not checked. more are mounted over them.
func containerConfig(c SessionConfig, spec SessionSpec, binds []bind, more []mount.Mount, own string, labels map[string]string) (*container.Config, *container.HostConfig) {
	cfg := &container.Config{
		Image: spec.Image,
		// The image's own entrypoint (a tool's image runs the tool) would
		// take the sleep as its arguments, and the container would end.
		Entrypoint: []string{"sleep", "infinity"},
		// The container's own processes (its init, the sleep that keeps
		// it up) run as own, not as the commands' user where the engine
		// lets them: a command that signals whatever its user may (`kill
		// -9 -1`) would stop the container, and every command of the
		// session after it would fail. Every exec names the session's
		// user.
		User: own,
		// The keeper may not enter the workspace, whose owner may keep
		// others out; every exec names its own directory.
		WorkingDir: "/",
		// PATH is the image's (a toolchain's image adds its own bin), or
		// the engine's default where the image sets none.
		Env:      []string{"HOME=/tmp"},
		Labels:   labels,
		Hostname: "sandbox",
	}
	tmpfs := make(map[string]string, len(c.Scratch))
scratch:
	for _, p := range c.Scratch {
		// A workspace at or above a scratch path (`cd /tmp && sandboxd
		// run ...`) is that place already (writable unless the workspace
		// is mounted read-only): a tmpfs there would hide it.
		for _, b := range binds {
			if Within(b.target, p) {
				continue scratch
			}
		}
		// exec: toolchains run what they build in /tmp; the workspace is
		// executable anyway, so noexec would protect nothing.
		tmpfs[p] = fmt.Sprintf("rw,exec,nosuid,nodev,size=%d,mode=1777", int64(c.ScratchSize))
	}
	var mounts []mount.Mount
	for _, b := range binds {
		mounts = append(mounts, bindMount(b.source, b.target, c.WorkspaceMode))
	}
	mounts = append(mounts, more...)
	for _, mt := range c.Mounts {
		mounts = append(mounts, bindMount(mt.Source, mt.Target, mt.Mode))
	}
	var secOpt []string
	if c.NoNewPrivileges {
		secOpt = append(secOpt, "no-new-privileges")
	}
	if c.RefuseSetid {
		secOpt = append(secOpt, setidSecurityOpt())
	}
	init := c.Init
	host := &container.HostConfig{
		NetworkMode:    container.NetworkMode(spec.Network),
		CapDrop:        c.CapDrop,
		SecurityOpt:    secOpt,
		ReadonlyRootfs: c.ReadonlyRootfs,
		Tmpfs:          tmpfs,
		Init:           &init,
		Mounts:         mounts,
		Resources:      spec.Limits.Engine(),
		IpcMode:        "private",
		// The container's own cgroup, not the host's hierarchy and the
		// container's id (cgroup v1 defaults to the host's).
		CgroupnsMode: container.CgroupnsModePrivate,
		// On an engine that maps ids pid 1 runs as the session's user,
		// so a command can write to the container's log (/proc/1/fd/1);
		// on an engine without log limits that would fill the host's
		// disk. The log holds only what the init says when the
		// container fails to start.
		LogConfig: container.LogConfig{Type: "json-file", Config: map[string]string{"max-size": "1m", "max-file": "1"}},
	}
	return cfg, host
}

// containerSafe keeps the characters Docker allows in names.
func containerSafe(id string) string {
	var b strings.Builder
	for _, r := range id {
		if b.Len() >= 32 {
			break
		}
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.' {
			b.WriteRune(r)
		}
	}
	return b.String()
}
