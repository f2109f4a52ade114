package engine

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
)

// TestKillOnHostTakesOnlyAFullID: a name or a short id could be part of
// another container's cgroup path; one that no process here has is not
// this host's.
func TestKillOnHostTakesOnlyAFullID(t *testing.T) {
	for _, ref := range []string{"sandboxd-x-y", "0123456789ab", ""} {
		if _, err := KillOnHost(ref, -1); !errors.Is(err, errNotID) {
			t.Errorf("KillOnHost(%q) = %v, want it refused", ref, err)
		}
	}
	b := make([]byte, 32)
	rand.Read(b)
	if n, err := KillOnHost(hex.EncodeToString(b), -1); n != 0 || !errors.Is(err, ErrNotOnHost) {
		t.Errorf("KillOnHost of a container nowhere = %d, %v; want ErrNotOnHost", n, err)
	}
}
