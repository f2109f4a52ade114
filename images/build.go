package images

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
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
	// the user cache directory.
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
		if client.IsErrConnectionFailed(err) {
			return fmt.Errorf("inspect image %s: %w (is the Docker Engine running? start it with `sudo systemctl start docker`, or point DOCKER_HOST at a running engine)", ref, err)
		}
		return fmt.Errorf("inspect image %s: %w", ref, err)
	}
	if ref != DefaultRef {
		return fmt.Errorf("image %s is missing and no registry can be pulled from: build it with `docker build -t %s`, load it with `docker load`, or use the default image %s (`sandboxd image build`)", ref, ref, DefaultRef)
	}
	b.progress("image %s not found; building it now (once)", ref)
	_, err = b.Build(ctx, ref)
	return err
}

// Build makes the base image's root filesystem from Debian packages and
// loads it into the engine tagged ref. Building twice from the same packages
// gives the same layer digest and the same image id.
func (b *Builder) Build(ctx context.Context, ref string) (Result, error) {
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

// rootfs unpacks the packages and lays out the image's files.
func (b *Builder) rootfs(ctx context.Context) ([]Entry, error) {
	staging, err := os.MkdirTemp("", "sandboxd-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(staging)
	for _, pkg := range Packages() {
		deb, err := b.deb(ctx, pkg)
		if err != nil {
			return nil, err
		}
		if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", deb, staging).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("unpack %s: %v: %s", filepath.Base(deb), err, out)
		}
	}
	busybox, err := os.ReadFile(filepath.Join(staging, "bin", "busybox"))
	if err != nil {
		return nil, fmt.Errorf("busybox-static: %w", err)
	}
	bash, err := os.ReadFile(filepath.Join(staging, "bin", "bash-static"))
	if err != nil {
		return nil, fmt.Errorf("bash-static: %w", err)
	}
	// The static busybox runs on the host too; ask it for its applets.
	list, err := exec.CommandContext(ctx, filepath.Join(staging, "bin", "busybox"), "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("list busybox applets: %w", err)
	}
	return layout(busybox, bash, strings.Fields(string(list))), nil
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

// deb returns the path of a package's .deb: from the cache, from apt's own
// archive, or downloaded with apt-get into the cache.
func (b *Builder) deb(ctx context.Context, pkg string) (string, error) {
	dir := b.CacheDir
	if dir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		dir = filepath.Join(base, "sandboxd", "debs")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for _, d := range []string{dir, "/var/cache/apt/archives"} {
		if m, _ := filepath.Glob(filepath.Join(d, pkg+"_*_"+debArch()+".deb")); len(m) > 0 {
			sort.Strings(m)
			return m[len(m)-1], nil
		}
	}
	b.progress("downloading %s with apt-get", pkg)
	cmd := exec.CommandContext(ctx, "apt-get", "download", pkg)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return "", fmt.Errorf("download %s: apt-get is not installed; put %s_*.deb in %s", pkg, pkg, dir)
		}
		return "", fmt.Errorf("download %s: %v: %s (if the package is unknown, run `apt-get update` first)", pkg, err, bytes.TrimSpace(out))
	}
	m, _ := filepath.Glob(filepath.Join(dir, pkg+"_*_"+debArch()+".deb"))
	if len(m) == 0 {
		return "", fmt.Errorf("download %s: apt-get left no .deb in %s", pkg, dir)
	}
	sort.Strings(m)
	return m[len(m)-1], nil
}

func debArch() string {
	if runtime.GOARCH == "arm" {
		return "armhf"
	}
	return runtime.GOARCH
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
