package images

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/distribution/reference"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/hostpath"
	"github.com/sandboxd/sandboxd/sandbox"
)

// DefaultRef is the base image sessions run unless configured otherwise.
const DefaultRef = "sandboxd/base:1"

// Packages returns the Debian packages the base image is made of: a static
// busybox gives the POSIX shell and coreutils-level tools (ps, kill, grep,
// stty ...), a static bash gives the shell that AHP command detection needs.
func Packages() []string { return []string{"busybox-static", "bash-static"} }

// Builder builds the base image and loads it into the engine.
type Builder struct {
	Client *client.Client
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
	if !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("inspect image %s: %w", ref, sandbox.EngineError(err))
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
	if _, err := b.Client.Ping(ctx, client.PingOptions{}); err != nil {
		return Result{}, fmt.Errorf("build image %s: %w", ref, sandbox.EngineError(err))
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
	resp, err := b.Client.ImageLoad(ctx, bytes.NewReader(archive), client.ImageLoadWithQuiet(true))
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

// checkPrivateDir refuses dir unless it is a directory nobody but uid
// (and root) can change (hostpath.CheckPrivate): the .deb files in it are
// unpacked and their busybox is run on the host. It returns dir absolute
// and with its links resolved.
func checkPrivateDir(dir string, uid int) (string, error) {
	real, err := hostpath.CheckPrivate(dir, uid)
	if err != nil {
		return "", err
	}
	if fi, err := os.Stat(real); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("refusing %s: not a directory", dir)
	}
	return real, nil
}

// checkDeb refuses a .deb that is not a regular file owned by uid and
// writable by nobody else, since its contents end up run on the host.
func checkDeb(path string, uid int) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("refusing %s: not a regular file", path)
	}
	if owner := hostpath.Owner(fi); owner != uid {
		return fmt.Errorf("refusing %s: owned by uid %d, not by uid %d", path, owner, uid)
	}
	if fi.Mode().Perm()&0o002 != 0 {
		return fmt.Errorf("refusing %s: writable by others (mode %04o)", path, fi.Mode().Perm())
	}
	return nil
}

// debs finds, checks, downloads and unpacks the .deb files of one build.
type debs struct {
	cache     string // checked by checkPrivateDir
	temporary bool   // cache is removed after the build
	archives  string // apt's archive if trusted, or ""
	arch      string // Debian architecture, e.g. "amd64"
	uid       int    // who must own the files in cache
	// download puts pkg's .deb into dir; tests replace apt-get with it.
	download func(ctx context.Context, dir, pkg string) error
	// index names the .deb apt would fetch for pkg, with its size and
	// hash from apt's signed lists; nil, or an error, leaves the cache
	// unchecked (a cache filled by hand on a host without apt).
	index    func(ctx context.Context, pkg string) (debInfo, error)
	progress func(format string, args ...any)
}

// debInfo is a .deb as apt's index describes it.
type debInfo struct {
	Name string // file name, as apt-get download writes it
	Size int64
	// Hash is the strongest hash the index gives, hex: SHA256 (Debian)
	// or SHA512 (lists that carry it, as Ubuntu's may).
	Hash   string
	SHA512 bool
}

// leftoverAge is how old a staging or download directory in the cache must
// be to count as left by a build that was killed: one under way now, in
// another process, is younger.
const leftoverAge = time.Hour

// sweepLeftovers removes what builds that were killed left in the cache.
func (d *debs) sweepLeftovers() {
	for _, pattern := range []string{".staging-*", ".download-*"} {
		dirs, _ := filepath.Glob(filepath.Join(d.cache, pattern))
		for _, dir := range dirs {
			if fi, err := os.Lstat(dir); err == nil && fi.IsDir() && time.Since(fi.ModTime()) > leftoverAge {
				os.RemoveAll(dir)
			}
		}
	}
}

// rootfs unpacks the packages and lays out the image's files.
func (d *debs) rootfs(ctx context.Context) ([]Entry, error) {
	d.sweepLeftovers()
	// The cache is private and checked, and unlike TMPDIR it is seldom on
	// a noexec mount, where the staged busybox could not be run.
	staging, err := os.MkdirTemp(d.cache, ".staging-")
	if err != nil {
		// For instance a read-only cache filled in advance.
		staging, err = os.MkdirTemp("", "sandboxd-image-")
		if err != nil {
			return nil, fmt.Errorf("make staging dir: %w", err)
		}
	}
	defer os.RemoveAll(staging)
	for _, pkg := range Packages() {
		if err := d.unpack(ctx, pkg, filepath.Join(staging, pkg)); err != nil {
			return nil, err
		}
	}
	busyboxPath, err := findBinary(filepath.Join(staging, "busybox-static"), "busybox")
	if err != nil {
		return nil, fmt.Errorf("busybox-static: %w", err)
	}
	bashPath, err := findBinary(filepath.Join(staging, "bash-static"), "bash-static")
	if err != nil {
		return nil, fmt.Errorf("bash-static: %w", err)
	}
	busybox, err := os.ReadFile(busyboxPath)
	if err != nil {
		return nil, fmt.Errorf("busybox-static: %w", err)
	}
	bash, err := os.ReadFile(bashPath)
	if err != nil {
		return nil, fmt.Errorf("bash-static: %w", err)
	}
	applets, err := listApplets(ctx, busyboxPath, staging)
	if err != nil {
		return nil, err
	}
	return layout(busybox, bash, applets), nil
}

// findBinary returns the path of name in a package unpacked at root. Debian
// trixie forbids files in /bin, so its packages put them in usr/bin; older
// releases used bin.
func findBinary(root, name string) (string, error) {
	for _, dir := range []string{"usr/bin", "bin"} {
		p := filepath.Join(root, dir, name)
		if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("the package has no regular file usr/bin/%s or bin/%s", name, name)
}

// listApplets asks the staged static busybox, which runs on the host too,
// for its applets.
func listApplets(ctx context.Context, busybox, staging string) ([]string, error) {
	out, err := exec.CommandContext(ctx, busybox, "--list-full").Output()
	if errors.Is(err, syscall.EACCES) {
		return nil, fmt.Errorf("list busybox-static's applets: %w: the staging dir %s is on a noexec mount; set XDG_CACHE_HOME (or Builder.CacheDir) to a directory on a mount that allows running programs", err, staging)
	}
	if err != nil {
		return nil, fmt.Errorf("list busybox-static's applets: %w", err)
	}
	return strings.Fields(string(out)), nil
}

// layout is the base image's file tree: busybox with a link for each
// applet, bash, the usual directories and a passwd naming the users
// sessions run as.
func layout(busybox, bash []byte, applets []string) []Entry {
	entries := []Entry{
		{Path: "/bin/busybox", Mode: 0o755, Data: busybox},
		{Path: "/bin/bash", Mode: 0o755, Data: bash},
		{Path: "/bin/sh", Linkname: "busybox"},
		{Path: "/usr/bin/env", Linkname: "/bin/busybox"},
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000:sandbox:/tmp:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n")},
		{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n")},
		{Path: "/etc/hostname", Mode: 0o644, Data: []byte("sandbox\n")},
		{Path: "/etc/profile", Mode: 0o644, Data: []byte("export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n")},
		{Path: "/tmp", Mode: 0o1777, Dir: true},
		{Path: "/var/tmp", Mode: 0o1777, Dir: true},
		{Path: "/home", Mode: 0o1777, Dir: true},
		{Path: "/run", Mode: 0o755, Dir: true},
		{Path: "/root", Mode: 0o700, Dir: true},
		{Path: "/proc", Mode: 0o555, Dir: true},
		{Path: "/sys", Mode: 0o555, Dir: true},
		{Path: "/dev", Mode: 0o755, Dir: true},
		{Path: "/etc", Mode: 0o755, Dir: true},
		{Path: "/usr/local/bin", Mode: 0o755, Dir: true},
	}
	sort.Strings(applets)
	for _, a := range applets {
		p := "/" + strings.TrimPrefix(a, "/")
		if !strings.HasPrefix(p, "/bin/") && !strings.HasPrefix(p, "/sbin/") && !strings.HasPrefix(p, "/usr/") {
			continue
		}
		// Real files win over applet links (bash, env, sh above).
		entries = append(entries, Entry{Path: p, Linkname: "/bin/busybox"})
	}
	return entries
}

// unpack unpacks pkg's .deb into dest, from the cache or apt's archive if
// there, else downloaded. With apt's index at hand, only the .deb it names
// for pkg is used, its size and hash checked: what goes into the image,
// and runs on the host while it is built, is then what Debian signed, and
// an update apt knows of replaces what the cache holds.
func (d *debs) unpack(ctx context.Context, pkg, dest string) error {
	if d.index != nil {
		info, err := d.index(ctx, pkg)
		if err == nil {
			return d.unpackChecked(ctx, pkg, info, dest)
		}
		if ctx.Err() != nil {
			return err
		}
		d.progress("apt's index does not name %s (%v): the cached .deb is used unchecked", pkg, err)
	}
	deb, err := d.cached(pkg)
	if err != nil {
		return err
	}
	if deb == "" {
		if deb, err = d.fetch(ctx, pkg); err != nil {
			return err
		}
		return extract(ctx, pkg, deb, dest)
	}
	err = extract(ctx, pkg, deb, dest)
	var exit *exec.ExitError
	if err == nil || !errors.As(err, &exit) || ctx.Err() != nil {
		return err
	}
	// A .deb cut short by an interrupted download, say, would otherwise
	// break every build from now on.
	d.progress("%s does not unpack (%v); downloading %s again", deb, err, pkg)
	if filepath.Dir(deb) == d.cache {
		// Another build may have removed it already.
		if err := os.Remove(deb); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("unpack %s: remove the damaged %s: %w", pkg, deb, err)
		}
	}
	if err := os.RemoveAll(dest); err != nil {
		return fmt.Errorf("unpack %s: %w", pkg, err)
	}
	if deb, err = d.fetch(ctx, pkg); err != nil {
		return err
	}
	return extract(ctx, pkg, deb, dest)
}

// unpackChecked unpacks the .deb info names: from the cache or apt's
// archive when one there has its size and hash, else downloaded and
// checked. A file under its name that does not match is removed from the
// cache.
func (d *debs) unpackChecked(ctx context.Context, pkg string, info debInfo, dest string) error {
	dirs := []string{d.cache}
	if d.archives != "" {
		dirs = append(dirs, d.archives)
	}
	for _, dir := range dirs {
		deb := filepath.Join(dir, info.Name)
		if _, err := os.Lstat(deb); err != nil {
			continue
		}
		owner := 0
		if dir == d.cache {
			owner = d.uid
		}
		err := checkDeb(deb, owner)
		if err == nil {
			err = matches(deb, info)
		}
		if err == nil {
			return extract(ctx, pkg, deb, dest)
		}
		d.progress("%s is not the .deb apt's index names (%v)", deb, err)
		if dir == d.cache {
			if err := os.Remove(deb); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("unpack %s: remove %s: %w", pkg, deb, err)
			}
		}
	}
	deb, err := d.fetch(ctx, pkg)
	if err != nil {
		return err
	}
	if err := matches(deb, info); err != nil {
		os.Remove(deb)
		return fmt.Errorf("unpack %s: the download is not what apt's index names: %w", pkg, err)
	}
	return extract(ctx, pkg, deb, dest)
}

// matches checks that the file at path has the size and hash info gives.
func matches(path string, info debInfo) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	if info.SHA512 {
		h = sha512.New()
	}
	n, err := io.Copy(h, f)
	if err != nil {
		return err
	}
	if n != info.Size {
		return fmt.Errorf("%d bytes, want %d", n, info.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != info.Hash {
		return fmt.Errorf("hash %s, want %s", got, info.Hash)
	}
	return nil
}

// aptIndex asks apt which .deb it would download for pkg: its file name,
// size and SHA256, from the package lists apt checked against Debian's
// signatures. It reads only the local lists. apt runs in an empty
// directory of its own: apt-get download takes its working directory for
// its archive, and says nothing of a package whose file of the right name
// and size lies there, which anyone who can write where sandboxd runs (a
// workspace) could put.
func aptIndex(ctx context.Context, pkg string) (debInfo, error) {
	dir, err := os.MkdirTemp("", "sandboxd-apt-")
	if err != nil {
		return debInfo{}, fmt.Errorf("apt-get download --print-uris %s: %w", pkg, err)
	}
	defer os.RemoveAll(dir)
	cmd := exec.CommandContext(ctx, "apt-get", "download", "--print-uris", pkg)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return debInfo{}, fmt.Errorf("apt-get download --print-uris %s: %w", pkg, err)
	}
	return parsePrintURIs(out)
}

// parsePrintURIs reads the line `'URI' NAME SIZE SHA256:HEX` that
// apt-get download --print-uris writes.
func parsePrintURIs(out []byte) (debInfo, error) {
	fields := strings.Fields(string(out))
	if len(fields) != 4 {
		return debInfo{}, fmt.Errorf("apt-get download --print-uris said %.200q, want one line of four fields", out)
	}
	size, err := strconv.ParseInt(fields[2], 10, 64)
	algo, sum, _ := strings.Cut(fields[3], ":")
	info := debInfo{Name: fields[1], Size: size, Hash: strings.ToLower(sum), SHA512: strings.EqualFold(algo, "SHA512")}
	want := sha256.Size * 2
	if info.SHA512 {
		want = sha512.Size * 2
	}
	if err != nil || !info.SHA512 && !strings.EqualFold(algo, "SHA256") || len(sum) != want || info.Name != filepath.Base(info.Name) || !strings.HasSuffix(info.Name, ".deb") {
		return debInfo{}, fmt.Errorf("apt-get download --print-uris said %.200q, want a .deb's name, size and SHA256 or SHA512", out)
	}
	return info, nil
}

func extract(ctx context.Context, pkg, deb, dest string) error {
	if err := os.MkdirAll(dest, 0o700); err != nil {
		return fmt.Errorf("unpack %s: %w", pkg, err)
	}
	out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", deb, dest).CombinedOutput()
	switch {
	case errors.Is(err, exec.ErrNotFound):
		return fmt.Errorf("unpack %s: dpkg-deb is not installed (on Debian or Ubuntu: apt-get install dpkg): %w", pkg, err)
	case err != nil && len(bytes.TrimSpace(out)) > 0:
		return fmt.Errorf("unpack %s: dpkg-deb -x %s: %w: %s", pkg, deb, err, bytes.TrimSpace(out))
	case err != nil:
		return fmt.Errorf("unpack %s: dpkg-deb -x %s: %w", pkg, deb, err)
	}
	return nil
}

// cached returns the newest usable .deb of pkg in the cache or apt's
// archive, the cache's on a tie, or "" if there is none.
func (d *debs) cached(pkg string) (string, error) {
	paths, err := listDebs(d.cache, pkg, d.arch, d.uid, true)
	if err != nil {
		return "", fmt.Errorf("find %s: %w", pkg, err)
	}
	if d.archives != "" {
		// What root did not put there is ignored, not an error: it is
		// apt's directory, not ours.
		more, _ := listDebs(d.archives, pkg, d.arch, 0, false)
		paths = append(paths, more...)
	}
	return newestDeb(paths), nil
}

// fetch downloads pkg into the cache and returns its .deb.
//
// apt-get writes the file under its final name as the bytes arrive, so it
// downloads into a directory of its own and the finished file is renamed
// into the cache: another build reading the cache meanwhile (two sandboxd
// starting at once) would otherwise take the half-written file for a
// damaged one and remove it under this download.
func (d *debs) fetch(ctx context.Context, pkg string) (string, error) {
	d.progress("downloading %s with apt-get", pkg)
	dir, err := os.MkdirTemp(d.cache, ".download-")
	if err != nil {
		return "", fmt.Errorf("download %s: %w", pkg, err)
	}
	defer os.RemoveAll(dir)
	if err := d.download(ctx, dir, pkg); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			if d.temporary {
				return "", fmt.Errorf("download %s: apt-get is not installed; set HOME or XDG_CACHE_HOME and put %s_*_%s.deb in its sandboxd/debs", pkg, pkg, d.arch)
			}
			return "", fmt.Errorf("download %s: apt-get is not installed; put %s_*_%s.deb in %s", pkg, pkg, d.arch, d.cache)
		}
		return "", fmt.Errorf("download %s: %w", pkg, err)
	}
	paths, err := listDebs(dir, pkg, d.arch, d.uid, true)
	if err != nil {
		return "", fmt.Errorf("download %s: %w", pkg, err)
	}
	if len(paths) == 0 {
		return "", fmt.Errorf("download %s: apt-get left no %s_*_%s.deb", pkg, pkg, d.arch)
	}
	deb := filepath.Join(d.cache, filepath.Base(newestDeb(paths)))
	if err := os.Rename(newestDeb(paths), deb); err != nil {
		return "", fmt.Errorf("download %s: %w", pkg, err)
	}
	return deb, nil
}

// aptGetDownload downloads pkg's .deb for the native architecture into dir.
func aptGetDownload(ctx context.Context, dir, pkg string) error {
	cmd := exec.CommandContext(ctx, "apt-get", "download", pkg)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("apt-get download: %w: %s (if the package is unknown, run `apt-get update` first)", err, bytes.TrimSpace(out))
	}
	return nil
}

// listDebs returns the paths of pkg's .deb files for arch in dir that pass
// checkDeb for owner. A file that does not is an error when strict, else
// left out.
func listDebs(dir, pkg, arch string, owner int, strict bool) ([]string, error) {
	// Not filepath.Glob: dir may hold glob metacharacters.
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var paths []string
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, pkg+"_") || !strings.HasSuffix(name, "_"+arch+".deb") {
			continue
		}
		p := filepath.Join(dir, name)
		if err := checkDeb(p, owner); err != nil {
			if strict {
				return nil, err
			}
			continue
		}
		paths = append(paths, p)
	}
	return paths, nil
}

// newestDeb returns the path of the .deb with the highest version, the
// first one of those on a tie, or "" for none.
func newestDeb(paths []string) string {
	best, bestVersion := "", ""
	for _, p := range paths {
		v := debVersion(p)
		if best == "" || compareVersions(v, bestVersion) > 0 {
			best, bestVersion = p, v
		}
	}
	return best
}

// debVersion is the version in a .deb's file name, package_version_arch.deb,
// which apt writes with the epoch's ':' escaped as "%3a".
func debVersion(path string) string {
	parts := strings.Split(strings.TrimSuffix(filepath.Base(path), ".deb"), "_")
	if len(parts) != 3 {
		return ""
	}
	v, err := url.PathUnescape(parts[1])
	if err != nil {
		return parts[1]
	}
	return v
}

// compareVersions compares two Debian versions, [epoch:]upstream[-revision],
// as dpkg does, returning -1, 0 or +1.
func compareVersions(a, b string) int {
	ae, au, ar := splitVersion(a)
	be, bu, br := splitVersion(b)
	if c := compareVersionPart(ae, be); c != 0 {
		return c
	}
	if c := compareVersionPart(au, bu); c != 0 {
		return c
	}
	return compareVersionPart(ar, br)
}

// splitVersion splits at the first ':' and the last '-', as dpkg does.
func splitVersion(v string) (epoch, upstream, revision string) {
	if i := strings.IndexByte(v, ':'); i >= 0 {
		epoch, v = v[:i], v[i+1:]
	}
	if i := strings.LastIndexByte(v, '-'); i >= 0 {
		v, revision = v[:i], v[i+1:]
	}
	return epoch, v, revision
}

// compareVersionPart is dpkg's verrevcmp: runs of non-digits compare char by
// char with '~' before the end of the string, the end before letters and
// letters before other characters; runs of digits compare as numbers (of any
// length).
func compareVersionPart(a, b string) int {
	isDigit := func(c byte) bool { return '0' <= c && c <= '9' }
	order := func(s string, i int) int {
		if i >= len(s) {
			return 0
		}
		switch c := s[i]; {
		case isDigit(c):
			return 0
		case 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
			return int(c)
		case c == '~':
			return -1
		default:
			return int(c) + 256
		}
	}
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		for i < len(a) && !isDigit(a[i]) || j < len(b) && !isDigit(b[j]) {
			if ac, bc := order(a, i), order(b, j); ac != bc {
				return cmp.Compare(ac, bc)
			}
			i++
			j++
		}
		for i < len(a) && a[i] == '0' {
			i++
		}
		for j < len(b) && b[j] == '0' {
			j++
		}
		firstDiff := 0
		for i < len(a) && j < len(b) && isDigit(a[i]) && isDigit(b[j]) {
			if firstDiff == 0 {
				firstDiff = cmp.Compare(a[i], b[j])
			}
			i++
			j++
		}
		if i < len(a) && isDigit(a[i]) {
			return 1
		}
		if j < len(b) && isDigit(b[j]) {
			return -1
		}
		if firstDiff != 0 {
			return firstDiff
		}
	}
	return 0
}

// hostDebArch is the Debian architecture of the packages to use: dpkg's
// native one when dpkg is there, since that is what apt-get downloads;
// otherwise the one this program was built for.
func hostDebArch(ctx context.Context) string {
	if out, err := exec.CommandContext(ctx, "dpkg", "--print-architecture").Output(); err == nil {
		if arch := strings.TrimSpace(string(out)); arch != "" {
			return arch
		}
	}
	return debArch(runtime.GOARCH)
}

// debArch maps a GOARCH to Debian's name for it, where the two differ.
func debArch(goarch string) string {
	switch goarch {
	case "386":
		return "i386"
	case "arm":
		// GOARM=5 builds would match armel, but Debian's arm default is armhf.
		return "armhf"
	case "ppc64le":
		return "ppc64el"
	case "mipsle":
		return "mipsel"
	case "mips64le":
		return "mips64el"
	}
	return goarch
}

// imageArchive wraps a layer into the tar that `docker load` reads, with a
// fixed creation time, so the image id is reproducible. It returns the
// archive and the image id.
func imageArchive(ref, diffID string, layer []byte) ([]byte, string, error) {
	created := epochTime().Format(time.RFC3339)
	cfg, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      created,
		"config": map[string]any{
			"Env": []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			"Cmd": []string{"/bin/sh"},
		},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{diffID}},
		"history": []map[string]string{{"created": created, "created_by": "sandboxd image build: " + strings.Join(Packages(), ", ")}},
	})
	if err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(cfg)
	cfgHex := hex.EncodeToString(sum[:])
	layerName := strings.TrimPrefix(diffID, "sha256:") + "/layer.tar"
	manifest, err := json.Marshal([]map[string]any{{
		"Config":   cfgHex + ".json",
		"RepoTags": []string{ref},
		"Layers":   []string{layerName},
	}})
	if err != nil {
		return nil, "", err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	files := []struct {
		name string
		data []byte
	}{
		{cfgHex + ".json", cfg},
		{layerName, layer},
		{"manifest.json", manifest},
	}
	for _, f := range files {
		hdr := &tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: epochTime(), Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, "", err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, "", err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, "", err
	}
	return buf.Bytes(), "sha256:" + cfgHex, nil
}
