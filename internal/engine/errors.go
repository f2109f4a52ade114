package engine

import (
	"errors"
	"fmt"
	"io/fs"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
)

// Error adds to an error that says the engine could not be reached what
// to do about it; it returns other errors as they are.
func Error(err error) error {
	switch {
	// A socket the user may not use is the commonest case, and starting
	// the engine would not help there.
	case client.IsErrConnectionFailed(err) && errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%w (your user may not use the engine's socket: add it to the docker group, `sudo usermod -aG docker $USER`, then log in again; or point DOCKER_HOST at an engine you may use)", err)
	case client.IsErrConnectionFailed(err):
		return fmt.Errorf("%w (is the Docker Engine running? start it with `sudo systemctl start docker`, or point DOCKER_HOST at a running engine)", err)
	}
	return err
}

// IsNotFound reports whether the engine said the object does not exist.
func IsNotFound(err error) bool { return cerrdefs.IsNotFound(err) }

// IsConflict reports whether the engine refused an operation that
// conflicts with the object's state (a removal already in progress).
func IsConflict(err error) bool { return cerrdefs.IsConflict(err) }
