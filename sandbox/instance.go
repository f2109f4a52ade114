package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/moby/moby/client"
)

// Labels every sandboxd container carries, so that a later instance can tell
// whose it is and whether its owner is still alive.
const (
	LabelInstance = "io.sandboxd.instance"
	LabelSession  = "io.sandboxd.session"
	LabelHost     = "io.sandboxd.host"
	LabelPid      = "io.sandboxd.pid"
)

// Instance is one running sandboxd process. It holds an exclusive lock on a
// file named after its id for as long as it lives; the kernel drops the lock
// when the process dies, however it dies, which is how gc tells a crashed
// instance from a live one.
type Instance struct {
	ID   string
	Host string
	lock *os.File
}

// LockDir is where instances keep their liveness locks. It is shared by all
// users of the host (sticky, like /tmp) so that one user's gc can see that
// another user's instance is alive.
func LockDir() string { return filepath.Join(os.TempDir(), "sandboxd-instances") }

// NewInstance creates an instance identity and takes its liveness lock.
func NewInstance() (*Instance, error) {
	id, err := randomID(6)
	if err != nil {
		return nil, err
	}
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("new instance: %w", err)
	}
	dir := LockDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("new instance: %w", err)
	}
	// Best effort: the directory is shared between users.
	_ = os.Chmod(dir, 0o1777|os.ModeSticky)
	f, err := os.OpenFile(filepath.Join(dir, id+".lock"), os.O_CREATE|os.O_RDWR|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("new instance %s: %w", id, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock instance %s: %w", id, err)
	}
	return &Instance{ID: id, Host: host, lock: f}, nil
}

// Labels returns the labels of a container owned by this instance.
func (in *Instance) Labels(session string) map[string]string {
	return map[string]string{
		LabelInstance: in.ID,
		LabelSession:  session,
		LabelHost:     in.Host,
		LabelPid:      strconv.Itoa(os.Getpid()),
	}
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

// instanceAlive reports whether the instance that labelled a container is
// still running. Containers of other hosts are treated as alive: their
// owner's lock cannot be seen from here.
func instanceAlive(host string, labels map[string]string) bool {
	if labels[LabelHost] != host {
		return true
	}
	id := labels[LabelInstance]
	if id == "" || id != filepath.Base(id) {
		return false
	}
	name := filepath.Join(LockDir(), id+".lock")
	f, err := os.Open(name)
	if errors.Is(err, os.ErrNotExist) {
		pid, _ := strconv.Atoi(labels[LabelPid])
		return pid > 0 && syscall.Kill(pid, 0) == nil
	}
	if err != nil {
		// A lock we may not even open belongs to someone else; leave it.
		return true
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return true
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	os.Remove(name)
	return false
}

// GCOptions selects what GC removes.
type GCOptions struct {
	// All removes every sandboxd container on the engine, live owner or not.
	All bool
	// Keep is an instance whose containers are never removed (the caller's).
	Keep string
}

// GC removes the containers whose owning instance is no longer running and
// returns their ids.
func GC(ctx context.Context, cli *client.Client, log *slog.Logger, opts GCOptions) ([]string, error) {
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("gc: %w", err)
	}
	list, err := cli.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: make(client.Filters).Add("label", LabelInstance),
	})
	if err != nil {
		return nil, fmt.Errorf("gc: list containers: %w", engineError(err))
	}
	var removed []string
	var errs []error
	for _, c := range list.Items {
		owner := c.Labels[LabelInstance]
		if owner == opts.Keep {
			continue
		}
		if !opts.All && instanceAlive(host, c.Labels) {
			continue
		}
		_, err := cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
		if err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("gc: remove container %.12s: %w", c.ID, err))
			continue
		}
		log.Info("removed container left by a dead instance", "container", c.ID[:12], "instance", owner, "session", c.Labels[LabelSession])
		removed = append(removed, c.ID)
	}
	return removed, errors.Join(errs...)
}

func randomID(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random id: %w", err)
	}
	return hex.EncodeToString(b), nil
}
