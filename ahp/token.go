package ahp

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// NewToken makes a bearer token.
func NewToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("make token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// TokenFile is where the token of a server listening on addr goes unless
// its user names a file: in TokenDir, named by the port, so that
// instances on two ports do not overwrite each other's.
func TokenFile(addr net.Addr) (string, error) {
	dir, err := TokenDir()
	if err != nil {
		return "", err
	}
	port := 0
	if t, ok := addr.(*net.TCPAddr); ok {
		port = t.Port
	}
	return filepath.Join(dir, fmt.Sprintf("ahp-token-%d", port)), nil
}

// TokenDir is the directory of TokenFile: sandboxd's in the user's cache
// directory.
func TokenDir() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		// No shared fallback such as /tmp: another user could read or
		// swap the token there.
		return "", fmt.Errorf("no place for the AHP token (%v): name a token file", err)
	}
	return filepath.Join(dir, "sandboxd"), nil
}

// WriteToken writes token to file, readable by its owner only, beside its
// final name and renamed over it. A directory owned by a user other than
// this one or root, or one that others may write to and that is not
// sticky, is refused.
func WriteToken(file, token string) error {
	dir := filepath.Dir(file)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("write token %s: %w", file, err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("write token %s: %w", file, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if ok && int(st.Uid) != os.Getuid() && st.Uid != 0 {
		return fmt.Errorf("write token %s: %s belongs to uid %d, not to this user", file, dir, st.Uid)
	}
	// Others who may write to it could swap the file under its readers.
	// Group-writable is left alone, as for the image's cache: with a
	// private group per user and umask 002 everything a user makes is.
	if fi.Mode().Perm()&0o002 != 0 && fi.Mode()&os.ModeSticky == 0 {
		return fmt.Errorf("write token %s: others may write to %s (mode %v); choose a private directory", file, dir, fi.Mode().Perm())
	}
	tmp, err := os.CreateTemp(dir, ".ahp-token-*")
	if err != nil {
		return fmt.Errorf("write token %s: %w", file, err)
	}
	_, err = tmp.WriteString(token + "\n")
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// Renamed, not written in place: a link planted at the name is
		// replaced, not followed.
		err = os.Rename(tmp.Name(), file)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write token %s: %w", file, err)
	}
	return nil
}

// RemoveToken removes file if it still holds token: another instance may
// have written its own there since.
func RemoveToken(file, token string) {
	if b, err := os.ReadFile(file); err == nil && strings.TrimSpace(string(b)) == token {
		os.Remove(file)
	}
}
