package sandbox

import (
	"testing"
)

func TestExecErrorMissing(t *testing.T) {
	for _, tc := range []struct {
		code   int
		output string
		want   bool
	}{
		{126, `OCI runtime exec failed: exec failed: unable to start container process: exec: "stat": executable file not found in $PATH: unknown`, true},
		{127, "sh: stat: not found\n", false},
		{126, `OCI runtime exec failed: exec failed: unable to start container process: chdir to cwd ("/w") set in config.json failed: permission denied: unknown`, false},
		{1, "stat: can't stat '/x': Permission denied\n", false},
		{127, `OCI runtime exec failed: exec failed: unable to start container process: exec: "stat": stat stat: no such file or directory: unknown`, true},
	} {
		if got := (&execError{code: tc.code, output: tc.output}).missing(); got != tc.want {
			t.Errorf("missing(%d, %.60q) = %v, want %v", tc.code, tc.output, got, tc.want)
		}
	}
}
