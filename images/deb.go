package images

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/hostpath"
)

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

// unpack unpacks pkg's .deb into dest, from the cache or apt's archive if
// there, else downloaded. With apt's index at hand, only the .deb it names
// for pkg is used, its size and hash checked.
func (d *debs) unpack(ctx context.Context, pkg, dest string) error {
	// Checked against the index, what goes into the image, and runs on the
	// host while it is built, is what Debian signed, and an update apt
	// knows of replaces what the cache holds.
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
// signatures. It reads only the local lists.
func aptIndex(ctx context.Context, pkg string) (debInfo, error) {
	// apt runs in an empty directory of its own: apt-get download takes its
	// working directory for its archive, and says nothing of a package
	// whose file of the right name and size lies there, which anyone who
	// can write where sandboxd runs (a workspace) could put.
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
func (d *debs) fetch(ctx context.Context, pkg string) (string, error) {
	d.progress("downloading %s with apt-get", pkg)
	// apt-get writes the file under its final name as the bytes arrive, so
	// it downloads into a directory of its own and the finished file is
	// renamed into the cache: another build reading the cache meanwhile
	// (two sandboxd starting at once) would otherwise take the half-written
	// file for a damaged one and remove it under this download.
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
