package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/types/system"

	"github.com/sandboxd/sandboxd/internal/engine"
)

// Manager owns the sessions of one sandboxd instance and removes their
// containers when it closes.
type Manager struct {
	cli      engine.API
	cfg      Config
	log      *slog.Logger
	instance *Instance
	hostCPUs int
	// hostMemory is the memory of the engine's host (0: the engine said
	// none); memoryBudget is what the memory limits of the instance's
	// containers may add up to (server.memory_budget; 0: no bound).
	hostMemory, memoryBudget int64
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
	// output is the byte limits of unreleased terminals' output buffers
	// (server.max_output_memory bounds it).
	output *MemoryPool
	// memory is the memory limit of each session of sessions and
	// detached, taken at reserve: what it commits of memoryBudget.
	memory map[*Session]int64
}

// NewManager connects sandboxd to the engine: it takes an instance lock,
// removes what dead instances left behind, and reads the engine's CPU count.
func NewManager(ctx context.Context, cli engine.API, cfg Config, log *slog.Logger) (*Manager, error) {
	if err := cfg.checkSources(engine.Socket(cli)); err != nil {
		return nil, err
	}
	info, err := cli.Info(ctx, engine.InfoOptions{})
	if err != nil {
		return nil, fmt.Errorf("connect to engine: %w", engine.Error(err))
	}
	// The configuration was checked against this host's CPUs; a remote
	// engine, or one in a VM, may have fewer, and every session would fail.
	if err := cfg.Session.Limits().Validate(info.Info.NCPU); err != nil {
		return nil, fmt.Errorf("connect to engine: the session limits do not fit the engine, which has %d CPUs: %w", info.Info.NCPU, err)
	}
	if err := checkNetwork(ctx, cli, cfg); err != nil {
		return nil, err
	}
	if err := checkMemoryBudget(cfg, info.Info.MemTotal); err != nil {
		return nil, err
	}
	in, err := NewInstance()
	if err != nil {
		return nil, err
	}
	cfg.requests = NewMemoryPool(MaxRequestMemory)
	mctx, cancel := context.WithCancel(context.Background())
	m := &Manager{
		cli:          cli,
		cfg:          cfg,
		log:          log.With("instance", in.ID),
		instance:     in,
		hostCPUs:     info.Info.NCPU,
		hostMemory:   info.Info.MemTotal,
		memoryBudget: cfg.Server.MemoryBudget.Of(info.Info.MemTotal),
		reaper:       cfg.Session.Init && tiniInit(info.Info.InitBinary),
		keeper:       !mapsIDs(info.Info.SecurityOptions),
		ctx:          mctx,
		cancel:       cancel,
		sessions:     make(map[string]*Session),
		detached:     make(map[*Session]struct{}),
		memory:       make(map[*Session]int64),
		output:       NewMemoryPool(int64(cfg.Server.MaxOutputMemory)),
	}
	if !m.keeper {
		m.log.Info("the engine maps user ids: the containers' own processes run as the commands' user, whose `kill -9 -1` stops a session's container")
	}
	for _, missing := range unenforcedLimits(info.Info) {
		m.log.Warn("the engine cannot enforce a limit of the sessions: it drops it from every container (its kernel lacks the cgroup controller, or swap accounting)", "limit", missing)
	}
	if m.memoryBudget == 0 {
		m.log.Warn("the engine reports no memory size: the memory limits of the sessions are not bounded together; set server.memory_budget as a size", "memory_budget", cfg.Server.MemoryBudget)
	}
	if cfg.Session.Init && !m.reaper {
		m.log.Warn("the engine's init is not tini: commands whose output streams stay apart (sandboxd run) run without a reaper of their own, so a process of theirs that removes "+MarkerEnv+" from its environment and leaves its session can outlive its kill", "init", info.Info.InitBinary)
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
func checkNetwork(ctx context.Context, cli engine.API, cfg Config) error {
	name := cfg.Session.Network
	if name == "none" {
		return nil
	}
	res, err := cli.NetworkInspect(ctx, name, engine.NetworkInspectOptions{})
	if err != nil || res.Network.Driver != "host" {
		return nil
	}
	return cfg.settingError("session.network", "", fmt.Errorf("%q is the engine's host network (%s), which would give commands the host's network: use \"none\" or a network of its own", name, res.Network.Name))
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

// sizedFromInside says TTY commands size their terminal themselves
// (ttySize): the engine is older than API 1.42.
func (m *Manager) sizedFromInside() bool {
	return engine.VersionBelow(m.cli, "1.42")
}

// engineSocket is the path of the engine's unix socket, or "" when the
// engine is reached otherwise.
func (m *Manager) engineSocket() string { return engine.Socket(m.cli) }

// Config returns the configuration the manager runs with; a nil manager
// (a scope that opens no session) has the zero one.
func (m *Manager) Config() Config {
	if m == nil {
		return Config{}
	}
	return m.cfg
}

// reserveOutput counts a new terminal's output buffer against
// server.max_output_memory.
func (m *Manager) reserveOutput(session string, n int) error {
	if !m.output.Take(int64(n)) {
		return fmt.Errorf("session %s: %w: the output buffers of terminals not released, or released but still running, would hold more than %s (server.max_output_memory); release some, or ask for a smaller outputByteLimit", session, ErrLimit, ByteSize(m.output.Max()))
	}
	return nil
}

// memoryOf is the memory limit of a session opened with spec.
func (m *Manager) memoryOf(spec SessionSpec) int64 {
	if spec.Limits.Memory != 0 {
		return spec.Limits.Memory
	}
	return int64(m.cfg.Session.Memory)
}

// CheckMemory refuses a memory limit that no session of the instance may
// have, whatever else is open: more than the memory of the engine's host
// (ErrInvalid), or than the memory budget (ErrLimit). Its message starts
// with "memory".
func (m *Manager) CheckMemory(limit int64) error {
	if m.hostMemory > 0 && limit > m.hostMemory {
		return invalidError(fmt.Sprintf("memory %s is more than the %s of memory the engine's host has", roundBytes(limit), roundBytes(m.hostMemory)))
	}
	if m.memoryBudget > 0 && limit > m.memoryBudget {
		return limitError(fmt.Sprintf("memory %s is more than the memory budget of %s", roundBytes(limit), budgetText(m.cfg.Server.MemoryBudget, m.hostMemory)))
	}
	return nil
}

// admitLocked refuses a new session with a memory limit of mem when the
// limits of the sessions whose containers are there or on their way
// would then add up to more than the memory budget. The spare does not
// count here: makeRoomLocked removes it when it stands in the way.
// m.mu must be held.
func (m *Manager) admitLocked(mem int64) error {
	if err := m.CheckMemory(mem); err != nil {
		return err
	}
	if m.memoryBudget == 0 {
		return nil
	}
	committed, n := m.committedLocked()
	if committed+mem <= m.memoryBudget {
		return nil
	}
	return limitError(fmt.Sprintf("memory: %s more would commit %s, over the memory budget of %s; %d sessions commit %s: close one, or ask for less memory",
		roundBytes(mem), roundBytes(committed+mem), budgetText(m.cfg.Server.MemoryBudget, m.hostMemory), n, roundBytes(committed)))
}

// committedLocked returns what the memory limits of the sessions whose
// containers are there or on their way add up to, and how many they are.
// m.mu must be held.
func (m *Manager) committedLocked() (bytes int64, sessions int) {
	add := func(s *Session) {
		mem, ok := m.memory[s]
		if !ok {
			// A container whose removal is tried again, its session
			// forgotten: counted at the most a session may have.
			mem = int64(m.cfg.Session.Max.Memory)
		}
		bytes += mem
		sessions++
	}
	for _, s := range m.sessions {
		add(s)
	}
	for s := range m.detached {
		add(s)
	}
	return bytes, sessions
}

// limitError is ErrLimit with a message of its own.
type limitError string

func (e limitError) Error() string        { return string(e) }
func (e limitError) Is(target error) bool { return target == ErrLimit }

// releaseOutput gives back what reserveOutput counted.
func (m *Manager) releaseOutput(n int) { m.output.Give(int64(n)) }

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
	mem := m.memoryOf(spec)
	if err := m.admitLocked(mem); err != nil {
		return nil, 0, fmt.Errorf("open session %s: %w", spec.ID, err)
	}
	if s := m.spare; s != nil && spareFits(s.spec, spec) {
		m.spare = nil
		m.memory[s] = mem
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
	m.memory[s] = mem
	m.makeRoomLocked()
	// No spare, or one that does not fit: the next session may.
	m.refillSpare()
	// Close waits for the start (startSession's Done), in the caller's
	// goroutine or in the background: a container it makes after Close
	// gave up on it would be left running, unknown.
	m.wg.Add(1)
	return s, fresh, nil
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
	if !m.retrying[s] {
		// One whose container removeLater tries again to remove (a
		// start that failed, and then its removal) counts until the
		// container is gone.
		delete(m.detached, s)
	}
	delete(m.memory, s)
	m.mu.Unlock()
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
