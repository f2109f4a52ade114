package images

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
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
