package mountinfo

import (
	"reflect"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name  string
		table string
		want  []Mount
	}{
		{"plain", "36 35 98:0 / /real/w rw - ext4 /dev/sda1 rw,errors=remount-ro\n",
			[]Mount{{Root: "/", Point: "/real/w", FSType: "ext4", Options: "rw,errors=remount-ro"}}},
		{"optional fields", "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 master:1 - cgroup2 cgroup2 rw,nsdelegate\n",
			[]Mount{{Root: "/", Point: "/sys/fs/cgroup", FSType: "cgroup2", Options: "rw,nsdelegate"}}},
		{"cgroup v1 of a container", "32 31 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct\n",
			[]Mount{{Root: "/docker/abc", Point: "/sys/fs/cgroup/cpu,cpuacct", FSType: "cgroup", Options: "rw,cpu,cpuacct"}}},
		// The kernel escapes space, tab, newline and backslash, but leaves
		// a no-break space and a carriage return as they are.
		{"escapes", "37 36 0:55 /a\\040b /real/w/a\\040b\\134c ro - tmpfs tmpfs ro\n38 36 0:56 / /real/w/c\u00a0d\re ro - tmpfs tmpfs ro\n",
			[]Mount{
				{Root: "/a b", Point: `/real/w/a b\c`, FSType: "tmpfs", Options: "ro"},
				{Root: "/", Point: "/real/w/c\u00a0d\re", FSType: "tmpfs", Options: "ro"},
			}},
		{"escape cut short", "1 2 3:4 / /x\\04 rw - tmpfs t ro\n",
			[]Mount{{Root: "/", Point: `/x\04`, FSType: "tmpfs", Options: "ro"}}},
		{"no separator", "36 35 98:0 / /real/w rw\n", []Mount{{Root: "/", Point: "/real/w"}}},
		{"separator without its fields", "36 35 98:0 / /real/w rw - ext4\n", []Mount{{Root: "/", Point: "/real/w"}}},
		{"junk", "junk\n\n - \n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Parse([]byte(tt.table)); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Parse = %+v, want %+v", got, tt.want)
			}
		})
	}
}
