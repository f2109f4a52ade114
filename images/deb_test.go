package images

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestCheckPrivateDir(t *testing.T) {
	uid := os.Getuid()
	mkdir := func(t *testing.T, p string, mode os.FileMode) string {
		t.Helper()
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	chown := func(t *testing.T, p string) {
		t.Helper()
		if uid != 0 {
			t.Skip("needs root to give a file to another user")
		}
		if err := os.Chown(p, 4242, 4242); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name    string
		setup   func(t *testing.T, base string) (dir, real string)
		wantErr string // "" for accepted
	}{
		{"private", func(t *testing.T, base string) (string, string) {
			d := mkdir(t, base+"/d", 0o700)
			return d, d
		}, ""},
		{"readable by others", func(t *testing.T, base string) (string, string) {
			d := mkdir(t, base+"/d", 0o755)
			return d, d
		}, ""},
		{"group-writable (a private group per user, umask 002)", func(t *testing.T, base string) (string, string) {
			d := mkdir(t, base+"/d", 0o770)
			return d, d
		}, ""},
		{"world-writable", func(t *testing.T, base string) (string, string) {
			return mkdir(t, base+"/d", 0o707), ""
		}, "writable by others"},
		{"sticky world-writable", func(t *testing.T, base string) (string, string) {
			return mkdir(t, base+"/d", os.ModeSticky|0o777), ""
		}, "writable by others"},
		{"parent world-writable", func(t *testing.T, base string) (string, string) {
			mkdir(t, base+"/open", 0o777)
			return mkdir(t, base+"/open/d", 0o700), ""
		}, "parent"},
		{"parent sticky", func(t *testing.T, base string) (string, string) {
			mkdir(t, base+"/shared", os.ModeSticky|0o777)
			d := mkdir(t, base+"/shared/d", 0o700)
			return d, d
		}, ""},
		{"symlink to a private dir", func(t *testing.T, base string) (string, string) {
			d := mkdir(t, base+"/d", 0o700)
			if err := os.Symlink(d, base+"/link"); err != nil {
				t.Fatal(err)
			}
			return base + "/link", d
		}, ""},
		{"symlink to an open dir", func(t *testing.T, base string) (string, string) {
			d := mkdir(t, base+"/d", 0o777)
			if err := os.Symlink(d, base+"/link"); err != nil {
				t.Fatal(err)
			}
			return base + "/link", ""
		}, "writable by others"},
		{"not a dir", func(t *testing.T, base string) (string, string) {
			if err := os.WriteFile(base+"/f", nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return base + "/f", ""
		}, "not a directory"},
		{"missing", func(t *testing.T, base string) (string, string) {
			return base + "/missing", ""
		}, "no such file"},
		{"owned by another user", func(t *testing.T, base string) (string, string) {
			d := mkdir(t, base+"/d", 0o700)
			chown(t, d)
			return d, ""
		}, "owned by uid 4242"},
		{"parent owned by another user", func(t *testing.T, base string) (string, string) {
			p := mkdir(t, base+"/theirs", 0o755)
			d := mkdir(t, p+"/d", 0o700)
			chown(t, p)
			return d, ""
		}, "parent"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, err := filepath.EvalSymlinks(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			dir, want := tt.setup(t, base)
			got, err := checkPrivateDir(dir, uid)
			if tt.wantErr == "" {
				if err != nil || got != want {
					t.Errorf("checkPrivateDir(%s) = %q, %v; want %q", dir, got, err, want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("checkPrivateDir(%s) err = %v, want one saying %q", dir, err, tt.wantErr)
			}
		})
	}
}

func TestCheckDeb(t *testing.T) {
	uid := os.Getuid()
	tests := []struct {
		name    string
		setup   func(t *testing.T, p string)
		wantErr string
	}{
		{"own regular file", func(t *testing.T, p string) { write(t, p, "deb", 0o644) }, ""},
		{"writable by others", func(t *testing.T, p string) { write(t, p, "deb", 0o666) }, "writable by others"},
		{"symlink", func(t *testing.T, p string) {
			write(t, p+".real", "deb", 0o644)
			if err := os.Symlink(p+".real", p); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file"},
		{"directory", func(t *testing.T, p string) {
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file"},
		{"another user's", func(t *testing.T, p string) {
			if uid != 0 {
				t.Skip("needs root to give a file to another user")
			}
			write(t, p, "deb", 0o644)
			if err := os.Chown(p, 4242, 4242); err != nil {
				t.Fatal(err)
			}
		}, "owned by uid 4242"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "busybox-static_1.0-1_amd64.deb")
			tt.setup(t, p)
			err := checkDeb(p, uid)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), p)) {
				t.Errorf("checkDeb = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// A .deb in the cache that someone else could have written is refused, not
// unpacked and run; one in apt's archive that root did not write is skipped.
func TestCachedRefusesUnsafeDeb(t *testing.T) {
	cache, archives := t.TempDir(), t.TempDir()
	planted := filepath.Join(cache, "busybox-static_1%3a9.9-1_amd64.deb")
	write(t, planted, "evil", 0o666)
	d := &debs{cache: cache, arch: "amd64", uid: os.Getuid()}
	if deb, err := d.cached("busybox-static"); err == nil || !strings.Contains(err.Error(), planted) || !strings.Contains(err.Error(), "busybox-static") {
		t.Errorf("cached = %q, %v; want a refusal naming %s", deb, err, planted)
	}

	os.Remove(planted)
	write(t, filepath.Join(archives, "busybox-static_1%3a9.9-1_amd64.deb"), "not root's", 0o666)
	d.archives = archives
	if deb, err := d.cached("busybox-static"); err != nil || deb != "" {
		t.Errorf("cached = %q, %v; want nothing", deb, err)
	}
}

// makeDeb builds a .deb at path holding files (path in the package -> body,
// all mode 0755).
func makeDeb(t *testing.T, path, pkg string, files map[string]string) {
	t.Helper()
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("dpkg-deb is not installed")
	}
	root := t.TempDir()
	write(t, filepath.Join(root, "DEBIAN", "control"), fmt.Sprintf("Package: %s\nVersion: 1.0-1\nArchitecture: all\nMaintainer: test <test@example.org>\nDescription: test\n", pkg), 0o644)
	for name, body := range files {
		write(t, filepath.Join(root, name), body, 0o755)
	}
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "-Zgzip", "--build", root, path).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build: %v: %s", err, out)
	}
}

func write(t *testing.T, path, body string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// A truncated .deb in the cache broke every later build.
func TestUnpackDownloadsADamagedDebAgain(t *testing.T) {
	const name = "busybox-static_1%3a1.36.1-9_amd64.deb"
	good := filepath.Join(t.TempDir(), name)
	makeDeb(t, good, "busybox-static", map[string]string{"usr/bin/busybox": "bb"})
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	damaged := data[:len(data)/2]
	tests := []struct {
		name       string
		cached     []byte // nil: nothing cached
		downloaded []byte
		wantErr    bool
		wantCalls  int
	}{
		{"damaged cached deb", damaged, data, false, 1},
		{"damaged twice", damaged, damaged, true, 1},
		{"good cached deb", data, nil, false, 0},
		{"damaged download", nil, damaged, true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cache, dest := t.TempDir(), filepath.Join(t.TempDir(), "busybox-static")
			if tt.cached != nil {
				write(t, filepath.Join(cache, name), string(tt.cached), 0o644)
			}
			calls := 0
			var progress strings.Builder
			d := &debs{
				cache: cache, arch: "amd64", uid: os.Getuid(),
				download: func(ctx context.Context, dir, pkg string) error {
					calls++
					if _, err := os.Stat(filepath.Join(cache, name)); err == nil {
						t.Errorf("the damaged .deb is still in %s when downloading again", cache)
					}
					return os.WriteFile(filepath.Join(dir, name), tt.downloaded, 0o644)
				},
				progress: func(format string, args ...any) { fmt.Fprintf(&progress, format+"\n", args...) },
			}
			err := d.unpack(context.Background(), "busybox-static", dest)
			if calls != tt.wantCalls {
				t.Errorf("downloads = %d, want %d", calls, tt.wantCalls)
			}
			if tt.wantErr {
				if err == nil || !strings.Contains(err.Error(), "unpack busybox-static") {
					t.Errorf("err = %v, want an unpack error naming the package", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(dest, "usr", "bin", "busybox")); err != nil || string(b) != "bb" {
				t.Errorf("unpacked busybox = %q, %v", b, err)
			}
			if tt.wantCalls > 0 && !strings.Contains(progress.String(), "again") {
				t.Errorf("progress does not say it downloads again: %q", progress.String())
			}
		})
	}
}

// TestFetchShowsOnlyWholeDebs: a build reading the cache while another
// downloads (two sandboxd starting at once) must not find the half-written
// file, which it would take for a damaged one and remove.
func TestFetchShowsOnlyWholeDebs(t *testing.T) {
	const name = "busybox-static_1%3a1.36.1-9_amd64.deb"
	src := filepath.Join(t.TempDir(), name)
	makeDeb(t, src, "busybox-static", map[string]string{"usr/bin/busybox": "bb"})
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	other := &debs{cache: cache, arch: "amd64", uid: os.Getuid()}
	d := &debs{
		cache: cache, arch: "amd64", uid: os.Getuid(),
		download: func(ctx context.Context, dir, pkg string) error {
			f, err := os.Create(filepath.Join(dir, name))
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := f.Write(data[:len(data)/2]); err != nil {
				return err
			}
			if deb, err := other.cached(pkg); err != nil || deb != "" {
				t.Errorf("while downloading, another build finds %q, %v in the cache; want nothing", deb, err)
			}
			_, err = f.Write(data[len(data)/2:])
			return err
		},
		progress: func(string, ...any) {},
	}
	deb, err := d.fetch(context.Background(), "busybox-static")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(cache, name); deb != want {
		t.Errorf("fetch = %s, want %s", deb, want)
	}
	if got, err := os.ReadFile(deb); err != nil || !bytes.Equal(got, data) {
		t.Errorf("the cached .deb is not the whole download (%d of %d bytes, %v)", len(got), len(data), err)
	}
	if ents, _ := os.ReadDir(cache); len(ents) != 1 {
		t.Errorf("the cache holds %d entries after the download, want only the .deb", len(ents))
	}
}

func TestNewestDeb(t *testing.T) {
	tests := []struct {
		paths []string
		want  string
	}{
		{nil, ""},
		{[]string{"/c/busybox-static_1%3a1.36.1-9_amd64.deb", "/c/busybox-static_1%3a1.36.1-10_amd64.deb"}, "/c/busybox-static_1%3a1.36.1-10_amd64.deb"},
		{[]string{"/c/busybox-static_1%3a1.35.0-4+deb12u1+b1_amd64.deb", "/c/busybox-static_1.37.0-1_amd64.deb"}, "/c/busybox-static_1%3a1.35.0-4+deb12u1+b1_amd64.deb"},
		{[]string{"/c/bash-static_5.2.15-2+b13_amd64.deb", "/c/bash-static_5.2.15-2_amd64.deb"}, "/c/bash-static_5.2.15-2+b13_amd64.deb"},
		// On a tie the first wins: the cache is listed before apt's archive.
		{[]string{"/cache/bash-static_5.2-1_amd64.deb", "/apt/bash-static_5.2-1_amd64.deb"}, "/cache/bash-static_5.2-1_amd64.deb"},
	}
	for _, tt := range tests {
		if got := newestDeb(tt.paths); got != tt.want {
			t.Errorf("newestDeb(%q) = %q, want %q", tt.paths, got, tt.want)
		}
	}
}

func TestFindBinary(t *testing.T) {
	tests := []struct {
		name  string
		files []string // "x" a file, "x->y" a symlink
		want  string   // "" for an error
	}{
		{"trixie: usr/bin only", []string{"usr/bin/busybox"}, "usr/bin/busybox"},
		{"bookworm: bin only", []string{"bin/busybox"}, "bin/busybox"},
		{"both", []string{"bin/busybox", "usr/bin/busybox"}, "usr/bin/busybox"},
		{"usr/bin a symlink", []string{"bin/busybox", "usr/bin/busybox->/bin/busybox"}, "bin/busybox"},
		{"neither", []string{"sbin/busybox"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for _, f := range tt.files {
				name, target, link := strings.Cut(f, "->")
				p := filepath.Join(root, name)
				if !link {
					write(t, p, "bb", 0o755)
					continue
				}
				os.MkdirAll(filepath.Dir(p), 0o755)
				if err := os.Symlink(target, p); err != nil {
					t.Fatal(err)
				}
			}
			got, err := findBinary(root, "busybox")
			if tt.want == "" {
				if err == nil {
					t.Errorf("findBinary = %s, want an error", got)
				}
				return
			}
			if err != nil || got != filepath.Join(root, tt.want) {
				t.Errorf("findBinary = %q, %v; want %s", got, err, tt.want)
			}
		})
	}
}

func TestDebArch(t *testing.T) {
	for goarch, want := range map[string]string{
		"amd64": "amd64", "arm64": "arm64", "386": "i386", "arm": "armhf",
		"ppc64le": "ppc64el", "mips64le": "mips64el", "mipsle": "mipsel",
		"mips": "mips", "mips64": "mips64", "s390x": "s390x", "riscv64": "riscv64", "loong64": "loong64",
	} {
		if got := debArch(goarch); got != want {
			t.Errorf("debArch(%s) = %s, want %s", goarch, got, want)
		}
	}
	if out, err := exec.Command("dpkg", "--print-architecture").Output(); err == nil {
		if got, want := hostDebArch(context.Background()), strings.TrimSpace(string(out)); got != want {
			t.Errorf("hostDebArch = %s, dpkg says %s", got, want)
		}
	} else if got := hostDebArch(context.Background()); got != debArch(runtime.GOARCH) {
		t.Errorf("hostDebArch without dpkg = %s", got)
	}
}

// The whole unpacking with trixie's layout (usr/bin only), staged in the
// cache dir rather than TMPDIR.
func TestRootfsFromUsrBinPackagesStagesInCache(t *testing.T) {
	cache, witness := t.TempDir(), filepath.Join(t.TempDir(), "ran")
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	var downloaded []string
	d := &debs{
		cache: cache, arch: "amd64", uid: os.Getuid(),
		download: func(ctx context.Context, dir, pkg string) error {
			downloaded = append(downloaded, pkg)
			files := map[string]string{
				"usr/bin/busybox":     "#!/bin/sh\necho \"$0\" >" + witness + "\necho /bin/ls /usr/bin/env /sbin/ip /linuxrc\n",
				"usr/bin/bash-static": "bash",
			}
			makeDeb(t, filepath.Join(dir, pkg+"_1%3a1.0-1_amd64.deb"), pkg, files)
			return nil
		},
		progress: func(string, ...any) {},
	}
	entries, err := d.rootfs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(downloaded, Packages()) {
		t.Errorf("downloaded %v, want %v", downloaded, Packages())
	}
	ran, err := os.ReadFile(witness)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(ran), cache+"/") {
		t.Errorf("busybox ran as %s, want it staged in the cache dir %s", ran, cache)
	}
	got := map[string]Entry{}
	for _, e := range entries {
		got[e.Path] = e
	}
	if got["/bin/ls"].Linkname != "/bin/busybox" || got["/sbin/ip"].Linkname != "/bin/busybox" || string(got["/bin/bash"].Data) != "bash" || !strings.HasPrefix(string(got["/bin/busybox"].Data), "#!/bin/sh") {
		t.Errorf("entries: ls %+v ip %+v bash %q busybox %q", got["/bin/ls"], got["/sbin/ip"], got["/bin/bash"].Data, got["/bin/busybox"].Data)
	}
	if ents, _ := os.ReadDir(cache); len(ents) != len(Packages()) {
		t.Errorf("cache holds %d entries after the build, want the %d .deb files only (staging removed)", len(ents), len(Packages()))
	}
	if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
		t.Errorf("TMPDIR holds %d entries; staging should not be there", len(ents))
	}
}

// TestSweepLeftovers: staging and download directories a killed build left
// in the cache go at the next build; those of a build under way, younger,
// and anything else stay.
func TestSweepLeftovers(t *testing.T) {
	cache := t.TempDir()
	old := time.Now().Add(-2 * leftoverAge)
	for name, age := range map[string]time.Time{
		".staging-old": old, ".download-old": old,
		".staging-new": time.Now(), ".download-new": time.Now(),
		"keep-old": old,
	} {
		dir := filepath.Join(cache, name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(dir, age, age); err != nil {
			t.Fatal(err)
		}
	}
	(&debs{cache: cache}).sweepLeftovers()
	entries, err := os.ReadDir(cache)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if want := []string{".download-new", ".staging-new", "keep-old"}; !slices.Equal(left, want) {
		t.Errorf("left %q, want %q", left, want)
	}
}

// TestUnpackTakesOnlyWhatAptsIndexNames: with apt's index at hand, the
// .deb it names is used, checked: a higher version planted in the cache is
// not, nor a file under the right name with other bytes (it is removed and
// downloaded again), nor a download that does not match.
func TestUnpackTakesOnlyWhatAptsIndexNames(t *testing.T) {
	const name = "busybox-static_1%3a1.36.1-9_amd64.deb"
	const planted = "busybox-static_1%3a99.0-1_amd64.deb"
	dir := t.TempDir()
	good, evil := filepath.Join(dir, "good.deb"), filepath.Join(dir, "evil.deb")
	makeDeb(t, good, "busybox-static", map[string]string{"usr/bin/busybox": "bb"})
	makeDeb(t, evil, "busybox-static", map[string]string{"usr/bin/busybox": "evil"})
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	other, err := os.ReadFile(evil)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	info := debInfo{Name: name, Size: int64(len(data)), Hash: hex.EncodeToString(sum[:])}
	tests := []struct {
		name       string
		cached     map[string][]byte
		downloaded []byte
		wantErr    string
		wantCalls  int
	}{
		{"the named .deb cached", map[string][]byte{name: data, planted: other}, nil, "", 0},
		{"a higher version planted", map[string][]byte{planted: other}, data, "", 1},
		{"other bytes under the name", map[string][]byte{name: other}, data, "", 1},
		{"a download that does not match", nil, other, "not what apt's index names", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cache, dest := t.TempDir(), filepath.Join(t.TempDir(), "busybox-static")
			for n, b := range tt.cached {
				write(t, filepath.Join(cache, n), string(b), 0o644)
			}
			calls := 0
			d := &debs{
				cache: cache, arch: "amd64", uid: os.Getuid(),
				download: func(ctx context.Context, dir, pkg string) error {
					calls++
					return os.WriteFile(filepath.Join(dir, name), tt.downloaded, 0o644)
				},
				index:    func(ctx context.Context, pkg string) (debInfo, error) { return info, nil },
				progress: func(string, ...any) {},
			}
			err := d.unpack(context.Background(), "busybox-static", dest)
			if calls != tt.wantCalls {
				t.Errorf("downloads = %d, want %d", calls, tt.wantCalls)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("err = %v, want one saying %q", err, tt.wantErr)
				}
				if _, err := os.Stat(filepath.Join(cache, name)); err == nil {
					t.Error("the download that does not match is kept in the cache")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(dest, "usr", "bin", "busybox")); err != nil || string(b) != "bb" {
				t.Errorf("unpacked busybox = %q, %v; want the named .deb's", b, err)
			}
		})
	}
}

func TestParsePrintURIs(t *testing.T) {
	const sum = "3d3fdbe91d4660c873e14b092c213fe81c1da6362daa236eb25d0171eb108744"
	for _, tc := range []struct {
		out  string
		want debInfo
		ok   bool
	}{
		{"'http://deb.debian.org/debian/pool/main/b/busybox/busybox-static_1.35.0-4%2bdeb12u1%2bb1_amd64.deb' busybox-static_1%3a1.35.0-4+deb12u1+b1_amd64.deb 928188 SHA256:" + sum + "\n",
			debInfo{Name: "busybox-static_1%3a1.35.0-4+deb12u1+b1_amd64.deb", Size: 928188, Hash: sum}, true},
		{"'u' x.deb 12 SHA512:" + strings.Repeat("AB", 64), debInfo{Name: "x.deb", Size: 12, Hash: strings.Repeat("ab", 64), SHA512: true}, true},
		{"'u' x.deb 12 SHA512:" + sum, debInfo{}, false},
		{"", debInfo{}, false},
		{"'u' x.deb 12 MD5Sum:0123", debInfo{}, false},
		{"'u' ../x.deb 12 SHA256:" + sum, debInfo{}, false},
		{"'u' x.deb many SHA256:" + sum, debInfo{}, false},
		{"'u' x.deb 1 SHA256:" + sum + "\n'v' y.deb 1 SHA256:" + sum, debInfo{}, false},
	} {
		got, err := parsePrintURIs([]byte(tc.out))
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parsePrintURIs(%q) = %+v, %v; want %+v, ok %v", tc.out, got, err, tc.want, tc.ok)
		}
	}
}

// TestAptIndexIgnoresTheWorkingDirectory: a file with the name and size of
// the .deb apt would download, put where sandboxd happens to run, does not
// make apt say nothing of the package (and the build use its cache
// unchecked).
func TestAptIndexIgnoresTheWorkingDirectory(t *testing.T) {
	if _, err := exec.LookPath("apt-get"); err != nil {
		t.Skip("no apt-get here")
	}
	ctx := context.Background()
	info, err := aptIndex(ctx, "busybox-static")
	if err != nil {
		t.Skipf("apt's lists do not name busybox-static here: %v", err)
	}
	planted := t.TempDir()
	if err := os.WriteFile(filepath.Join(planted, info.Name), make([]byte, info.Size), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(planted)
	got, err := aptIndex(ctx, "busybox-static")
	if err != nil || got != info {
		t.Errorf("aptIndex beside a planted %s = %+v, %v; want %+v", info.Name, got, err, info)
	}
}
