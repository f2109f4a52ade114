package sandbox

import (
	"errors"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/moby/moby/api/types/mount"
)

func TestPlanBinds(t *testing.T) {
	for _, tc := range []struct {
		name             string
		targets, sources []string
		devs             []uint64
		want             []bind
		err              string
	}{
		{name: "apart", targets: []string{"/w", "/x"}, sources: []string{"/w", "/real/x"},
			want: []bind{{"/w", "/w"}, {"/real/x", "/x"}}},
		{name: "siblings with a shared prefix", targets: []string{"/w", "/wx"}, sources: []string{"/w", "/wx"},
			want: []bind{{"/w", "/w"}, {"/wx", "/wx"}}},
		{name: "extra inside the workspace", targets: []string{"/w", "/w/sub"}, sources: []string{"/real/w", "/real/w/sub"},
			want: []bind{{"/real/w", "/w"}}},
		{name: "workspace inside an extra", targets: []string{"/a/b", "/a"}, sources: []string{"/a/b", "/a"},
			want: []bind{{"/a", "/a"}}},
		{name: "three deep", targets: []string{"/a/b/c", "/a/b", "/a"}, sources: []string{"/a/b/c", "/a/b", "/a"},
			want: []bind{{"/a", "/a"}}},
		{name: "the same twice", targets: []string{"/w", "/w"}, sources: []string{"/w", "/w"},
			want: []bind{{"/w", "/w"}}},
		// A nested directory on a filesystem of its own is not shown by
		// the outer mount, which is not recursive.
		{name: "nested on another filesystem", targets: []string{"/w", "/w/data"}, sources: []string{"/w", "/w/data"}, devs: []uint64{1, 2},
			want: []bind{{"/w", "/w"}, {"/w/data", "/w/data"}}},
		{name: "nested on the same filesystem", targets: []string{"/w", "/w/sub"}, sources: []string{"/w", "/w/sub"}, devs: []uint64{1, 1},
			want: []bind{{"/w", "/w"}}},
		{name: "three deep, the middle its own", targets: []string{"/a/b/c", "/a/b", "/a"}, sources: []string{"/a/b/c", "/a/b", "/a"}, devs: []uint64{2, 2, 1},
			want: []bind{{"/a/b", "/a/b"}, {"/a", "/a"}}},
		{name: "nested through a link", targets: []string{"/w", "/w/link"}, sources: []string{"/w", "/elsewhere"},
			err: `"/w/link" lies inside "/w", which is mounted too, but resolves to /elsewhere`},
		{name: "workspace through a link in an extra", targets: []string{"/a/proj", "/a"}, sources: []string{"/a/real/proj", "/a"},
			err: `"/a/proj" lies inside "/a"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := planBinds(tc.targets, tc.sources, tc.devs)
			if tc.err != "" {
				if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("planBinds = %v, %v; want an ErrInvalid containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("planBinds = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// allDirs has every mount point a directory.
func allDirs(string) bool { return true }

// TestCoverFileMountPoints: a file the host mounts below a session
// directory or a grant (a container's own /etc/hosts) is covered by
// /dev/null, read-only, where a tmpfs cannot go; a directory by a tmpfs.
func TestCoverFileMountPoints(t *testing.T) {
	files := map[string]bool{"/etc/hosts": true, "/w/secret.txt": true}
	_, covers := coverHostMounts([]bind{{"/w", "/w"}}, []Mount{{Source: "/etc", Target: "/host-etc", Mode: "ro"}},
		[]string{"/etc/hosts", "/etc/ssl", "/w/secret.txt"}, func(p string) bool { return !files[p] })
	want := []mount.Mount{
		{Type: mount.TypeBind, Source: os.DevNull, Target: "/w/secret.txt", ReadOnly: true},
		{Type: mount.TypeBind, Source: os.DevNull, Target: "/host-etc/hosts", ReadOnly: true},
		{Type: mount.TypeTmpfs, Target: "/host-etc/ssl", ReadOnly: true, TmpfsOptions: &mount.TmpfsOptions{SizeBytes: 4096, Mode: 0o555}},
	}
	if !reflect.DeepEqual(covers, want) {
		t.Errorf("covers %+v, want %+v", covers, want)
	}
	// The real check, on what the kernel has cached.
	if !mountPointIsDir("/") || mountPointIsDir(os.DevNull) {
		t.Errorf("mountPointIsDir: / %v, %s %v", mountPointIsDir("/"), os.DevNull, mountPointIsDir(os.DevNull))
	}
}

func TestCoverHostMounts(t *testing.T) {
	binds := []bind{{"/real/w", "/w"}, {"/real/w/data", "/w/data"}, {"/x", "/x"}}
	points := []string{"/", "/real", "/real/w", "/real/w/proc", "/real/w/proc/sys", "/real/w/data", "/real/w/data/usb", "/real/w/a b", "/elsewhere", "/x", "/real/w/proc"}
	hosts, covers := coverHostMounts(binds, nil, points, allDirs)
	// Each once, also when listed twice (stacked mounts).
	if want := []string{"/real/w/a b", "/real/w/proc", "/real/w/data/usb"}; !slices.Equal(hosts, want) {
		t.Errorf("covered %q, want %q", hosts, want)
	}
	var targets []string
	for _, c := range covers {
		if !c.ReadOnly || c.Type != "tmpfs" {
			t.Errorf("cover %+v is not a read-only tmpfs", c)
		}
		targets = append(targets, c.Target)
	}
	if want := []string{"/w/a b", "/w/proc", "/w/data/usb"}; !slices.Equal(targets, want) {
		t.Errorf("cover targets %q, want %q", targets, want)
	}
	// A workspace named through a link: what lies below its source is
	// covered at the name the container knows, even where another bind
	// mounts the same source under its real name.
	_, covers = coverHostMounts([]bind{{"/real/w", "/alias"}, {"/real/w/m", "/real/w/m"}}, nil, []string{"/real/w", "/real/w/m"}, allDirs)
	if len(covers) != 1 || covers[0].Target != "/alias/m" {
		t.Errorf("covers of a workspace through a link: %+v, want one at /alias/m", covers)
	}
	// The kernel leaves a no-break space and a carriage return as they
	// are: they are part of the name.
	info := "36 35 98:0 / /real/w rw - ext4 /dev/sda1 rw\n37 36 0:55 / /real/w/a\\040b ro - tmpfs tmpfs ro\n38 36 0:56 / /real/w/c\u00a0d\re ro - tmpfs tmpfs ro\n"
	if got := mountPointsOf([]byte(info)); !slices.Equal(got, []string{"/real/w", "/real/w/a b", "/real/w/c\u00a0d\re"}) {
		t.Errorf("mountPointsOf = %q", got)
	}
}

// TestCoverHostMountsOfGrants: a host filesystem below a granted source
// is covered like one below the workspace, whatever the grant's mode; a
// place where another mount shows its own is not.
func TestCoverHostMountsOfGrants(t *testing.T) {
	for _, tc := range []struct {
		name    string
		binds   []bind
		granted []Mount
		points  []string
		want    []string // cover targets
	}{
		{name: "below a writable grant", binds: []bind{{"/real/w", "/w"}},
			granted: []Mount{{Source: "/srv/data", Target: "/data", Mode: "rw"}},
			points:  []string{"/", "/srv/data/nfs"}, want: []string{"/data/nfs"}},
		{name: "below a read-only grant", binds: []bind{{"/real/w", "/w"}},
			granted: []Mount{{Source: "/srv/data", Target: "/data", Mode: "ro"}},
			points:  []string{"/srv/data/nfs", "/srv/data/nfs/deeper"}, want: []string{"/data/nfs"}},
		{name: "a grant that is a host mount itself", binds: []bind{{"/real/w", "/w"}},
			granted: []Mount{{Source: "/srv/data", Target: "/data"}},
			points:  []string{"/srv/data"}, want: nil},
		{name: "a grant over a host mount in the workspace", binds: []bind{{"/real/w", "/w"}},
			granted: []Mount{{Source: "/opt/tools", Target: "/w/tools", Mode: "ro"}},
			points:  []string{"/real/w/tools", "/real/w/other"}, want: []string{"/w/other"}},
		{name: "a grant above a host mount in the workspace", binds: []bind{{"/real/w", "/w"}},
			granted: []Mount{{Source: "/opt/tools", Target: "/w/tools"}},
			points:  []string{"/real/w/tools/nfs", "/opt/tools/usb"}, want: []string{"/w/tools/usb"}},
		{name: "the workspace on a grant's host mount", binds: []bind{{"/mnt/usb", "/mnt/usb"}},
			granted: []Mount{{Source: "/mnt", Target: "/mnt", Mode: "ro"}},
			points:  []string{"/mnt/usb"}, want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			binds := slices.Clone(tc.binds)
			_, covers := coverHostMounts(binds, tc.granted, tc.points, allDirs)
			var targets []string
			for _, c := range covers {
				if !c.ReadOnly || c.Type != "tmpfs" {
					t.Errorf("cover %+v is not a read-only tmpfs", c)
				}
				targets = append(targets, c.Target)
			}
			if !slices.Equal(targets, tc.want) {
				t.Errorf("cover targets %q, want %q", targets, tc.want)
			}
			if !slices.Equal(binds, tc.binds) {
				t.Errorf("binds changed to %v", binds)
			}
		})
	}
}

func TestDistinctTargets(t *testing.T) {
	cover := func(target string) mount.Mount {
		return mount.Mount{Type: mount.TypeTmpfs, Target: target, ReadOnly: true}
	}
	for _, tc := range []struct {
		name   string
		mounts []mount.Mount
		err    string // "" passes
	}{
		{name: "apart", mounts: []mount.Mount{bindMount("/w", "/w", "rw"), cover("/w/nfs"), bindMount("/srv", "/data", "ro"), cover("/data/nfs")}},
		{name: "next to a cover", mounts: []mount.Mount{cover("/mnt/usb"), bindMount("/mnt/usbx", "/mnt/usbx", "rw")}},
		{name: "two at one place", mounts: []mount.Mount{bindMount("/w", "/w", "rw"), bindMount("/srv", "/w", "ro")}, err: `two mounts at "/w"`},
		// The engine makes their places in the cover before it is made
		// read-only.
		{name: "a workspace below a cover", mounts: []mount.Mount{bindMount("/mnt", "/mnt", "ro"), cover("/mnt/usb"), bindMount("/mnt/usb/p", "/mnt/usb/p", "rw")}},
		{name: "a grant below a cover", mounts: []mount.Mount{bindMount("/w", "/w", "rw"), cover("/w/nfs"), bindMount("/opt", "/w/nfs/opt", "ro")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := distinctTargets(tc.mounts)
			if tc.err == "" && err != nil || tc.err != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("distinctTargets = %v, want %q", err, tc.err)
			}
		})
	}
}
