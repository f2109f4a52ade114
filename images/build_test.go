package images

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
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

// TestBuildTwiceIsIdentical builds the real image twice from Debian's
// packages and runs a container from it.
func TestBuildTwiceIsIdentical(t *testing.T) {
	ctx := context.Background()
	cli, err := client.New(client.FromEnv)
	if err == nil {
		_, err = cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true})
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("Docker Engine unreachable under CI=true: %v", err)
		}
		t.Skipf("Docker Engine unreachable: %v", err)
	}
	const ref = "sandboxd/base-test:build-twice"
	b := Builder{Client: cli}
	first, err := b.Build(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cli.ImageRemove(context.Background(), ref, client.ImageRemoveOptions{Force: true, PruneChildren: true})
	})
	second, err := b.Build(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if first.LayerDigest != second.LayerDigest || first.ID != second.ID {
		t.Errorf("builds differ: %+v vs %+v", first, second)
	}
	img, err := cli.ImageInspect(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if img.ID != first.ID || len(img.RootFS.Layers) != 1 || img.RootFS.Layers[0] != first.LayerDigest {
		t.Errorf("engine sees id %s layers %v; built %+v", img.ID, img.RootFS.Layers, first)
	}

	c, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config:     &container.Config{Image: ref, User: "65534:65534", Cmd: []string{"/bin/sh", "-c", `ps -o pid,args >/dev/null && bash -c 'echo "bash ${BASH_VERSINFO[0]}"' && id -u && env | grep -c PATH`}},
		HostConfig: &container.HostConfig{ReadonlyRootfs: true, CapDrop: []string{"ALL"}, NetworkMode: "none"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.ContainerRemove(context.Background(), c.ID, client.ContainerRemoveOptions{Force: true})
	if _, err := cli.ContainerStart(ctx, c.ID, client.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}
	res := cli.ContainerWait(ctx, c.ID, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	select {
	case st := <-res.Result:
		if st.StatusCode != 0 {
			t.Errorf("container exited %d", st.StatusCode)
		}
	case err := <-res.Error:
		t.Fatal(err)
	}
	logs, err := cli.ContainerLogs(ctx, c.ID, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	var out bytes.Buffer
	io.Copy(&out, logs)
	if !strings.Contains(out.String(), "bash 5") || !strings.Contains(out.String(), "65534") {
		t.Errorf("container output = %q", out.String())
	}
}
