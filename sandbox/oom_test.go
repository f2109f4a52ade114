package sandbox

import (
	"testing"
	"time"
)

func TestParseOOMKills(t *testing.T) {
	tests := []struct {
		text string
		want int64
	}{
		{"oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", 3},
		{"low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\noom_group_kill 0\n", 2},
		{"", 0},
		{"oom_kill x\n", 0},
	}
	for _, tc := range tests {
		if got := parseOOMKills([]byte(tc.text)); got != tc.want {
			t.Errorf("parseOOMKills(%q) = %d, want %d", tc.text, got, tc.want)
		}
	}
}

func TestCountOOMKills(t *testing.T) {
	start := time.Now()
	s := &Session{}
	for _, step := range []struct {
		name  string
		n     int64
		after time.Duration
		want  bool
	}{
		{"no kill", 0, 0, false},
		{"one kill", 1, 0, true},
		{"no new kill", 1, time.Second, false},
		{"three killed together: the first asks", 4, 2 * time.Second, true},
		{"the second", 4, 2*time.Second + 10*time.Millisecond, true},
		{"the third", 4, 2*time.Second + 20*time.Millisecond, true},
		{"a fourth has none left", 4, 2*time.Second + 30*time.Millisecond, false},
		{"two together, one of them in the background", 6, 3 * time.Second, true},
		{"a command that exits 137 much later", 6, time.Minute, false},
	} {
		if got := s.countOOMKillsLocked(step.n, start.Add(step.after)); got != step.want {
			t.Errorf("%s: counter %d: %v, want %v", step.name, step.n, got, step.want)
		}
	}
}
