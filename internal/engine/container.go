package engine

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The deadlines of RemoveContainer's calls: a kill is one signal and its
// exit event, a removal also unmounts and deletes the container's layer.
const (
	killTimeout   = 5 * time.Second
	removeTimeout = 30 * time.Second
)

// RemoveContainer removes container ref (an id or a name) as sandboxd
// removes every container of its own: whatever runs in it, and its
// anonymous volumes. Each of its calls has a deadline of its own, within
// ctx's.
//
// It kills the container first. An exec whose start hangs (a command
// stopped runc's init of it) holds the engine's lock on the container's
// execs: an inspect, a new exec or a removal waits for it for ever. A kill
// does not, and ends every process of the container, that init too,
// which frees the lock; unless a call that waits holds the container's
// own lock too (an inspect does): then the kill waits as well, and
// RemoveContainer kills the container's processes from this host where it
// may (KillOnHost), before it removes the container.
func RemoveContainer(ctx context.Context, api API, ref string) error {
	kctx, cancel := context.WithTimeout(ctx, killTimeout)
	_, kerr := api.ContainerKill(kctx, ref, ContainerKillOptions{Signal: "KILL"})
	late := kctx.Err() != nil && ctx.Err() == nil
	cancel()
	var herr error
	if late {
		_, herr = KillOnHost(ref, -1)
	}
	rctx, cancel := context.WithTimeout(ctx, removeTimeout)
	defer cancel()
	_, err := api.ContainerRemove(rctx, ref, ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	if err == nil || IsNotFound(err) {
		return err
	}
	// A container that is not running (a conflict) or gone is removed
	// all the same, or already.
	if kerr != nil && !IsNotFound(kerr) && !IsConflict(kerr) {
		err = fmt.Errorf("%w (and the kill before it: %v)", err, kerr)
	}
	if herr != nil && !errors.Is(herr, errNotID) {
		err = fmt.Errorf("%w (%v)", err, herr)
	}
	return err
}
