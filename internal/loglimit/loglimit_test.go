package loglimit

import (
	"testing"
	"time"
)

func TestLogLimit(t *testing.T) {
	var l Limit
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at      time.Duration
		ok      bool
		dropped int
	}{
		{0, true, 0},
		{100 * time.Millisecond, false, 0},
		{900 * time.Millisecond, false, 0},
		{time.Second, true, 2},
		{1500 * time.Millisecond, false, 0},
		{5 * time.Second, true, 1},
	}
	for _, st := range steps {
		dropped, ok := l.Allow(t0.Add(st.at))
		if ok != st.ok || dropped != st.dropped {
			t.Errorf("at %v: Allow = %d, %v; want %d, %v", st.at, dropped, ok, st.dropped, st.ok)
		}
	}
}
