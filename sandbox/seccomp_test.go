package sandbox

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd"
)

// verdict is what profile p does with the call name whose argument index
// holds value (the others 0), on amd64 in a container without
// capabilities: the
// action of the rule that matches, or the default one. Two matching rules
// that disagree are an error, as libseccomp would not say which wins.
func verdict(t *testing.T, p *seccomp.Seccomp, name string, index uint, value uint64) (specs.LinuxSeccompAction, uint) {
	t.Helper()
	var found *seccomp.Syscall
	for _, s := range p.Syscalls {
		if !slices.Contains(s.Names, name) {
			continue
		}
		if in := s.Includes; in != nil && (len(in.Caps) > 0 || len(in.Arches) > 0 && !slices.Contains(in.Arches, "amd64")) {
			continue
		}
		if ex := s.Excludes; ex != nil && slices.Contains(ex.Arches, "amd64") {
			continue
		}
		match := true
		for _, a := range s.Args {
			if a.Op != specs.OpMaskedEqual {
				t.Fatalf("%s: rule compares with %s, which this test does not read", name, a.Op)
			}
			if a.Index == index && value&a.Value != a.ValueTwo || a.Index != index && a.ValueTwo != 0 {
				match = false
			}
		}
		if !match {
			continue
		}
		if found != nil && (found.Action != s.Action || ruleErrno(found) != ruleErrno(s)) {
			t.Fatalf("%s with argument %d = %#o: rules disagree: %s and %s", name, index, value, found.Action, s.Action)
		}
		found = s
	}
	if found == nil {
		return p.DefaultAction, *p.DefaultErrnoRet
	}
	return found.Action, ruleErrno(found)
}

// ruleErrno is the errno rule s returns, 0 for none.
func ruleErrno(s *seccomp.Syscall) uint {
	if s.ErrnoRet == nil {
		return 0
	}
	return *s.ErrnoRet
}

// TestSetidProfileRefusesTheBits: every call that gives a file a mode is
// refused with EPERM when that mode has a setuid or setgid bit, and
// allowed otherwise (the sticky bit, and whatever the kernel ignores above
// the mode, included).
func TestSetidProfileRefusesTheBits(t *testing.T) {
	p := setidProfile()
	for name, index := range modeSyscalls() {
		for _, tc := range []struct {
			mode   uint64
			action specs.LinuxSeccompAction
			errno  uint
		}{
			{0o755, specs.ActAllow, 0},
			{0o1777, specs.ActAllow, 0},
			{0xffff0000_00000000 | 0o644, specs.ActAllow, 0},
			{0o4755, specs.ActErrno, uint(unix.EPERM)},
			{0o2755, specs.ActErrno, uint(unix.EPERM)},
			{0o6755, specs.ActErrno, uint(unix.EPERM)},
			{unix.S_IFREG | 0o4644, specs.ActErrno, uint(unix.EPERM)},
			{0o2000, specs.ActErrno, uint(unix.EPERM)},
		} {
			action, errno := verdict(t, p, name, index, tc.mode)
			if action != tc.action || errno != tc.errno {
				t.Errorf("%s with mode %#o: %s (errno %d), want %s (errno %d)", name, tc.mode, action, errno, tc.action, tc.errno)
			}
		}
	}
	if action, errno := verdict(t, p, "openat2", 0, 0); action != specs.ActErrno || errno != uint(unix.ENOSYS) {
		t.Errorf("openat2: %s (errno %d), want ENOSYS", action, errno)
	}
	for _, name := range []string{"io_uring_setup", "io_uring_enter", "io_uring_register"} {
		if action, _ := verdict(t, p, name, 0, 0); action == specs.ActAllow {
			t.Errorf("%s allowed", name)
		}
	}
}

// rulesFor is every rule of p that names name, as JSON with name alone.
func rulesFor(p *seccomp.Seccomp, name string) []string {
	var out []string
	for _, s := range p.Syscalls {
		if !slices.Contains(s.Names, name) {
			continue
		}
		c := *s
		c.Names = []string{name}
		b, _ := json.Marshal(c)
		out = append(out, string(b))
	}
	return out
}

// TestSetidProfileKeepsTheDefault: apart from the calls it guards, the
// profile is the engine's default one, rule for rule, and each guarded call
// the default allows is allowed by it only without conditions on its
// arguments, so that none is lost.
func TestSetidProfileKeepsTheDefault(t *testing.T) {
	def, p := seccomp.DefaultProfile(), setidProfile()
	guarded := modeSyscalls()
	for n := range blindSyscalls() {
		guarded[n] = 0
	}
	names := map[string]bool{}
	for _, s := range def.Syscalls {
		for _, n := range s.Names {
			names[n] = true
		}
		for _, n := range s.Names {
			if _, ok := guarded[n]; ok && s.Action == specs.ActAllow && len(s.Args) > 0 {
				t.Errorf("the default profile allows %s only with conditions on its arguments: setidProfile drops that rule", n)
			}
		}
	}
	if b, _ := json.Marshal(def); strings.Contains(string(b), `"name":`) {
		t.Errorf("the default profile names a call in the deprecated field name, which setidProfile does not read")
	}
	if !names["chmod"] || !names["openat"] {
		t.Fatalf("the default profile names neither chmod nor openat: not the profile this test knows")
	}
	for n := range names {
		if _, g := guarded[n]; g {
			continue
		}
		if got, want := rulesFor(p, n), rulesFor(def, n); !slices.Equal(got, want) {
			t.Errorf("%s: rules\n%s\nwant the default's\n%s", n, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	head := func(p *seccomp.Seccomp) string {
		c := *p
		c.Syscalls = nil
		b, _ := json.Marshal(c)
		return string(b)
	}
	if got, want := head(p), head(def); got != want {
		t.Errorf("profile without its rules:\n%s\nwant the default's\n%s", got, want)
	}
}

// TestContainerSecurityOptions: refuse_setid adds the profile to the
// container's security options and keeps no-new-privileges; off, the
// engine's own profile applies.
func TestContainerSecurityOptions(t *testing.T) {
	cfg, err := LoadConfig(sandboxd.DefaultConfig, "", 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, refuse := range []bool{true, false} {
		c := cfg.Session
		c.RefuseSetid = refuse
		_, host := containerConfig(c, SessionSpec{Workspace: "/w"}, []bind{{"/w", "/w"}}, nil, "1000:1000", nil)
		if !slices.Contains(host.SecurityOpt, "no-new-privileges") {
			t.Errorf("refuse_setid = %v: security options %.80q lack no-new-privileges", refuse, host.SecurityOpt)
		}
		var profiles []string
		for _, o := range host.SecurityOpt {
			if j, ok := strings.CutPrefix(o, "seccomp="); ok {
				profiles = append(profiles, j)
			}
		}
		if !refuse {
			if len(profiles) != 0 {
				t.Errorf("refuse_setid = false: a seccomp profile is set")
			}
			continue
		}
		if len(profiles) != 1 {
			t.Fatalf("refuse_setid = true: %d seccomp profiles, want 1", len(profiles))
		}
		var got seccomp.Seccomp
		if err := json.Unmarshal([]byte(profiles[0]), &got); err != nil {
			t.Fatalf("the profile does not decode: %v", err)
		}
		if a, b := fmt.Sprint(rulesFor(&got, "chmod")), fmt.Sprint(rulesFor(setidProfile(), "chmod")); a != b {
			t.Errorf("the container's profile has chmod rules %s, want %s", a, b)
		}
	}
	if !cfg.Session.RefuseSetid {
		t.Errorf("refuse_setid is off by default")
	}
}
