package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/system"
	"github.com/moby/moby/client"
	"github.com/moby/moby/client/pkg/versions"

	"github.com/sandboxd/sandboxd/limits"
)

// ErrNotFound is returned for a session or terminal id that does not exist
// (or no longer does).
var ErrNotFound = errors.New("not found")

// ErrInvalid is returned for a request that is wrong in itself: a relative
// cwd, a NUL byte, a limit above the maximum. Its message names the field.
var ErrInvalid = errors.New("invalid request")

// Reason is err's message without the "invalid request" that a peer's
// request is told: what a flag or a setting is told instead.
func Reason(err error) string {
	return strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": ")
}

// ErrLimit is returned when a configured maximum (sessions, terminals) is
// reached.
var ErrLimit = errors.New("limit reached")

// Manager owns the sessions of one sandboxd instance and removes their
// containers when it closes.
type Manager struct {
	cli      *client.Client
	cfg      Config
	log      *slog.Logger
	instance *Instance
	hostCPUs int
	// reaper says commands run behind the engine's init (reaperPath):
	// the containers have one, and it is tini, which can be a subreaper.
	reaper bool
	// keeper says the containers' own processes run as the keeper uid:
	// the engine does not map ids.
	keeper bool

	// ctx lives as long as the manager: terminals outlive the request that
	// created them.
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	sessions map[string]*Session
	// detached are sessions taken out of sessions, whose container is
	// still there: their close is to come, or under way. Close waits for
	// them, and they count as sessions for the limit and for the checks
	// of what other sessions can write.
	detached map[*Session]struct{}
	// retrying are the detached whose close is done but for their
	// container, which removeLater tries again to remove; Close leaves
	// them to removeLeftovers.
	retrying map[*Session]bool
	closed   bool
	wg       sync.WaitGroup
	// spare is a started container waiting for the next session with
	// spareSpec, so that session's first command need not wait for a cold
	// start; nil while none is ready.
	spare     *Session
	spareSpec *SessionSpec
	// spareStarting says a spare is being started; spareHopeless that
	// the last one could not be, for good (its workspace is one no
	// session may have). A spare that failed otherwise (an engine slow
	// for a while) is tried again by the next session that finds none.
	spareStarting, spareHopeless bool
	// outputBytes is the sum of the byte limits of unreleased terminals'
	// output buffers (server.max_output_memory bounds it).
	outputBytes int64
}

// reserveOutput counts a new terminal's output buffer against
// server.max_output_memory.
func (m *Manager) reserveOutput(session string, n int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	max := int64(m.cfg.Server.MaxOutputMemory)
	if m.outputBytes+int64(n) > max {
		return fmt.Errorf("session %s: %w: the output buffers of terminals not released, or released but still running, would hold more than %s (server.max_output_memory); release some, or ask for a smaller outputByteLimit", session, ErrLimit, ByteSize(max))
	}
	m.outputBytes += int64(n)
	return nil
}

// releaseOutput gives back what reserveOutput counted.
func (m *Manager) releaseOutput(n int) {
	m.mu.Lock()
	m.outputBytes -= int64(n)
	m.mu.Unlock()
}

// NewManager connects sandboxd to the engine: it takes an instance lock,
// removes what dead instances left behind, and reads the engine's CPU count.
func NewManager(ctx context.Context, cli *client.Client, cfg Config, log *slog.Logger) (*Manager, error) {
	if err := cfg.checkSources(EngineSocket(cli)); err != nil {
		return nil, err
	}
	info, err := cli.Info(ctx, client.InfoOptions{})
	if err != nil {
		return nil, fmt.Errorf("connect to engine: %w", EngineError(err))
	}
	// The configuration was checked against this host's CPUs; a remote
	// engine, or one in a VM, may have fewer, and every session would fail.
	if err := cfg.Session.Limits().Validate(info.Info.NCPU); err != nil {
		return nil, fmt.Errorf("connect to engine: the session limits do not fit the engine, which has %d CPUs: %w", info.Info.NCPU, err)
	}
	if err := checkNetwork(ctx, cli, cfg); err != nil {
		return nil, err
	}
	in, err := NewInstance()
	if err != nil {
		return nil, err
	}
	if _, err := GC(ctx, cli, log, GCOptions{Keep: in.ID}); err != nil {
		log.Warn("gc at start", "err", err)
	}
	mctx, cancel := context.WithCancel(context.Background())
	m := &Manager{
		cli:      cli,
		cfg:      cfg,
		log:      log.With("instance", in.ID),
		instance: in,
		hostCPUs: info.Info.NCPU,
		reaper:   cfg.Session.Init && tiniInit(info.Info.InitBinary),
		keeper:   !mapsIDs(info.Info.SecurityOptions),
		ctx:      mctx,
		cancel:   cancel,
		sessions: make(map[string]*Session),
		detached: make(map[*Session]struct{}),
	}
	if !m.keeper {
		m.log.Info("the engine maps user ids: the containers' own processes run as the commands' user, whose `kill -9 -1` stops a session's container")
	}
	for _, missing := range unenforcedLimits(info.Info) {
		m.log.Warn("the engine cannot enforce a limit of the sessions: it drops it from every container (its kernel lacks the cgroup controller, or swap accounting)", "limit", missing)
	}
	if cfg.Session.Init && !m.reaper {
		m.log.Warn("the engine's init is not tini: commands run without a reaper of their own, so a process that removes "+MarkerEnv+" from its environment can outlive its kill", "init", info.Info.InitBinary)
	}
	if d := time.Duration(cfg.Server.IdleTimeout); d > 0 {
		m.wg.Add(1)
		go m.reapIdle(d)
	}
	return m, nil
}

// checkNetwork refuses a configured network that is the engine's host
// network under another name (its id, say), which the configuration's
// check of the name lets pass: commands would share the host's network
// stack. A network the engine does not know is left to a session's start
// to report.
func checkNetwork(ctx context.Context, cli *client.Client, cfg Config) error {
	name := cfg.Session.Network
	if name == "none" {
		return nil
	}
	res, err := cli.NetworkInspect(ctx, name, client.NetworkInspectOptions{})
	if err != nil || res.Network.Driver != "host" {
		return nil
	}
	return cfg.settingError("session.network", "", fmt.Errorf("%q is the engine's host network (%s), which would give commands the host's network: use \"none\" or a network of its own", name, res.Network.Name))
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

// sizedFromInside says TTY commands size their terminal themselves
// (ttySize): the engine is older than API 1.42.
func (m *Manager) sizedFromInside() bool {
	return versions.LessThan(m.cli.ClientVersion(), "1.42")
}

// mapsIDs reports whether the engine maps user ids (userns-remap, or a
// rootless engine), by its security options: only ids in its range can run
// in a container.
func mapsIDs(securityOptions []string) bool {
	for _, o := range securityOptions {
		for _, kv := range strings.Split(o, ",") {
			if kv == "name=userns" || kv == "name=rootless" {
				return true
			}
		}
	}
	return false
}

// tiniInit reports whether the engine's init binary, as its info names it,
// is tini (Docker's docker-init is), which a command can run behind as its
// reaper. Another init (catatonit, dumb-init) takes no -s, and every
// command would fail.
func tiniInit(binary string) bool {
	base := filepath.Base(binary)
	return base == "docker-init" || strings.Contains(base, "tini")
}

// engineSocket is the path of the engine's unix socket, or "" when the
// engine is reached otherwise.
func (m *Manager) engineSocket() string { return EngineSocket(m.cli) }

// EngineSocket returns the path of the unix socket cli reaches the engine
// through, or "" when it reaches it otherwise: no sandbox may see it.
func EngineSocket(cli *client.Client) string {
	if h, ok := strings.CutPrefix(cli.DaemonHost(), "unix://"); ok {
		return h
	}
	return ""
}

// Config returns the configuration the manager runs with.
func (m *Manager) Config() Config { return m.cfg }

// Client returns the engine client.
func (m *Manager) Client() *client.Client { return m.cli }

// InstanceID returns the id that labels this instance's containers.
func (m *Manager) InstanceID() string { return m.instance.ID }

// HostCPUs returns the engine's CPU count, the upper bound for cpus.
func (m *Manager) HostCPUs() int { return m.hostCPUs }

// Open creates and starts the container of a new session under key, which
// callers use to keep sessions of different clients apart. Opening a key
// that is already open is an error.
func (m *Manager) Open(ctx context.Context, key string, spec SessionSpec) (*Session, error) {
	s, created, err := m.openOrGet(ctx, key, spec)
	if err == nil && !created {
		return nil, fmt.Errorf("open session %s: %w: already open", spec.ID, ErrInvalid)
	}
	return s, err
}

// OpenOrGet returns the session under key, opening it with spec when there is
// none. Concurrent callers for the same key share one container.
func (m *Manager) OpenOrGet(ctx context.Context, key string, spec SessionSpec) (*Session, error) {
	s, _, err := m.openOrGet(ctx, key, spec)
	return s, err
}

func (m *Manager) openOrGet(ctx context.Context, key string, spec SessionSpec) (*Session, bool, error) {
	s, state, err := m.reserve(key, spec)
	switch {
	case err != nil:
		return nil, false, err
	case state == existing:
		if err := s.waitReady(ctx); err != nil {
			return nil, false, err
		}
		return s, false, nil
	case state == adopted:
		return s, true, nil
	}
	if err := m.startSession(ctx, s); err != nil {
		return nil, false, err
	}
	return s, true, nil
}

// OpenAsync starts opening the session under key in the background, unless
// there is one already, and returns at once; Get waits for it. A proxy uses
// it to have the container ready before the agent's first command.
func (m *Manager) OpenAsync(key string, spec SessionSpec) {
	s, state, err := m.reserve(key, spec)
	if err != nil {
		m.log.Warn("prepare session", "session", spec.ID, "err", err)
		return
	}
	if state != fresh {
		return
	}
	go func() {
		if err := m.startSession(m.ctx, s); err != nil {
			m.log.Warn("prepare session", "session", spec.ID, "err", err)
		}
	}()
}

// How reserve found a session.
const (
	fresh    = iota // new, to be started by the caller
	existing        // opened before, maybe still starting
	adopted         // the spare container, already running
)

// reserve returns the session under key, or a new one: the spare when it
// fits, else one that is not started yet. Concurrent callers for the same
// key get the same session.
func (m *Manager) reserve(key string, spec SessionSpec) (*Session, int, error) {
	m.dropStaleSpare()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, 0, fmt.Errorf("open session %s: sandboxd is shutting down", spec.ID)
	}
	// A session the idle reaper has claimed is on its way out: one
	// opened now under its key is a new one.
	if s, ok := m.sessions[key]; ok && !s.isClosed() {
		return s, existing, nil
	}
	if len(m.sessions)+len(m.detached) >= int(m.cfg.Server.MaxSessions) {
		return nil, 0, fmt.Errorf("open session %s: %w: %d sessions are open (server.max_sessions)", spec.ID, ErrLimit, m.cfg.Server.MaxSessions)
	}
	if s := m.spare; s != nil && spareFits(s.spec, spec) {
		m.spare = nil
		s.key, s.ID = key, spec.ID
		s.spec.Dir, _ = checkDir(spec)
		// Idle from now on, not since the spare was made: an old spare
		// would be reaped at its session's first tick.
		s.mu.Lock()
		s.lastUsed = time.Now()
		s.mu.Unlock()
		m.sessions[key] = s
		m.log.Info("session takes the spare container", "session", spec.ID, "container", s.contID[:12])
		m.refillSpare()
		return s, adopted, nil
	}
	s := newSession(m, key, spec)
	m.sessions[key] = s
	// No spare, or one that does not fit: the next session may.
	m.refillSpare()
	// Close waits for the start (startSession's Done), in the caller's
	// goroutine or in the background: a container it makes after Close
	// gave up on it would be left running, unknown.
	m.wg.Add(1)
	return s, fresh, nil
}

// dropStaleSpare drops the spare container when a repository was made in
// its workspace since it started: it has no read-only mount there, a new
// one will. The look at the workspace is made without m.mu, which a slow
// filesystem must not hold up.
func (m *Manager) dropStaleSpare() {
	m.mu.Lock()
	s := m.spare
	m.mu.Unlock()
	if s == nil || s.gitUnchanged() {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.spare != s || m.closed {
		return // taken or dropped meanwhile, or Close removes it
	}
	m.spare = nil
	m.log.Info("spare container dropped: the workspace's git metadata changed", "container", s.contID[:12])
	m.wg.Go(func() { m.discard(s) })
	m.refillSpare()
}

// spareFits reports whether a session asking for want can have the spare
// made with have: same workspace, nothing but the defaults otherwise.
func spareFits(have, want SessionSpec) bool {
	if _, err := checkDir(want); err != nil {
		return false // a fresh start reports it
	}
	return filepath.Clean(want.Workspace) == have.Workspace && len(want.ExtraDirs) == 0 &&
		(want.Image == "" || want.Image == have.Image) &&
		(want.Network == "" || want.Network == have.Network) &&
		want.Limits == limits.Limits{}
}

// KeepSpare keeps one container with spec (the configured defaults and a
// workspace) started ahead of need, for the next session that fits it.
func (m *Manager) KeepSpare(spec SessionSpec) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.spareSpec, m.spareHopeless = &spec, false
	m.refillSpare()
}

// refillSpare starts a new spare in the background. m.mu must be held.
func (m *Manager) refillSpare() {
	if m.spareSpec == nil || m.closed || m.spare != nil || m.spareStarting || m.spareHopeless {
		return
	}
	m.spareStarting = true
	spec := *m.spareSpec
	spec.ID = "spare"
	s := newSession(m, "", spec)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		err := s.start(m.ctx)
		s.markReady(err)
		// Kept in the same hold of m.mu that ends spareStarting: a
		// session opened in between would start cold, and another spare
		// with it.
		m.mu.Lock()
		m.spareStarting = false
		m.spareHopeless = errors.Is(err, ErrInvalid)
		keep := err == nil && !m.closed && m.spare == nil
		if keep {
			m.spare = s
		}
		m.mu.Unlock()
		if err != nil {
			switch {
			case m.ctx.Err() != nil:
			case errors.Is(err, ErrInvalid):
				// The served workspace is one no session may have (wrap
				// started in / or the home directory): the sessions the
				// editor names will say so if they name it.
				m.log.Debug("no spare container", "err", err)
			default:
				m.log.Warn("start spare container", "err", err)
			}
			return
		}
		if !keep {
			m.discard(s)
			return
		}
		m.log.Debug("spare container ready", "container", s.contID[:12])
	}()
}

// startSession starts s, which reserve returned fresh: once for each.
func (m *Manager) startSession(ctx context.Context, s *Session) error {
	defer m.wg.Done()
	err := s.start(ctx)
	if err != nil {
		m.forget(s)
	}
	s.markReady(err)
	return err
}

// Get returns the open session under key, waiting for it if it is still
// starting; with a ctx that is done already it does not wait, and a session
// still starting gives ctx's error.
func (m *Manager) Get(ctx context.Context, key string) (*Session, error) {
	m.mu.Lock()
	s, ok := m.sessions[key]
	m.mu.Unlock()
	if !ok || s.isClosed() {
		// Bare: key is the caller's own, which it may not want shown.
		return nil, ErrNotFound
	}
	if err := s.waitReady(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// writableByAnother reports whether dir lies inside a directory another
// session (or the spare) mounts writable, whose commands could swap dir
// for a link.
func (m *Manager) writableByAnother(s *Session, dir string) bool {
	if m.cfg.Session.WorkspaceMode == "ro" {
		return false
	}
	m.mu.Lock()
	others := make([]*Session, 0, len(m.sessions)+len(m.detached)+1)
	for _, o := range m.sessions {
		others = append(others, o)
	}
	for o := range m.detached {
		others = append(others, o)
	}
	if m.spare != nil {
		others = append(others, m.spare)
	}
	m.mu.Unlock()
	for _, o := range others {
		if o == s {
			continue
		}
		o.mu.Lock()
		sources := o.mountSources
		o.mu.Unlock()
		for _, src := range sources {
			if src != dir && Within(src, dir) {
				return true
			}
		}
	}
	return false
}

// refusePlantedLinks refuses dir when a link on its way lies inside a
// directory another session mounts writable: that session's commands put
// it there, and it may lead anywhere the user can reach ($HOME), which
// the checks on the resolved directory would let pass.
func (m *Manager) refusePlantedLinks(s *Session, dir string) error {
	p := "/"
	for _, c := range strings.Split(strings.TrimPrefix(filepath.Clean(dir), "/"), "/") {
		if c == "" {
			continue
		}
		p = filepath.Join(p, c)
		fi, err := os.Lstat(p)
		if err != nil {
			return nil // the checks that follow report it
		}
		if fi.Mode()&os.ModeSymlink != 0 && m.writableByAnother(s, p) {
			return fmt.Errorf("%w: workspace: %q passes the link %s, which lies in another session's writable workspace", ErrInvalid, dir, p)
		}
	}
	return nil
}

// Detach takes the session under key out at once, started or not, so that
// an open under key from now on gets a new session, and returns it for the
// caller to close when it suits; nil if there is none. Close closes it if
// the caller has not.
func (m *Manager) Detach(key string) *Session {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sessions[key]
	if s != nil {
		delete(m.sessions, key)
		m.detached[s] = struct{}{}
	}
	return s
}

// Sessions returns the number of sessions whose container is there or on
// its way.
func (m *Manager) Sessions() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.sessions) + len(m.detached)
}

// CloseSession removes the session under key and its container.
func (m *Manager) CloseSession(ctx context.Context, key string) error {
	m.mu.Lock()
	s, ok := m.sessions[key]
	m.mu.Unlock()
	if !ok {
		return ErrNotFound
	}
	return s.Close(ctx)
}

func (m *Manager) forget(s *Session) {
	m.mu.Lock()
	if m.sessions[s.key] == s {
		delete(m.sessions, s.key)
	}
	delete(m.detached, s)
	m.mu.Unlock()
}

// unenforcedLimits names the session limits the engine says it cannot
// enforce. It does not refuse them: it drops them from each container it
// creates, with no more than a warning in the answer.
func unenforcedLimits(info system.Info) []string {
	var missing []string
	for _, l := range []struct {
		name string
		ok   bool
	}{
		{"memory", info.MemoryLimit},
		{"memory+swap (swap = memory)", info.SwapLimit},
		{"cpus (CFS quota)", info.CPUCfsQuota && info.CPUCfsPeriod},
		{"pids", info.PidsLimit},
	} {
		if !l.ok {
			missing = append(missing, l.name)
		}
	}
	return missing
}

// discard removes the container of s, which no session map holds any
// more (a start that failed half way, a spare not kept), and tries again
// later when the engine refuses: nothing else would remove it before exit.
func (m *Manager) discard(s *Session) {
	if err := s.removeContainer(); err != nil {
		m.log.Warn("remove container", "session", s.ID, "err", err)
		m.removeLater(s)
	}
}

// removeMade removes, in the background, the container named name that
// the engine may have made for a create whose answer was an error (it
// timed out, the connection broke): nobody has its id, and it would stay
// until sandboxd exits. The engine may still be making it: not found is
// tried again a few times.
func (m *Manager) removeMade(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return // the exit removes every container of the instance
	}
	m.wg.Go(func() {
		for _, wait := range []time.Duration{0, 2 * time.Second, 10 * time.Second} {
			select {
			case <-time.After(wait):
			case <-m.ctx.Done():
				return
			}
			ctx, cancel := context.WithTimeout(m.ctx, 30*time.Second)
			err := removeContainer(ctx, m.cli, name)
			cancel()
			switch {
			case err == nil:
				m.log.Info("removed the container of a failed create", "container", name)
				return
			case !isNotFound(err):
				m.log.Warn("remove the container of a failed create", "container", name, "err", err)
			}
		}
	})
}

// removeLater tries again, in the background, to remove the container of s
// whose removal failed (an engine under load may not stop a container in
// time), rather than leave it until the next start; the exit removes what
// is left when sandboxd stops first. Until it is gone, s counts among the
// detached: its container still counts against the limit, and what its
// commands can write still counts in the checks of other sessions.
func (m *Manager) removeLater(s *Session) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.detached[s] = struct{}{}
	if m.retrying == nil {
		m.retrying = make(map[*Session]bool)
	}
	m.retrying[s] = true
	m.wg.Go(func() {
		// Then every minute, for as long as the container is there: it
		// keeps its place among the sessions until it is gone.
		for try := 0; ; try++ {
			wait := time.Minute
			if backoff := []time.Duration{2 * time.Second, 10 * time.Second, 30 * time.Second}; try < len(backoff) {
				wait = backoff[try]
			}
			select {
			case <-time.After(wait):
			case <-m.ctx.Done():
				return
			}
			err := s.removeContainer()
			if err == nil {
				m.log.Info("container removed on a later try", "session", s.ID)
				m.mu.Lock()
				delete(m.detached, s)
				delete(m.retrying, s)
				m.mu.Unlock()
				return
			}
			m.log.Warn("remove container", "session", s.ID, "err", err)
		}
	})
}

// detach takes s out of sessions, if it is there, and keeps it among the
// detached until forget.
func (m *Manager) detach(s *Session) {
	m.mu.Lock()
	m.detachLocked(s)
	m.mu.Unlock()
}

// detachLocked is detach with m.mu held.
func (m *Manager) detachLocked(s *Session) {
	if m.sessions[s.key] == s {
		delete(m.sessions, s.key)
	}
	m.detached[s] = struct{}{}
}

// Close removes every session's container and releases the instance lock.
// It is what SIGTERM and SIGINT lead to.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	sessions := make([]*Session, 0, len(m.sessions)+len(m.detached))
	for _, s := range m.sessions {
		sessions = append(sessions, s)
	}
	for s := range m.detached {
		if !m.retrying[s] {
			sessions = append(sessions, s)
		}
	}
	spare := m.spare
	m.spare = nil
	m.mu.Unlock()
	if spare != nil {
		if err := spare.removeContainer(); err != nil {
			// removeLeftovers tries it once more at the end.
			m.log.Warn("remove spare container", "err", err)
		}
	}

	var wg sync.WaitGroup
	errs := make([]error, len(sessions))
	for i, s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// One still starting is closed all the same: its start removes
			// the container it makes once it sees the session closed.
			s.waitReady(ctx)
			errs[i] = s.Close(ctx)
		}()
	}
	wg.Wait()
	m.cancel()
	m.wg.Wait()
	errs = append(errs, m.removeLeftovers(ctx))
	return errors.Join(append(errs, m.instance.Close())...)
}

// removeLeftovers removes what containers of this instance are still
// there once every session is closed: one whose removal failed (the
// engine was busy), or one a start made after its session was given up
// on. The next start would remove them, but there may be none.
func (m *Manager) removeLeftovers(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	list, err := m.cli.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: make(client.Filters).Add("label", LabelInstance+"="+m.instance.ID),
	})
	if err != nil {
		return fmt.Errorf("remove leftover containers: %w", EngineError(err))
	}
	var errs []error
	for _, c := range list.Items {
		m.log.Warn("removing a container left behind", "container", c.ID[:12], "session", c.Labels[LabelSession])
		// A conflict is a removal under way already.
		if err := removeContainer(ctx, m.cli, c.ID); err != nil && !isNotFound(err) && !cerrdefs.IsConflict(err) {
			errs = append(errs, fmt.Errorf("remove leftover container %.12s: %w", c.ID, err))
		}
	}
	return errors.Join(errs...)
}

func (m *Manager) reapIdle(timeout time.Duration) {
	defer m.wg.Done()
	tick := time.NewTicker(max(timeout/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case now := <-tick.C:
			m.mu.Lock()
			var idle []*Session
			for _, s := range m.sessions {
				if s.claimIdle(now, timeout) {
					// Among the detached at once: until its close
					// is done its container still counts, and
					// still shows its mounts to the link check.
					m.detachLocked(s)
					idle = append(idle, s)
				}
			}
			m.mu.Unlock()
			var wg sync.WaitGroup
			for _, s := range idle {
				m.log.Info("closing idle session", "session", s.ID, "idle", timeout)
				wg.Go(func() {
					if err := s.Close(m.ctx); err != nil {
						m.log.Warn("close idle session", "session", s.ID, "err", err)
					}
				})
			}
			wg.Wait()
		}
	}
}

// EngineError adds to an error that says the engine could not be reached
// what to do about it: a socket the user may not use is the commonest
// case, and starting the engine would not help there.
func EngineError(err error) error {
	switch {
	case client.IsErrConnectionFailed(err) && errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%w (your user may not use the engine's socket: add it to the docker group, `sudo usermod -aG docker $USER`, then log in again; or point DOCKER_HOST at an engine you may use)", err)
	case client.IsErrConnectionFailed(err):
		return fmt.Errorf("%w (is the Docker Engine running? start it with `sudo systemctl start docker`, or point DOCKER_HOST at a running engine)", err)
	}
	return err
}

func isNotFound(err error) bool { return cerrdefs.IsNotFound(err) }
