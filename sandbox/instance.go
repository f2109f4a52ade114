package sandbox

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Labels every sandboxd container carries, so that a later instance can tell
// whose it is and whether its owner is still alive.
const (
	LabelInstance = "io.sandboxd.instance"
	LabelSession  = "io.sandboxd.session"
	LabelHost     = "io.sandboxd.host"
	LabelPid      = "io.sandboxd.pid"
	// LabelBoot is the boot id of the host: a pid from another boot
	// means nothing. Containers made before it existed lack it.
	LabelBoot = "io.sandboxd.boot"
	// LabelMachine tells hosts of the same name apart (cloned machines
	// sharing a remote engine): a hash of the machine id, not the id,
	// which is not to be shown. LabelPidNS is the pid namespace the
	// owner's pid is of: from another, that pid cannot be checked.
	// Containers made before they existed lack them.
	LabelMachine = "io.sandboxd.machine"
	LabelPidNS   = "io.sandboxd.pidns"
)

// lockDir is fixed rather than under os.TempDir: $TMPDIR differs between
// users (libpam-tmpdir gives each their own), and one user's gc must see
// that another user's instance is alive.
const lockDir = "/tmp/sandboxd-instances"

// Instance is one running sandboxd process. It holds an exclusive lock on a
// file named after its id for as long as it lives; the kernel drops the lock
// when the process dies, however it dies, which is how gc tells a crashed
// instance from a live one.
type Instance struct {
	ID      string
	Host    string
	Boot    string // "" when the host does not say
	Machine string // "" when the host has no machine id
	PidNS   string // "" when /proc does not say
	lock    *os.File
}

// LockDir is where instances keep their liveness locks. It is shared by all
// users of the host (sticky, like /tmp) so that one user's gc can see that
// another user's instance is alive.
func LockDir() string { return lockDir }

// NewInstance creates an instance identity and takes its liveness lock.
func NewInstance() (*Instance, error) { return newInstance(LockDir()) }

func newInstance(dir string) (*Instance, error) {
	id, err := randomID(6)
	if err != nil {
		return nil, err
	}
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("new instance %s: %w", id, err)
	}
	if err := createLockDir(dir); err != nil {
		return nil, fmt.Errorf("new instance %s: %w", id, err)
	}
	d, err := openLockDir(dir)
	if err != nil {
		return nil, fmt.Errorf("new instance %s: %w", id, err)
	}
	defer d.Close()
	// Created in the directory just checked, not by its name: no other
	// directory put there meanwhile gets the lock.
	name := filepath.Join(dir, id+".lock")
	fd, err := syscall.Openat(int(d.Fd()), id+".lock", syscall.O_CREAT|syscall.O_EXCL|syscall.O_RDWR|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o644)
	if errors.Is(err, syscall.EACCES) {
		return nil, fmt.Errorf("new instance %s: create lock %s: %w: the lock directory must be writable by every user of sandboxd (sudo chmod 1777 %s)", id, name, err, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("new instance %s: create lock %s: %w", id, name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	// Readable by all whatever the umask: another user's gc tells a live
	// instance by trying the lock.
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		os.Remove(name)
		return nil, fmt.Errorf("new instance %s: %w", id, err)
	}
	if err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		os.Remove(name)
		return nil, fmt.Errorf("lock instance %s: %w", id, err)
	}
	return &Instance{ID: id, Host: host, Boot: bootID(), Machine: machineID(), PidNS: pidNamespace(), lock: f}, nil
}

// createLockDir makes dir when it is missing, shared by every user (1777,
// whatever the umask). It is private until the chmod, which no check
// refuses.
func createLockDir(dir string) error {
	err := os.Mkdir(dir, 0o700)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create lock directory: %w", err)
	}
	if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
		return fmt.Errorf("create lock directory: %w", err)
	}
	return nil
}

// openLockDir opens the lock directory without following a link and
// refuses one whose lock files someone else could replace: a lock file
// swapped for a free one makes a live instance's containers look dead.
func openLockDir(dir string) (*os.File, error) {
	d, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.ENOTDIR) {
		// Linux says ENOTDIR for a link too: the message tells which.
		what := "not a directory"
		if fi, lerr := os.Lstat(dir); lerr == nil && fi.Mode()&os.ModeSymlink != 0 {
			what = "a symbolic link, not a directory"
		}
		return nil, fmt.Errorf("lock directory %s is %s: remove it (rm %s) and start again", dir, what, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("open lock directory: %w", err)
	}
	fi, err := d.Stat()
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("lock directory %s: %w", dir, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		d.Close()
		return nil, fmt.Errorf("lock directory %s: no owner known", dir)
	}
	if err := checkLockDir(dir, st, uint32(os.Geteuid())); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// checkLockDir accepts a directory in which only the owner of each file
// (and the directory's) may remove it: owned by root or uid, sticky or
// written by its owner alone; or made by another user's sandboxd, 1777 as
// sandboxd makes it, since on a shared host the first user to start one
// owns it (that user could remove others' locks, but anyone who may use
// the engine can remove any container anyway).
func checkLockDir(dir string, st *syscall.Stat_t, uid uint32) error {
	perm := st.Mode & 0o7777
	switch {
	case st.Mode&syscall.S_IFMT != syscall.S_IFDIR:
		return fmt.Errorf("lock directory %s is not a directory: remove it (rm %s) and start again", dir, dir)
	case st.Uid != 0 && st.Uid != uid && perm != 0o1777:
		return fmt.Errorf("lock directory %s belongs to uid %d, not to root or you (uid %d), and is not shared as sandboxd makes it (mode 1777, it is %04o): have it removed (sudo rm -r %s) or made by root (sudo install -d -m 1777 -o root %s)", dir, st.Uid, uid, perm, dir, dir)
	case perm&0o022 != 0 && perm&syscall.S_ISVTX == 0:
		return fmt.Errorf("lock directory %s is writable by others without the sticky bit (mode %04o), so anyone could replace the locks that keep containers from gc: make it sticky (chmod 1777 %s) or remove it (rm -r %s)", dir, perm, dir, dir)
	}
	return nil
}

// bootID identifies this boot of the host, or is "" when /proc does not
// say.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// machineID identifies this machine across its boots, hashed: the machine
// id is not to be shown to whoever may list the engine's containers. It is
// "" where there is none (many containers).
func machineID() string {
	for _, name := range []string{"/etc/machine-id", "/var/lib/dbus/machine-id"} {
		if b, err := os.ReadFile(name); err == nil && len(bytes.TrimSpace(b)) > 0 {
			sum := sha256.Sum256(append([]byte("sandboxd instance host\x00"), bytes.TrimSpace(b)...))
			return hex.EncodeToString(sum[:8])
		}
	}
	return ""
}

// pidNamespace names this process's pid namespace, or is "" when /proc
// does not say.
func pidNamespace() string {
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return ""
	}
	return ns
}

// Labels returns the labels of a container owned by this instance.
func (in *Instance) Labels(session string) map[string]string {
	l := map[string]string{
		LabelInstance: in.ID,
		LabelSession:  session,
		LabelHost:     in.Host,
		LabelPid:      strconv.Itoa(os.Getpid()),
	}
	for label, v := range map[string]string{LabelBoot: in.Boot, LabelMachine: in.Machine, LabelPidNS: in.PidNS} {
		if v != "" {
			l[label] = v
		}
	}
	return l
}

// Close releases the liveness lock and removes its file.
func (in *Instance) Close() error {
	if in.lock == nil {
		return nil
	}
	name := in.lock.Name()
	err := in.lock.Close()
	in.lock = nil
	os.Remove(name)
	return err
}

func randomID(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random id: %w", err)
	}
	return hex.EncodeToString(b), nil
}
