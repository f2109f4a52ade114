package images

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
)

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

// A build without a user cache dir (no HOME, no XDG_CACHE_HOME) used the
// shared /tmp/sandboxd/debs, which another user could fill first.
func TestCacheDirWithoutUserCacheIsPrivateAndTemporary(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	t.Setenv("HOME", "")
	t.Setenv("XDG_CACHE_HOME", "")
	// What another user would have prepared at the old fallback.
	planted := filepath.Join(tmp, "sandboxd", "debs")
	if err := os.MkdirAll(planted, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(planted, 0o777)
	var progress bytes.Buffer
	b := Builder{Progress: &progress}
	dir, temporary, err := b.cacheDir()
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if !temporary {
		t.Error("a cache dir made for want of a user cache dir is not temporary")
	}
	if dir == planted || !strings.HasPrefix(dir, tmp+"/") {
		t.Errorf("cache dir = %s, want a fresh dir in %s", dir, tmp)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("cache dir mode = %04o, want 0700", fi.Mode().Perm())
	}
	if !strings.Contains(progress.String(), dir) {
		t.Errorf("progress does not name the cache dir: %q", progress.String())
	}
}

func TestCacheDirRefusesOthersDir(t *testing.T) {
	for _, mode := range []os.FileMode{0o777, 0o707, os.ModeSticky | 0o777} {
		dir := filepath.Join(t.TempDir(), "debs")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		os.Chmod(dir, mode)
		b := Builder{CacheDir: dir}
		if _, _, err := b.cacheDir(); err == nil || !strings.Contains(err.Error(), dir) {
			t.Errorf("mode %04o: err = %v, want a refusal naming %s", mode, err, dir)
		}
	}
	t.Run("default", func(t *testing.T) {
		base := t.TempDir()
		t.Setenv("XDG_CACHE_HOME", base)
		dir := filepath.Join(base, "sandboxd", "debs")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		os.Chmod(dir, 0o777)
		if _, _, err := (&Builder{}).cacheDir(); err == nil || !strings.Contains(err.Error(), dir) {
			t.Errorf("err = %v, want a refusal naming %s", err, dir)
		}
	})
}

func TestTrustedArchives(t *testing.T) {
	dir := t.TempDir()
	var progress bytes.Buffer
	b := Builder{Progress: &progress}
	if got, want := b.trustedArchives(dir), map[bool]string{true: dir, false: ""}[os.Getuid() == 0]; got != want {
		t.Errorf("trustedArchives(%s) = %q, want %q (only root's dir is trusted)", dir, got, want)
	}
	os.Chmod(dir, 0o777)
	if got := b.trustedArchives(dir); got != "" {
		t.Errorf("trustedArchives(world-writable %s) = %q", dir, got)
	}
	if got := b.trustedArchives(filepath.Join(dir, "missing")); got != "" {
		t.Errorf("trustedArchives(missing) = %q", got)
	}
}

// TestBuildChecksFirst: a reference the engine would refuse, or an engine
// that is not there, fails the build before any work, with the reason.
func TestBuildChecksFirst(t *testing.T) {
	cli, err := client.New(client.WithHost("unix:///nonexistent/docker.sock"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ ref, want string }{
		{"Not/Lower:1", "must be lowercase"},
		{DefaultRef, "is the Docker Engine running?"},
	} {
		var progress bytes.Buffer
		b := Builder{Client: cli, Progress: &progress}
		_, err := b.Build(context.Background(), tc.ref)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Build(%q) = %v, want an error saying %q", tc.ref, err, tc.want)
		}
		if progress.Len() > 0 {
			t.Errorf("Build(%q) started work: %q", tc.ref, progress.String())
		}
	}
}

// TestTagOf: a name alone is loaded as :latest, as the engine reads it; a
// digest or a name the engine would not take is refused before any work.
func TestTagOf(t *testing.T) {
	for _, tc := range []struct {
		ref, want, err string
	}{
		{ref: "myimg", want: "myimg:latest"},
		{ref: "myimg:1", want: "myimg:1"},
		{ref: "sandboxd/base:bookworm", want: "sandboxd/base:bookworm"},
		{ref: "localhost:5000/x", want: "localhost:5000/x:latest"},
		{ref: "docker.io/library/img:2", want: "img:2"},
		{ref: "img@sha256:" + strings.Repeat("a", 64), err: "digest"},
		{ref: "Upper", err: "must be lowercase"},
		{ref: "", err: "invalid reference"},
	} {
		got, err := tagOf(tc.ref)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("tagOf(%q) = %q, %v; want an error with %q", tc.ref, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("tagOf(%q) = %q, %v; want %q", tc.ref, got, err, tc.want)
		}
	}
}
