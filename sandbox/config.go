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
	"time"

	"github.com/BurntSushi/toml"
	"github.com/distribution/reference"

	"github.com/sandboxd/sandboxd/internal/hostpath"
	"github.com/sandboxd/sandboxd/limits"
)

// Config is sandboxd's configuration, as read from sandbox.toml.
type Config struct {
	Session  SessionConfig  `toml:"session"`
	Terminal TerminalConfig `toml:"terminal"`
	Server   ServerConfig   `toml:"server"`
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

	// file and text are where the configuration was read from, for
	// messages about settings found wrong only once sandboxd starts.
	file, text string
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
	MaxSessions     Count    `toml:"max_sessions"`
	IdleTimeout     Duration `toml:"idle_timeout"`
	MaxOutputMemory ByteSize `toml:"max_output_memory"`
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

// ConfigError names the file, line and key of a bad setting.
type ConfigError struct {
	File string
	Line int // 0 when unknown
	Key  string
	Err  error
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	if e.Key != "" {
		fmt.Fprintf(&b, ": %s", e.Key)
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	return b.String()
}

func (e *ConfigError) Unwrap() error { return e.Err }

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
