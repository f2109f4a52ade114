package sandbox

import (
	"encoding/json"
	"fmt"

	"github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// setidBits are the mode bits no command may give a file: on the host,
// whoever runs a setuid file runs it as its owner, the person, and a
// setgid one with its group.
const setidBits = unix.S_ISUID | unix.S_ISGID

// modeSyscalls are the system calls that give a file the mode one of their
// arguments holds, and the index of that argument: a change of mode, and
// each way to create a file (open and creat with O_CREAT or O_TMPFILE, a
// directory, a node: mknod makes regular files too). The kernel drops the
// setuid and setgid bits a mkdir asks for; refused all the same, a
// command learns that it was refused.
func modeSyscalls() map[string]uint {
	return map[string]uint{
		"chmod":     1,
		"fchmod":    1,
		"fchmodat":  2,
		"fchmodat2": 2,
		"creat":     1,
		"open":      2,
		"openat":    3,
		"mkdir":     1,
		"mkdirat":   2,
		"mknod":     1,
		"mknodat":   2,
	}
}

// blindSyscalls are the system calls that could give a file a mode where
// seccomp cannot see it: openat2 takes it inside a struct, and io_uring
// makes files from requests in memory. openat2 is refused with ENOSYS,
// which callers (runc, systemd) take as a kernel without it and fall back
// to openat; io_uring is left to the profile's default action, as the
// engine's own profile leaves it.
func blindSyscalls() map[string]*uint {
	nosys := uint(unix.ENOSYS)
	return map[string]*uint{
		"openat2":           &nosys,
		"io_uring_setup":    nil,
		"io_uring_enter":    nil,
		"io_uring_register": nil,
	}
}

// setidSecurityOpt is the seccomp option of a session's container: the
// engine's default profile (moby's, as github.com/moby/profiles/seccomp
// holds it), with every call of modeSyscalls refused with EPERM when its
// mode has a setuid or setgid bit and the calls of blindSyscalls refused.
// It replaces the profile the engine would apply.
func setidSecurityOpt() string {
	b, err := json.Marshal(setidProfile())
	if err != nil {
		// The profile is plain data: no value in it can fail to encode.
		panic(fmt.Sprintf("encode the seccomp profile: %v", err))
	}
	return "seccomp=" + string(b)
}

// setidProfile is the profile of setidSecurityOpt. Each rule that allows a
// call of modeSyscalls gives way to three with its conditions (an
// architecture, a capability): allowed without the bits, EPERM with
// either. A rule that allows one only with conditions on its arguments
// (moby's has none) is dropped for it, which refuses rather than allows.
// Only a rule's Names are read: moby's profile leaves the deprecated Name
// empty.
func setidProfile() *seccomp.Seccomp {
	p := seccomp.DefaultProfile()
	modes, blind := modeSyscalls(), blindSyscalls()
	var kept, added []*seccomp.Syscall
	for _, s := range p.Syscalls {
		if s.Action != specs.ActAllow {
			kept = append(kept, s)
			continue
		}
		var rest []string
		byIndex := map[uint][]string{}
		var indexes []uint // in order of first appearance, for a stable profile
		for _, n := range s.Names {
			i, mode := modes[n]
			errno, isBlind := blind[n]
			switch {
			case mode && len(s.Args) == 0:
				if _, seen := byIndex[i]; !seen {
					indexes = append(indexes, i)
				}
				byIndex[i] = append(byIndex[i], n)
			case isBlind && errno != nil && len(s.Args) == 0:
				added = append(added, rule(s, []string{n}, specs.ActErrno, errno))
			case !mode && !isBlind:
				rest = append(rest, n)
			}
		}
		for _, i := range indexes {
			added = append(added, modeRules(s, byIndex[i], i)...)
		}
		if len(rest) > 0 {
			s.Names = rest
			kept = append(kept, s)
		}
	}
	p.Syscalls = append(kept, added...)
	return p
}

// modeRules are the rules for names, whose mode is argument index, that
// take the place of from: allowed when the mode has neither bit, EPERM
// when it has either. Two rules refuse, since a masked comparison matches
// all the bits of its mask, not either of them.
func modeRules(from *seccomp.Syscall, names []string, index uint) []*seccomp.Syscall {
	eperm := uint(unix.EPERM)
	allow := rule(from, names, specs.ActAllow, nil)
	allow.Args = []specs.LinuxSeccompArg{{Index: index, Value: setidBits, ValueTwo: 0, Op: specs.OpMaskedEqual}}
	rules := []*seccomp.Syscall{allow}
	for _, bit := range []uint64{unix.S_ISUID, unix.S_ISGID} {
		r := rule(from, names, specs.ActErrno, &eperm)
		r.Args = []specs.LinuxSeccompArg{{Index: index, Value: bit, ValueTwo: bit, Op: specs.OpMaskedEqual}}
		rules = append(rules, r)
	}
	return rules
}

// rule is a rule for names with action, under the conditions of from.
func rule(from *seccomp.Syscall, names []string, action specs.LinuxSeccompAction, errno *uint) *seccomp.Syscall {
	return &seccomp.Syscall{
		LinuxSyscall: specs.LinuxSyscall{Names: names, Action: action, ErrnoRet: errno},
		Includes:     from.Includes,
		Excludes:     from.Excludes,
	}
}
