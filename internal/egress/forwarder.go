package egress

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/hostpath"
)

// ForwarderName is the file name of the forwarder sandboxd looks for next
// to its own executable before it builds one.
const ForwarderName = "sandboxd-forward"

//go:embed forward/main.go
var forwarderSource []byte

// buildTimeout bounds the build of the forwarder.
const buildTimeout = 2 * time.Minute

// Forwarder returns the path of a static forwarder for the containers: a
// ForwarderName next to sandboxd's executable, or else one built from the
// source embedded in sandboxd (CGO_ENABLED=0, with the go command on PATH)
// into cacheDir, under a name that holds the source's hash, so that a
// build is made once per version. Each must be nobody's to change but
// the user's and root's (hostpath.CheckPrivate) and statically linked.
func Forwarder(ctx context.Context, cacheDir string) (string, error) {
	var tried []string
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), ForwarderName)
		if _, err := os.Stat(p); err == nil {
			if err := checkForwarder(p); err != nil {
				return "", err
			}
			return p, nil
		}
		tried = append(tried, p+" (none)")
	}
	sum := sha256.Sum256(append(forwarderSource, runtime.GOARCH...))
	dir := filepath.Join(cacheDir, "forward-"+hex.EncodeToString(sum[:6]))
	p := filepath.Join(dir, ForwarderName)
	if _, err := os.Stat(p); err == nil {
		return p, checkForwarder(p)
	}
	if err := build(ctx, cacheDir, dir); err != nil {
		return "", fmt.Errorf("%w (tried %s; build one with `CGO_ENABLED=0 go build -o %s ./internal/egress/forward` in sandboxd's source)", err, strings.Join(tried, ", "), ForwarderName)
	}
	return p, checkForwarder(p)
}

// checkForwarder refuses a forwarder another user could change, or one
// that is not statically linked (an image such as busybox's has no
// dynamic loader).
func checkForwarder(p string) error {
	if _, err := hostpath.CheckPrivate(p, os.Geteuid()); err != nil {
		return fmt.Errorf("forwarder: %w", err)
	}
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("forwarder %s: %w", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("forwarder %s is linked dynamically: build it with CGO_ENABLED=0", p)
		}
	}
	return nil
}

// build builds the embedded forwarder into dir, whose parent is cacheDir,
// through a private directory of its own and a rename, so that a build
// killed halfway leaves nothing another start would take.
func build(ctx context.Context, cacheDir, dir string) error {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return errors.New("no forwarder to mount, and no go command to build one")
	}
	if err := os.MkdirAll(cacheDir, 0o700); err != nil {
		return fmt.Errorf("build forwarder: %w", err)
	}
	if _, err := hostpath.CheckPrivate(cacheDir, os.Geteuid()); err != nil {
		return fmt.Errorf("build forwarder: %w", err)
	}
	tmp, err := os.MkdirTemp(cacheDir, ".forward-build-")
	if err != nil {
		return fmt.Errorf("build forwarder: %w", err)
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, "src")
	if err := os.Mkdir(src, 0o700); err != nil {
		return fmt.Errorf("build forwarder: %w", err)
	}
	files := map[string][]byte{"main.go": forwarderSource, "go.mod": []byte("module sandboxd-forward\n\ngo 1.24\n")}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(src, name), b, 0o600); err != nil {
			return fmt.Errorf("build forwarder: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	out := filepath.Join(tmp, "out")
	if err := os.Mkdir(out, 0o700); err != nil {
		return fmt.Errorf("build forwarder: %w", err)
	}
	cmd := exec.CommandContext(ctx, gobin, "build", "-buildvcs=false", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(out, ForwarderName), ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH, "GOFLAGS=", "GOTOOLCHAIN=local", "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build forwarder: %v: %.500s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	// The directory whole, in one rename: another start building at the
	// same time gets the same program, and the loser's rename fails
	// harmlessly.
	if err := os.Chmod(out, 0o755); err != nil {
		return fmt.Errorf("build forwarder: %w", err)
	}
	if err := os.Rename(out, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, ForwarderName)); serr == nil {
			return nil
		}
		return fmt.Errorf("build forwarder: %w", err)
	}
	return nil
}
