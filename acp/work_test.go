package acp

import (
	"testing"
	"time"
)

func TestWorkGroupStartsNothingOnceStopping(t *testing.T) {
	var g workGroup
	release := make(chan struct{})
	if !g.Go(func() { <-release }) {
		t.Fatal("Go before Stop refused")
	}
	if g.Stop(10 * time.Millisecond) {
		t.Error("Stop reported all work ended while one still blocks")
	}
	ran := false
	if g.Go(func() { ran = true }) {
		t.Error("Go after Stop started work")
	}
	close(release)
	if !g.Stop(time.Minute) {
		t.Error("Stop did not see the work end")
	}
	if ran {
		t.Error("work refused by Go ran")
	}
}
