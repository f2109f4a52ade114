package images

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteLayerIsReproducible(t *testing.T) {
	entries := []Entry{
		{Path: "/usr/bin/tool", Mode: 0o755, Data: []byte("#!/bin/sh\n")},
		{Path: "/bin/sh", Linkname: "busybox"},
		{Path: "/tmp", Mode: 0o1777, Dir: true},
		{Path: "/bin/busybox", Mode: 0o755, Data: []byte("elf")},
		{Path: "/bin/sh", Linkname: "ignored duplicate"},
	}
	var a, b bytes.Buffer
	da, err := WriteLayer(&a, entries)
	if err != nil {
		t.Fatal(err)
	}
	// Order of the input must not matter.
	reversed := make([]Entry, len(entries)-1)
	for i, e := range entries[:len(entries)-1] {
		reversed[len(reversed)-1-i] = e
	}
	db, err := WriteLayer(&b, reversed)
	if err != nil {
		t.Fatal(err)
	}
	if da != db || !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatalf("two writes differ: %s vs %s", da, db)
	}
	tr := tar.NewReader(&a)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if !h.ModTime.Equal(epochTime()) || h.Uid != 0 || h.Gid != 0 || h.Uname != "" {
			t.Errorf("%s: mtime %v uid %d gid %d uname %q", h.Name, h.ModTime, h.Uid, h.Gid, h.Uname)
		}
		switch h.Name {
		case "bin/sh":
			if h.Typeflag != tar.TypeSymlink || h.Linkname != "busybox" {
				t.Errorf("bin/sh = %c -> %q", h.Typeflag, h.Linkname)
			}
		case "tmp/":
			if h.Mode != 0o1777 {
				t.Errorf("tmp mode = %o", h.Mode)
			}
		case "usr/bin/tool":
			if h.Mode != 0o755 {
				t.Errorf("tool mode = %o", h.Mode)
			}
		}
	}
	want := "bin/ bin/busybox bin/sh tmp/ usr/ usr/bin/ usr/bin/tool"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("entries = %s, want %s (sorted, parents added)", got, want)
	}
}

func TestLayoutKeepsRealFilesOverApplets(t *testing.T) {
	entries := withParents(layout([]byte("bb"), []byte("bash"), []string{"bin/sh", "usr/bin/env", "bin/ls", "usr/bin/bash", "linuxrc"}))
	got := map[string]Entry{}
	for _, e := range entries {
		got[e.Path] = e
	}
	if got["/bin/sh"].Linkname != "busybox" || string(got["/bin/bash"].Data) != "bash" || got["/bin/ls"].Linkname != "/bin/busybox" {
		t.Errorf("layout: sh %+v bash %q ls %+v", got["/bin/sh"], got["/bin/bash"].Data, got["/bin/ls"])
	}
	if _, ok := got["/linuxrc"]; ok {
		t.Error("an applet outside bin and usr was linked")
	}
}

// On a noexec mount the staged busybox cannot run; the error says so.
func TestListAppletsSaysNoexec(t *testing.T) {
	staging := t.TempDir()
	busybox := filepath.Join(staging, "busybox-static", "usr", "bin", "busybox")
	// Not executable fails with EACCES as a noexec mount does.
	write(t, busybox, "#!/bin/sh\necho /bin/ls\n", 0o644)
	_, err := listApplets(context.Background(), busybox, staging)
	if err == nil || !strings.Contains(err.Error(), "noexec") || !strings.Contains(err.Error(), staging) {
		t.Errorf("err = %v, want one saying %s is on a noexec mount", err, staging)
	}
}
