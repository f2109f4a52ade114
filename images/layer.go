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
	"os/exec"
	"path"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"
)

// epoch (2024-01-01T00:00:00Z) is the modification time of every file in
// a built layer and the image's creation time, so that the same inputs
// always give the same bytes.
const epoch = 1704067200

func epochTime() time.Time { return time.Unix(epoch, 0).UTC() }

// Entry is one file, directory or symlink of a root filesystem.
type Entry struct {
	Path     string // absolute, e.g. "/bin/sh"
	Mode     int64  // permission bits, e.g. 0o755
	Dir      bool
	Linkname string // set for a symlink
	Data     []byte // file contents
}

// WriteLayer writes entries as a reproducible layer tar: sorted by path,
// every parent directory present, owned by root, all times the same. It returns
// the layer's digest, "sha256:<hex>", which is also its diff_id.
func WriteLayer(w io.Writer, entries []Entry) (string, error) {
	entries = withParents(entries)
	h := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(w, h))
	for _, e := range entries {
		name := strings.TrimPrefix(e.Path, "/")
		hdr := &tar.Header{
			Name:    name,
			Mode:    e.Mode,
			ModTime: epochTime(),
			Format:  tar.FormatPAX,
		}
		switch {
		case e.Dir:
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
		case e.Linkname != "":
			hdr.Typeflag = tar.TypeSymlink
			hdr.Linkname = e.Linkname
		default:
			hdr.Typeflag = tar.TypeReg
			hdr.Size = int64(len(e.Data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return "", fmt.Errorf("write layer: %s: %w", e.Path, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(e.Data); err != nil {
				return "", fmt.Errorf("write layer: %s: %w", e.Path, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return "", fmt.Errorf("write layer: %w", err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// withParents returns the entries sorted by path, with a directory entry
// (mode 0755) for every parent that has none, and later duplicates dropped.
func withParents(entries []Entry) []Entry {
	byPath := make(map[string]Entry, len(entries))
	for _, e := range entries {
		e.Path = path.Clean("/" + e.Path)
		if _, ok := byPath[e.Path]; !ok {
			byPath[e.Path] = e
		}
	}
	for p := range byPath {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := byPath[d]; !ok {
				byPath[d] = Entry{Path: d, Mode: 0o755, Dir: true}
			}
		}
	}
	delete(byPath, "/")
	out := make([]Entry, 0, len(byPath))
	for _, e := range byPath {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Path, b.Path) })
	return out
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
