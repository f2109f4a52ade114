// Command testflood is a hostile command in a sandbox: it waits for a
// process whose command line holds PATTERN (one of sandboxd's own helpers,
// which run as the session's user), stops it and writes into its output
// without end, as any command of the session could. It touches READY once
// it watches.
//
//	testflood PATTERN READY
package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: testflood PATTERN READY")
		os.Exit(2)
	}
	pattern := []byte(os.Args[1])
	caught := map[int]bool{os.Getpid(): true}
	block := bytes.Repeat([]byte("x"), 1<<20)
	for first := true; ; first = false {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || caught[pid] {
				continue
			}
			cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if err != nil || !bytes.Contains(cmdline, pattern) {
				continue
			}
			caught[pid] = true
			syscall.Kill(pid, syscall.SIGSTOP)
			f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/1", pid), os.O_WRONLY, 0)
			if err != nil {
				continue
			}
			go func() {
				for {
					if _, err := f.Write(block); err != nil {
						return
					}
				}
			}()
		}
		if first {
			os.WriteFile(os.Args[2], nil, 0o644)
		}
	}
}
