package sandbox

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/sandboxd/sandboxd/internal/hostpath"
	"github.com/sandboxd/sandboxd/limits"
)

// Config is sandboxd's configuration, as read from sandbox.toml.
type Config struct {
	Session  SessionConfig  `toml:"session"`
	Terminal TerminalConfig `toml:"terminal"`
	Server   ServerConfig   `toml:"server"`
	Egress   EgressConfig   `toml:"egress"`
	Audit    AuditConfig    `toml:"audit"`
	// Private are the host paths of sandboxd's own endpoints and files
	// (its socket, the AHP token file, its configuration and log files,
	// its package cache) that no container may see: a unix socket can be
	// connected to even through a read-only mount, the token lets a
	// command drive the terminals of every session, and the files choose
	// what sandboxd does next. A session directory
	// or a session.mounts source that is or holds one is refused. They
	// need not exist yet; a relative one is taken from the working
	// directory. Set by the command line, never by sandbox.toml.
	Private []string `toml:"-"`
	// FallbackWorkspace says the served workspace is only for sessions
	// no peer names a directory for (wrap, whose editor names each
	// session's): a served workspace that holds one of Private, the
	// user's home say, then refuses those sessions, not the start.
	FallbackWorkspace bool `toml:"-"`
	// Gateway, when set, is the way out of every container: the egress
	// proxy's socket and its forwarder (wrap --contain). Set by the
	// command line, never by sandbox.toml.
	Gateway *Gateway `toml:"-"`

	// file and text are where the configuration was read from, for
	// messages about settings found wrong only once sandboxd starts.
	file, text string
	// requests is the instance's RequestMemory: NewManager makes it, and
	// every copy of the configuration it hands out shares it.
	requests *MemoryPool
}

// RequestMemory returns what the requests of all the peers of the
// instance may hold in sandboxd's own memory, shared by every connection;
// nil for a configuration no Manager runs with.
func (c Config) RequestMemory() *MemoryPool { return c.requests }

// MaxRequestMemory bounds what the requests of all the peers of an
// instance hold in sandboxd's own memory at once, read, decoded and
// waiting for their answer (RequestMemory; acp counts them).
const MaxRequestMemory = 128 << 20

// MemoryPool counts the bytes that many holders take from one bound. It is
// safe for concurrent use.
type MemoryPool struct {
	max  int64
	mu   sync.Mutex
	used int64
}

// NewMemoryPool returns a pool of max bytes.
func NewMemoryPool(max int64) *MemoryPool { return &MemoryPool{max: max} }

// Take takes n bytes, if the pool has them, and reports whether it did.
func (p *MemoryPool) Take(n int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.used+n > p.max {
		return false
	}
	p.used += n
	return true
}

// Give gives back n bytes that Take took.
func (p *MemoryPool) Give(n int64) {
	p.mu.Lock()
	p.used -= n
	p.mu.Unlock()
}

// Max returns the pool's bound.
func (p *MemoryPool) Max() int64 { return p.max }

// Used returns the bytes taken.
func (p *MemoryPool) Used() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used
}

// ServedWorkspace returns the workspace of requests that name none:
// session.workspace, or else the directory sandboxd runs in.
func (c Config) ServedWorkspace() (string, error) {
	if c.Session.Workspace != "" {
		return c.Session.Workspace, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("workspace: %w", err)
	}
	return wd, nil
}

// SessionConfig describes the container every session gets.
type SessionConfig struct {
	Image           string    `toml:"image"`
	Images          []string  `toml:"images"`
	CPUs            CPUs      `toml:"cpus"`
	Memory          ByteSize  `toml:"memory"`
	Pids            Pids      `toml:"pids"`
	Network         string    `toml:"network"`
	User            string    `toml:"user"`
	FallbackUser    string    `toml:"fallback_user"`
	Workspace       string    `toml:"workspace"`
	WorkspaceMode   string    `toml:"workspace_mode"`
	ProtectGit      bool      `toml:"protect_git"`
	ReadonlyRootfs  bool      `toml:"readonly_rootfs"`
	Scratch         []string  `toml:"scratch"`
	ScratchSize     ByteSize  `toml:"scratch_size"`
	CapDrop         []string  `toml:"cap_drop"`
	NoNewPrivileges bool      `toml:"no_new_privileges"`
	RefuseSetid     bool      `toml:"refuse_setid"`
	Init            bool      `toml:"init"`
	Mounts          []Mount   `toml:"mounts"`
	Max             MaxLimits `toml:"max"`
}

// MaxLimits bounds what a client may ask for.
type MaxLimits struct {
	CPUs   CPUs     `toml:"cpus"`
	Memory ByteSize `toml:"memory"`
	Pids   Pids     `toml:"pids"`
}

// Mount is an extra host path granted to every session.
type Mount struct {
	Source string `toml:"source"`
	Target string `toml:"target"`
	Mode   string `toml:"mode"`
	// Origin names what granted it when not the configuration (a flag,
	// "-v SRC:DST"): errors about it name that.
	Origin string `toml:"-"`
}

// origin is what errors about m name: its Origin, or the setting.
func (m Mount) origin() string {
	if m.Origin != "" {
		return m.Origin
	}
	return "session.mounts"
}

// AddMount grants m to every session, as session.mounts does, once it is
// checked as a mount of the configuration is at start: its target against
// the other mounts, the scratch paths and the workspace, and its source,
// which must exist, against what no sandbox may see and, written to, the
// workspace's git metadata (said now rather than when the session
// starts). engineSocket is the path of the engine's socket ("" for none).
// Its errors name m.Origin.
func (c *Config) AddMount(m Mount, engineSocket string) error {
	o := m.origin()
	mounts := append(slices.Clip(c.Session.Mounts), m)
	if err := validateMounts(mounts, c.Session.Scratch); err != nil {
		return fmt.Errorf("%s: %w", o, err)
	}
	m.Target = filepath.Clean(m.Target)
	mounts[len(mounts)-1] = m
	ws, err := c.ServedWorkspace()
	if err != nil {
		return err
	}
	realWS, err := filepath.EvalSymlinks(ws)
	if err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	// Inside, the workspace is at its own path.
	for _, w := range []string{ws, realWS} {
		if Within(m.Target, w) {
			return fmt.Errorf("%s: target %.200q is or holds the workspace %.200q, which commands see at its own path", o, m.Target, w)
		}
	}
	real, err := filepath.EvalSymlinks(m.Source)
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		err = pe.Err // the path is said once
	}
	if err != nil {
		return fmt.Errorf("%s: source %.200q: %w", o, m.Source, err)
	}
	if err := checkGrant(o, m.Source, real, engineSocket, c.Private); err != nil {
		return errors.New(Reason(err))
	}
	if c.Session.ProtectGit && m.Mode != "ro" {
		found, _ := gitMetadataOf([]string{realWS}, nil, hostMountPoints())
		if g := gitInGrant([]string{realWS}, found, rootGitDirs([]string{realWS}), real); g != "" {
			return fmt.Errorf("%s: source %.200q is git metadata of the workspace (%s), which protect_git keeps read-only: add :ro", o, m.Source, g)
		}
	}
	c.Session.Mounts = mounts
	return nil
}

// TerminalConfig holds per-terminal settings.
type TerminalConfig struct {
	OutputByteLimit    ByteSize `toml:"output_byte_limit"`
	MaxOutputByteLimit ByteSize `toml:"max_output_byte_limit"`
	KillGrace          Duration `toml:"kill_grace"`
	MaxTerminals       Count    `toml:"max_terminals"`
}

// ServerConfig holds instance-wide settings.
type ServerConfig struct {
	MaxSessions     Count        `toml:"max_sessions"`
	IdleTimeout     Duration     `toml:"idle_timeout"`
	MaxOutputMemory ByteSize     `toml:"max_output_memory"`
	MemoryBudget    MemoryBudget `toml:"memory_budget"`
}

// MemoryBudget is what the memory limits of an instance's containers may
// add up to: a size ("16GiB"), or a share of the memory of the engine's
// host ("75%").
type MemoryBudget struct {
	Bytes   int64
	Percent float64 // of the host's memory, when Bytes is 0
}

// UnmarshalTOML accepts a size, or a percentage above 0 and at most 100.
func (b *MemoryBudget) UnmarshalTOML(v any) error {
	if s, ok := v.(string); ok && strings.HasSuffix(strings.TrimSpace(s), "%") {
		p, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(s), "%"), 64)
		if err != nil || !(p > 0 && p <= 100) {
			return fmt.Errorf("%q: a share of the host's memory is a percentage above 0 and at most 100, such as \"75%%\" (a size above the host's memory over-commits it)", s)
		}
		*b = MemoryBudget{Percent: p}
		return nil
	}
	var n ByteSize
	if err := n.UnmarshalTOML(v); err != nil {
		return fmt.Errorf("%w; or a share of the host's memory, such as \"75%%\"", err)
	}
	*b = MemoryBudget{Bytes: int64(n)}
	return nil
}

// Of returns the budget on a host with hostMemory bytes of memory; a share
// of a host whose memory is not known (0) is 0.
func (b MemoryBudget) Of(hostMemory int64) int64 {
	if b.Bytes > 0 {
		return b.Bytes
	}
	return int64(float64(hostMemory) * b.Percent / 100)
}

func (b MemoryBudget) String() string {
	if b.Bytes > 0 {
		return ByteSize(b.Bytes).String()
	}
	return strconv.FormatFloat(b.Percent, 'f', -1, 64) + "%"
}

// budgetText says what the memory budget is, and where it comes from.
func budgetText(b MemoryBudget, hostMemory int64) string {
	if b.Bytes > 0 {
		return roundBytes(b.Bytes) + " (server.memory_budget)"
	}
	return fmt.Sprintf("%s (server.memory_budget, %s of the host's %s)", roundBytes(b.Of(hostMemory)), b, roundBytes(hostMemory))
}

// roundBytes shows a size for a message: whole in its largest unit, or
// else to a tenth of it.
func roundBytes(n int64) string {
	for _, u := range []struct {
		shift uint
		name  string
	}{{40, "TiB"}, {30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
		if n >= 1<<u.shift {
			if n%(1<<u.shift) == 0 {
				return strconv.FormatInt(n>>u.shift, 10) + u.name
			}
			return strconv.FormatFloat(float64(n)/float64(int64(1)<<u.shift), 'f', 1, 64) + u.name
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// guardsGit reports whether git metadata gets read-only mounts: asked for,
// and in a workspace mounted writable (a read-only one is read-only there
// too).
func (c SessionConfig) guardsGit() bool { return c.ProtectGit && c.WorkspaceMode != "ro" }

// Limits returns the session's default resource limits.
func (c SessionConfig) Limits() limits.Limits {
	return limits.Limits{CPUs: float64(c.CPUs), Memory: int64(c.Memory), Pids: int64(c.Pids)}
}

// MaxLimits returns the largest limits a client may ask for.
func (c SessionConfig) MaxLimits() limits.Limits {
	return limits.Limits{CPUs: float64(c.Max.CPUs), Memory: int64(c.Max.Memory), Pids: int64(c.Max.Pids)}
}

// CPUs is a CPU count written as "1.5" or 1.5.
type CPUs float64

// UnmarshalTOML accepts a number or a string.
func (c *CPUs) UnmarshalTOML(v any) error {
	s, err := scalarString(v, false)
	if err != nil {
		return err
	}
	f, err := limits.ParseCPUs(s)
	if err != nil {
		return err
	}
	*c = CPUs(f)
	return nil
}

// ByteSize is a size in bytes written as "512MiB", "2g" or 1048576.
type ByteSize int64

// UnmarshalTOML accepts a number or a string with a unit.
func (b *ByteSize) UnmarshalTOML(v any) error {
	s, err := scalarString(v, true)
	if err != nil {
		return err
	}
	n, err := limits.ParseBytes(s)
	if err != nil {
		return err
	}
	if n <= 0 {
		return fmt.Errorf("size %q must be greater than zero", s)
	}
	*b = ByteSize(n)
	return nil
}

func (b ByteSize) String() string { return limits.FormatBytes(int64(b)) }

// Pids is a process count limit.
type Pids int64

// UnmarshalTOML accepts a number or a numeric string.
func (p *Pids) UnmarshalTOML(v any) error {
	s, err := scalarString(v, true)
	if err != nil {
		return err
	}
	n, err := limits.ParsePids(s)
	if err != nil {
		return err
	}
	*p = Pids(n)
	return nil
}

// Count is a positive whole number.
type Count int

// UnmarshalTOML accepts a positive integer.
func (c *Count) UnmarshalTOML(v any) error {
	s, err := scalarString(v, true)
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return fmt.Errorf("%q is not a positive whole number", s)
	}
	*c = Count(n)
	return nil
}

// Duration is written as "30s", "5m" or "1h30m".
type Duration time.Duration

// UnmarshalTOML accepts a Go duration string.
func (d *Duration) UnmarshalTOML(v any) error {
	s, ok := v.(string)
	if !ok {
		return fmt.Errorf("duration must be a string such as \"30s\", got %v", v)
	}
	x, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("bad duration %q: write it as \"30s\" or \"5m\"", s)
	}
	if x < 0 {
		return fmt.Errorf("duration %q must not be negative", s)
	}
	*d = Duration(x)
	return nil
}

// scalarString is a setting's value as the string its parser reads. A
// setting of whole units (bytes, processes) takes no TOML float: 1e3 or
// 1073741824.7 would be read as something the file does not say.
func scalarString(v any, whole bool) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return "", fmt.Errorf("%v is not a number", x)
		}
		if whole {
			return "", fmt.Errorf("%v is not written as a whole number: write one, or a string such as \"512MiB\"", x)
		}
		return strconv.FormatFloat(x, 'f', -1, 64), nil
	default:
		return "", fmt.Errorf("want a number or a string, got %T", v)
	}
}

// LoadConfig reads the configuration from file, on top of the embedded
// defaults. An empty file name gives the defaults alone. hostCPUs bounds the
// CPU settings.
func LoadConfig(defaults, file string, hostCPUs int) (Config, error) {
	var cfg Config
	if err := decodeConfig(&cfg, "sandbox.toml (embedded default)", defaults); err != nil {
		return Config{}, err
	}
	// The embedded maximum is what the host has when it has fewer CPUs:
	// the defaults must run on any machine. A file that asks for more
	// than the host has is still refused.
	if hostCPUs > 0 {
		cfg.Session.Max.CPUs = min(cfg.Session.Max.CPUs, CPUs(hostCPUs))
	}
	if file == "" {
		return validated(cfg, "sandbox.toml (embedded default)", defaults, hostCPUs)
	}
	text, err := readConfigFile(file)
	if err != nil {
		return Config{}, fmt.Errorf("read config: %w", err)
	}
	if err := decodeConfig(&cfg, file, string(text)); err != nil {
		return Config{}, err
	}
	if filepath.IsAbs(cfg.Session.Workspace) {
		// "/srv/proj/" must hold "/srv/proj" itself.
		cfg.Session.Workspace = filepath.Clean(cfg.Session.Workspace)
	}
	return validated(cfg, file, string(text), hostCPUs)
}

// readConfigFile reads the configuration file. The file chooses what
// every sandbox sees and may do: a file that another user can change is
// theirs to choose, and refused (hostpath.CheckPrivate). A pipe
// (`--config <(...)`) holds what its writer wrote, once, and is read as it
// is.
func readConfigFile(file string) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Mode().IsRegular() {
		real, err := hostpath.CheckPrivate(file, os.Geteuid())
		if err != nil {
			return nil, fmt.Errorf("%w (only you or root may own it, and nobody else write it)", err)
		}
		if st, err := os.Stat(real); err != nil || !os.SameFile(st, fi) {
			return nil, fmt.Errorf("%s changed while it was read", file)
		}
	}
	return io.ReadAll(f)
}

// validated checks cfg and then cleans its paths: the checks quote them
// as written, the engine gets them clean ("/tmp/" a tmpfs at /tmp).
func validated(cfg Config, file, text string, hostCPUs int) (Config, error) {
	if err := cfg.validate(file, text, hostCPUs); err != nil {
		return Config{}, err
	}
	cfg.file, cfg.text = file, text
	s := &cfg.Session
	s.Scratch = slices.Clone(s.Scratch)
	for i, p := range s.Scratch {
		s.Scratch[i] = filepath.Clean(p)
	}
	s.Mounts = slices.Clone(s.Mounts)
	for i := range s.Mounts {
		s.Mounts[i].Target = filepath.Clean(s.Mounts[i].Target)
	}
	return cfg, nil
}

func decodeConfig(cfg *Config, file, text string) error {
	md, err := toml.Decode(text, cfg)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			msg := pe.Message
			if inner := errors.Unwrap(pe); inner != nil {
				msg = inner.Error()
			}
			return &ConfigError{File: file, Line: pe.Position.Line, Key: pe.LastKey, Err: errors.New(msg)}
		}
		// Type mismatches come as plain errors with the position in the
		// text.
		if m := tomlErrPos.FindStringSubmatch(err.Error()); m != nil {
			line, _ := strconv.Atoi(m[1])
			return &ConfigError{File: file, Line: line, Key: m[2], Err: errors.New(m[3])}
		}
		return &ConfigError{File: file, Err: err}
	}
	for _, k := range md.Keys() {
		// The decoder matches names regardless of case, and takes the
		// last of two spellings: mode = "ro" with MODE = "rw" beside it
		// would mount read-write.
		for _, part := range k {
			if part != strings.ToLower(part) {
				return &ConfigError{File: file, Line: keyLine(text, k.String()), Key: k.String(), Err: errors.New("unknown setting: settings are written in lower case")}
			}
		}
	}
	if und := md.Undecoded(); len(und) > 0 {
		key := und[0].String()
		return &ConfigError{File: file, Line: keyLine(text, key), Key: key, Err: errors.New("unknown setting")}
	}
	return nil
}

var tomlErrPos = regexp.MustCompile(`^toml: line (\d+) \(last key "([^"]*)"\): (.*)$`)
