package engine

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNotOnHost says that this host shows no process of the container: the
// engine is remote, or in a VM, or sandboxd runs in a pid namespace of
// its own.
var ErrNotOnHost = errors.New("none of the container's processes is seen from here")

// maxKillRounds bounds KillOnHost's looks: each kills what it finds, so
// only what forked since the last one is left to the next.
const maxKillRounds = 100

// errNotID is KillOnHost given what is no full container id (a name).
var errNotID = errors.New("not a full container id")

// KillOnHost sends SIGKILL, from this host, to every process of container
// id (a full id) except those whose real user is keep (-1: none), until a
// look at /proc finds none left, and returns how many it killed (a
// process dies a moment after its SIGKILL: it may be signalled again). A
// process is the container's when its cgroup names the container; it is
// signalled through a pidfd opened before that check, so that a pid used
// again meanwhile is not signalled. That reaches the processes only where
// sandboxd sees the engine's (ErrNotOnHost otherwise) and may signal them:
// as root, or as their user. Those it may not signal it leaves, and says
// so with an error wrapping EPERM once it killed the rest.
func KillOnHost(id string, keep int) (int, error) {
	if len(id) != 64 || strings.Trim(id, "0123456789abcdef") != "" {
		return 0, fmt.Errorf("kill the processes of container %.12s: %w", id, errNotID)
	}
	killed, denied := map[int]bool{}, map[int]bool{}
	seen := false
	for range maxKillRounds {
		ents, err := os.ReadDir("/proc")
		if err != nil {
			return len(killed), fmt.Errorf("kill the processes of container %.12s: %w", id, err)
		}
		left := 0
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || denied[pid] {
				continue
			}
			of, target := hostProcess(pid, id, keep)
			seen = seen || of
			if !target {
				continue
			}
			left++
			switch err := killPid(pid, id, keep); {
			case err == nil:
				killed[pid] = true
			case errors.Is(err, unix.EPERM):
				denied[pid] = true
			case !errors.Is(err, unix.ESRCH):
				return len(killed), fmt.Errorf("kill the processes of container %.12s: pid %d: %w", id, pid, err)
			}
		}
		switch {
		case !seen:
			return len(killed), fmt.Errorf("kill the processes of container %.12s: %w", id, ErrNotOnHost)
		case left == 0 && len(denied) > 0:
			return len(killed), fmt.Errorf("kill the processes of container %.12s: %d of them: %w", id, len(denied), unix.EPERM)
		case left == 0:
			return len(killed), nil
		}
	}
	return len(killed), fmt.Errorf("kill the processes of container %.12s: still some after %d looks", id, maxKillRounds)
}

// hostProcess reads whether process pid is one of container id's, and
// whether it is to be killed: not a zombie, nor keep's.
func hostProcess(pid int, id string, keep int) (of, target bool) {
	dir := "/proc/" + strconv.Itoa(pid)
	cg, err := os.ReadFile(dir + "/cgroup")
	if err != nil || !bytes.Contains(cg, []byte(id)) {
		return false, false
	}
	st, err := os.ReadFile(dir + "/status")
	if err != nil {
		return true, false // gone meanwhile
	}
	uid, zombie := -1, false
	for line := range strings.SplitSeq(string(st), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 1 && f[0] == "State:":
			zombie = f[1] == "Z" || f[1] == "X"
		case len(f) > 1 && f[0] == "Uid:":
			uid, _ = strconv.Atoi(f[1])
		}
	}
	return true, !zombie && uid != keep
}

// killPid sends SIGKILL to process pid, if it is still one of container
// id's to kill once a pidfd holds it.
func killPid(pid int, id string, keep int) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if _, target := hostProcess(pid, id, keep); !target {
		return unix.ESRCH
	}
	return unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
}
