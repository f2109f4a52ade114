package engine

import "context"

// RemoveContainer removes container ref (an id or a name) as sandboxd
// removes every container of its own: whatever runs in it, and its
// anonymous volumes.
func RemoveContainer(ctx context.Context, api API, ref string) error {
	_, err := api.ContainerRemove(ctx, ref, ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	return err
}
