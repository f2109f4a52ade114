// Command testrelay is the floor of any relay process: it starts an agent
// the way `sandboxd wrap` does (blocking pipes, two spare Ps) and copies
// its lines both ways without looking at them. The relay benchmark
// measures wrap against it, to tell wrap's own work from the cost of the
// extra process in the path.
//
//	testrelay AGENT [ARGS...]
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"syscall"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testrelay AGENT [ARGS...]")
		os.Exit(2)
	}
	runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + 2)
	toAgent, agentIn := pipe()
	agentOut, fromAgent := pipe()
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = toAgent, fromAgent, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	toAgent.Close()
	fromAgent.Close()
	go func() {
		copyLines(agentIn, os.Stdin)
		cmd.Process.Kill()
		cmd.Wait()
		os.Exit(0)
	}()
	copyLines(os.Stdout, agentOut)
	cmd.Wait()
}

func pipe() (r, w *os.File) {
	var fds [2]int
	if err := syscall.Pipe2(fds[:], syscall.O_CLOEXEC); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	return os.NewFile(uintptr(fds[0]), "pipe"), os.NewFile(uintptr(fds[1]), "pipe")
}

func copyLines(dst io.Writer, src io.Reader) {
	r := bufio.NewReaderSize(src, 64<<10)
	for {
		line, err := r.ReadSlice('\n')
		if len(line) > 0 {
			if _, werr := dst.Write(line); werr != nil {
				return
			}
		}
		if err != nil && err != bufio.ErrBufferFull {
			return
		}
	}
}
