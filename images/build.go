package images

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/distribution/reference"

	"github.com/sandboxd/sandboxd/internal/engine"
)

// DefaultRef is the base image sessions run unless configured otherwise.
const DefaultRef = "sandboxd/base:1"

// Packages returns the Debian packages the base image is made of: a static
// busybox gives the POSIX shell and coreutils-level tools (ps, kill, grep,
// stty ...), a static bash gives the shell that AHP command detection needs.
func Packages() []string { return []string{"busybox-static", "bash-static"} }

// Builder builds the base image and loads it into the engine.
type Builder struct {
	Client engine.API
	// Progress gets short human-readable progress lines; may be nil.
	Progress io.Writer
	// CacheDir keeps downloaded .deb files between builds; empty means
	// sandboxd/debs in the user cache directory, or, when there is none, a
	// private directory for one build only. A directory that someone else
	// owns or can write to is refused: the busybox in the .deb files there
	// is run on the host.
	CacheDir string
}

// Result describes a built image.
type Result struct {
	ID          string // image id, "sha256:..."
	LayerDigest string // the root filesystem layer's diff_id
	Size        int64  // bytes of the layer
}

func (b *Builder) progress(format string, args ...any) {
	if b.Progress != nil {
		fmt.Fprintf(b.Progress, "sandboxd: "+format+"\n", args...)
	}
}

// Ensure makes sure ref exists in the engine. The default image is built
// when missing; any other missing image is an error that says how to get it,
// since no registry can be pulled from.
func (b *Builder) Ensure(ctx context.Context, ref string) error {
	_, err := b.Client.ImageInspect(ctx, ref)
	if err == nil {
		return nil
	}
	if !engine.IsNotFound(err) {
		return fmt.Errorf("inspect image %s: %w", ref, engine.Error(err))
	}
	if ref != DefaultRef {
		return fmt.Errorf("image %s is not on the engine, and sandboxd never pulls one: pull it first (`docker pull %s`), build or load it, or use the default image %s (`sandboxd image build`)", ref, ref, DefaultRef)
	}
	b.progress("image %s not found; building it now (once)", ref)
	_, err = b.Build(ctx, ref)
	return err
}

// tagOf gives the tag an image built as ref is loaded under: ref with
// "latest" when it names no tag, as the engine reads a name alone. A
// digest is refused, since a load can only tag.
func tagOf(ref string) (string, error) {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return "", fmt.Errorf("build image %s: %w", ref, err)
	}
	if _, ok := named.(reference.Digested); ok {
		return "", fmt.Errorf("build image %s: a reference with a digest cannot be built; give a name and tag", ref)
	}
	return reference.FamiliarString(reference.TagNameOnly(named)), nil
}

// Build makes the base image's root filesystem from Debian packages and
// loads it into the engine tagged ref. Building twice from the same packages
// gives the same layer digest and the same image id.
func (b *Builder) Build(ctx context.Context, ref string) (Result, error) {
	// Before the work: an engine that is not there, or a name it would
	// not take, would only show at the load.
	ref, err := tagOf(ref)
	if err != nil {
		return Result{}, err
	}
	if _, err := b.Client.Ping(ctx, engine.PingOptions{}); err != nil {
		return Result{}, fmt.Errorf("build image %s: %w", ref, engine.Error(err))
	}
	start := time.Now()
	b.progress("building base image %s from Debian packages %s", ref, strings.Join(Packages(), ", "))
	entries, err := b.rootfs(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("build image %s: %w", ref, err)
	}
	var layer bytes.Buffer
	diffID, err := WriteLayer(&layer, entries)
	if err != nil {
		return Result{}, fmt.Errorf("build image %s: %w", ref, err)
	}
	archive, id, err := imageArchive(ref, diffID, layer.Bytes())
	if err != nil {
		return Result{}, fmt.Errorf("build image %s: %w", ref, err)
	}
	resp, err := b.Client.ImageLoad(ctx, bytes.NewReader(archive), engine.ImageLoadQuiet())
	if err != nil {
		return Result{}, fmt.Errorf("build image %s: load: %w", ref, err)
	}
	msg, err := io.ReadAll(resp)
	resp.Close()
	if err != nil {
		return Result{}, fmt.Errorf("build image %s: load: %w", ref, err)
	}
	if bytes.Contains(msg, []byte(`"error"`)) {
		return Result{}, fmt.Errorf("build image %s: load: %s", ref, bytes.TrimSpace(msg))
	}
	b.progress("built %s (%s, %d KiB) in %v", ref, id[:19], layer.Len()>>10, time.Since(start).Round(time.Millisecond))
	return Result{ID: id, LayerDigest: diffID, Size: int64(layer.Len())}, nil
}

// aptArchiveDir is where apt keeps the .deb files it downloaded; using them
// saves a download on hosts that installed the packages already.
const aptArchiveDir = "/var/cache/apt/archives"

// rootfs unpacks the packages and lays out the image's files.
func (b *Builder) rootfs(ctx context.Context) ([]Entry, error) {
	cache, temporary, err := b.cacheDir()
	if err != nil {
		return nil, err
	}
	if temporary {
		defer os.RemoveAll(cache)
	}
	d := &debs{
		cache:     cache,
		temporary: temporary,
		archives:  b.trustedArchives(aptArchiveDir),
		arch:      hostDebArch(ctx),
		uid:       os.Getuid(),
		download:  aptGetDownload,
		index:     aptIndex,
		progress:  b.progress,
	}
	return d.rootfs(ctx)
}

// CacheDir is where a Builder without a CacheDir keeps .deb files: in the
// user's cache directory. What is there goes into the base image and runs
// on the host during a build, so no sandbox may see it.
func CacheDir() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(base, "sandboxd", "debs"), nil
}

// cacheDir returns the checked, symlink-free directory that .deb files are
// kept in; temporary says it was made for this build only and is to be
// removed after it.
func (b *Builder) cacheDir() (dir string, temporary bool, err error) {
	dir = b.CacheDir
	if dir == "" {
		var uerr error
		dir, uerr = CacheDir()
		if uerr != nil {
			// A shared fallback such as /tmp/sandboxd could be made first by
			// another local user, who would then choose the busybox this
			// process runs and bakes into the image: only a fresh private
			// directory is safe.
			dir, err = os.MkdirTemp("", "sandboxd-debs-")
			if err != nil {
				return "", false, fmt.Errorf("make a private cache dir: %w", err)
			}
			temporary = true
			b.progress("no user cache dir (%v); keeping .deb files in %s for this build only", uerr, dir)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", false, fmt.Errorf("make cache dir: %w", err)
	}
	real, err := checkPrivateDir(dir, os.Getuid())
	if err != nil {
		if temporary {
			os.RemoveAll(dir)
		}
		return "", false, fmt.Errorf("cache dir: %w (use a directory only you can write to)", err)
	}
	return real, temporary, nil
}

// trustedArchives returns dir, resolved, if only root can change what is in
// it, else "" (apt's archive is then not used).
func (b *Builder) trustedArchives(dir string) string {
	real, err := checkPrivateDir(dir, 0)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			b.progress("not using apt's archive: %v", err)
		}
		return ""
	}
	return real
}
