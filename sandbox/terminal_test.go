package sandbox

import (
	"testing"
)

func TestShellCode(t *testing.T) {
	const notFound = `OCI runtime exec failed: exec failed: unable to start container process: exec: "nope": executable file not found in $PATH: unknown`
	for _, tc := range []struct {
		code int
		head string
		want int
	}{
		{126, notFound, 127},
		{126, `OCI runtime exec failed: exec failed: unable to start container process: exec: "/x/y": stat /x/y: no such file or directory: unknown`, 127},
		{126, `OCI runtime exec failed: exec failed: unable to start container process: exec: "/etc/passwd": permission denied: unknown`, 126},
		// A cwd that is not there: 126, with the engine's reason, not
		// "command not found".
		{126, `OCI runtime exec failed: exec failed: unable to start container process: chdir to cwd ("/w/gone") set in config.json failed: no such file or directory: unknown`, 126},
		{126, "sh: ./script: Permission denied\n", 126},
		{126, "executable file not found, said the command itself\n", 126},
		{0, notFound, 0},
		{1, notFound, 1},
	} {
		if got := shellCode(tc.code, []byte(tc.head)); got != tc.want {
			t.Errorf("shellCode(%d, %.40q) = %d, want %d", tc.code, tc.head, got, tc.want)
		}
	}
	b := NewOutputBuffer(0)
	b.Write([]byte("OCI runtime"))
	b.Write([]byte(" exec failed"))
	if got := string(b.Head()); got != "OCI runtime exec failed" {
		t.Errorf("Head of a buffer with limit 0 = %q", got)
	}
}
